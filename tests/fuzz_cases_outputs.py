"""Issue 26's bad-input cases for one area (outputs); see tests/fuzz_cases.py for `Case`.

Every writer (each `-o`, `--html`, `--csv`, `--plot` of every command that takes a path) onto
each kind of path it must refuse: a named pipe with no reader, a socket, symbolic links (to a
file inside or outside the folder, to a folder, to nothing, to stdout), a device other than
/dev/null and the terminals (as root: twins made with mknod, never /dev itself), a missing
folder; a --json command whose other output would go to stdout; and an existing output that a
failing command must leave as it was. Success cases (a /dev/null twin, a pipe with a reader, a
link to stdout without --json) are in tests/test_outputs_safe.py.

A `files` value may be a callable: it makes the entry itself (a link, a socket, a device).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.fuzz_cases import FIFO, PLAN_FLAGS, Case

CPU = ("-w", "adam-mnist", "-c", "adam-2014")
GPU_SEARCH = ("-w", "gpt3-125m", "-c", "dgx-a100-80g:1", "--global-batch", "8")
EXPORT_PLAN = "workload: gpt3-125m\ntp: 2\ndp: 2\n"
GRID = "workload: adam-mnist\nconfigs: []\n"

WRITERS: dict[str, tuple[tuple[str, ...], str, dict[str, "str | None"]]] = {
    # name: (argv with {o} for the output, the field its errors name, files it needs)
    "describe": (("describe", "adam-mnist", "-o", "{o}", "--json"), "--output", {}),
    "predict-html": (("predict", *CPU, *PLAN_FLAGS, "--html", "{o}", "--json"), "--html", {}),
    "predict-gpu-html": (("predict", "-w", "gpt3-125m", "-c", "dgx-a100-80g:1", "--dp", "8",
                          "--global-batch", "8", "--html", "{o}", "--json"), "--html", {}),
    "optimize-csv": (("optimize", *CPU, "-M", "8", "--csv", "{o}", "--json"), "--csv", {}),
    "optimize-html": (("optimize", *CPU, "-M", "8", "--html", "{o}", "--json"), "--html", {}),
    "optimize-plot": (("optimize", *CPU, "-M", "8", "--plot", "{o}", "--json"), "--plot", {}),
    "optimize-gpu-csv": (("optimize", *GPU_SEARCH, "--csv", "{o}", "--json"), "--csv", {}),
    "report": (("report", "-o", "{o}", *CPU, "-M", "8"), "--output", {}),
    "report-predict": (("report", "-o", "{o}", *CPU, *PLAN_FLAGS), "--output", {}),
    "export": (("export", "{d}/plan.yaml", "--to", "megatron", "-o", "{o}", "--json"),
               "--output", {"plan.yaml": EXPORT_PLAN}),
    "run": (("run", "-w", "mlp:32-16-4", *PLAN_FLAGS, "--local", "-o", "{o}", "--json"),
            "--output", {}),
    "calibrate": (("calibrate", "--local", "--quick", "-o", "{o}"), "--output", {}),
    "testbed-check": (("testbed", "check", "--description", "{d}/none.yaml", "-o", "{o}",
                       "--json"), "--output", {}),
    "validate-html": (("validate", "--testbed", "tb", "--configs", "{d}/g.yaml", "-o",
                       "{d}/results", "--html", "{o}", "--json"), "--html", {"g.yaml": GRID}),
}
CHEAP = ("describe", "predict-html", "optimize-csv", "optimize-html", "optimize-plot",
         "report", "export")
"""Writers whose work takes about a second: a late failure (a full device) is tried on them."""


def _socket(path: Path) -> None:
    here = os.getcwd()
    os.chdir(path.parent)  # a socket's address is at most 108 bytes: bind the short name
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(path.name)
    finally:
        os.chdir(here)


def _link(target: str) -> Callable[[Path], None]:
    return lambda path: os.symlink(target, path)


def _link_outside(path: Path) -> None:
    """A link to a file beside the case's folder (what must never be written through)."""
    outside = path.parent.parent / f"outside-{path.name}"
    outside.write_text("not yours\n")
    os.symlink(outside, path)


def _link_to_outside_folder(path: Path) -> None:
    outside = path.parent.parent / f"outside-{path.name}.d"
    outside.mkdir()
    os.symlink(outside, path)


def _device(kind: int, major: int, minor: int) -> Callable[[Path], None]:
    return lambda path: os.mknod(path, kind | 0o666, os.makedev(major, minor))


SPECIAL: dict[str, tuple[str, dict[str, object]]] = {
    # name: (the output path, what the case's folder holds)
    "fifo-no-reader": ("{d}/out", {"out": FIFO}),
    "socket": ("{d}/out", {"out": _socket}),
    "symlink-out-of-folder": ("{d}/out", {"out": _link_outside}),
    "symlink-to-file-in-folder": ("{d}/out", {"real": "keep me\n", "out": _link("real")}),
    "symlink-dangling": ("{d}/out", {"out": _link("no-such-file")}),
    "symlink-to-folder": ("{d}/out", {"out": _link_to_outside_folder}),
    "missing-folder": ("{d}/no/such/folder/out", {}),
}
STDOUT: dict[str, tuple[str, dict[str, object]]] = {
    # only with --json: stdout holds the JSON document (or, in-process, is not a stream)
    "symlink-to-proc-self-fd-1": ("{d}/out", {"out": _link("/proc/self/fd/1")}),
    "dev-stdout": ("/dev/stdout", {}),
}
ROOT_ONLY: dict[str, tuple[str, dict[str, object]]] = {
    "device-mem-twin": ("{d}/mem", {"mem": _device(0o020000, 1, 1)}),
    "device-kmsg-twin": ("{d}/kmsg", {"kmsg": _device(0o020000, 1, 11)}),
    "device-random-twin": ("{d}/random", {"random": _device(0o020000, 1, 8)}),
    "block-device-twin": ("{d}/loop", {"loop": _device(0o060000, 7, 0)}),
    "symlink-to-mem-twin": ("{d}/out", {"mem": _device(0o020000, 1, 1), "out": _link("mem")}),
}
FULL = {"full": _device(0o020000, 1, 7)}


def _case(writer: str, kind: str, path: str, files: dict[str, object],
          group: str = "output-special-files") -> Case:
    argv, field, needed = WRITERS[writer]
    return Case(f"{writer}-{kind}", group, tuple(a.replace("{o}", path) for a in argv), field,
                {**needed, **files})  # type: ignore[arg-type]


def special_file_cases() -> Iterator[Case]:
    root = os.geteuid() == 0
    for writer, (argv, _, _) in WRITERS.items():
        kinds = dict(SPECIAL)
        if "--json" in argv:
            kinds.update(STDOUT)
        if root:
            kinds.update(ROOT_ONLY)
            if writer in CHEAP:  # the work is done, then the device refuses the bytes
                kinds["device-full-twin"] = ("{d}/full", dict(FULL))
        for kind, (path, files) in kinds.items():
            yield _case(writer, kind, path, files)


def json_purity_cases() -> Iterator[Case]:
    """stdout under --json holds one JSON document: nothing else may be sent there."""
    yield Case("optimize-csv-stdout", "json-purity",
               ("optimize", *CPU, "-M", "8", "--csv", "-", "--json"), "--csv")
    yield Case("optimize-gpu-csv-stdout", "json-purity",
               ("optimize", *GPU_SEARCH, "--csv", "-", "--json"), "--csv")
    yield Case("optimize-quiet-csv-stdout", "json-purity",
               ("optimize", *CPU, "-M", "8", "--csv", "-", "--json", "--quiet"), "--csv")
    for name, args in (("optimize-form", (*CPU, "-M", "8")), ("predict-form", (*CPU, *PLAN_FLAGS)),
                       ("gpu-form", GPU_SEARCH)):
        yield Case(f"report-{name}-json", "json-purity", ("report", "-o", "{d}/r.html", *args,
                                                          "--json"), "--json")
    yield Case("report-validation-json", "json-purity",
               ("report", "-o", "{d}/r.html", "--validation", "{d}", "--json"), "--json")


def keeps_existing_cases() -> Iterator[Case]:
    """A command that fails leaves the output that was there byte for byte as it was."""
    bad = {"bad.yaml": "input_shape: [3]\nlayers: [\n", "keep.out": "previous contents\n"}
    for writer, argv in (
            ("predict-html", ("predict", "-w", "{d}/bad.yaml", "-c", "adam-2014", *PLAN_FLAGS,
                              "--html", "{d}/keep.out", "--json")),
            ("optimize-csv", ("optimize", "-w", "{d}/bad.yaml", "-c", "adam-2014", "--csv",
                              "{d}/keep.out", "--json")),
            ("optimize-html", ("optimize", "-w", "{d}/bad.yaml", "-c", "adam-2014", "--html",
                               "{d}/keep.out", "--json")),
            ("report", ("report", "-o", "{d}/keep.out", "-w", "{d}/bad.yaml", "-c",
                        "adam-2014"))):
        yield Case(f"{writer}-bad-workload", "output-keeps-existing", argv, "workload",
                   dict(bad), keep=("keep.out",))
    yield Case("export-bad-plan", "output-keeps-existing",
               ("export", "{d}/bad.yaml", "--to", "megatron", "-o", "{d}/keep.out", "--json"),
               "plan", dict(bad), keep=("keep.out",))
    # the work succeeds, a later flag fails: nothing was written before the error
    yield Case("optimize-gpu-bad-tokens", "output-keeps-existing",
               ("optimize", *GPU_SEARCH, "--tokens", "-1", "--csv", "{d}/keep.out",
                "--plot", "{d}/keep.png", "--json"), "--tokens",
               {"keep.out": "previous contents\n", "keep.png": "previous plot\n"},
               keep=("keep.out", "keep.png"))
    yield Case("report-refused-json", "output-keeps-existing",
               ("report", "-o", "{d}/keep.out", *CPU, "-M", "8", "--json"), "--json",
               {"keep.out": "previous contents\n"}, keep=("keep.out",))
    if os.geteuid() == 0:  # one output onto a full device: the other is not replaced either
        for writer, argv, field in (
                ("optimize-csv-and-full-html", ("optimize", *CPU, "-M", "8", "--csv",
                                                "{d}/keep.out", "--html", "{d}/full",
                                                "--json"), "--html"),
                ("optimize-html-and-full-csv", ("optimize", *CPU, "-M", "8", "--html",
                                                "{d}/keep.out", "--csv", "{d}/full",
                                                "--json"), "--csv"),
                ("optimize-plot-and-full-html", ("optimize", *CPU, "-M", "8", "--plot",
                                                 "{d}/keep.out", "--html", "{d}/full",
                                                 "--json"), "--html"),
                ("optimize-gpu-csv-and-full-plot", ("optimize", *GPU_SEARCH, "--csv",
                                                    "{d}/keep.out", "--plot", "{d}/full",
                                                    "--json"), "--plot")):
            yield Case(writer, "output-keeps-existing", argv, field,
                       {"keep.out": "previous contents\n", **FULL}, keep=("keep.out",))


PLAN_YAML = "tp: 1\nglobal_batch: 8\n"
ONTO_INPUTS: list[tuple[str, tuple[str, ...], str, dict[str, str]]] = [
    # name, argv, the flag named, files kept unchanged
    ("predict-html-onto-config", ("predict", "-w", "gpt3-125m", "-c", "dgx-a100-80g:1",
                                  "--config", "{d}/p.yaml", "--html", "{d}/p.yaml", "-q"),
     "--html", {"p.yaml": PLAN_YAML}),
    ("describe-output-onto-workload", ("describe", "{d}/w.yaml", "-o", "{d}/w.yaml"),
     "--output", {"w.yaml": "name: t\ninput_shape: [8]\nsamples_per_epoch: 100\nlayers:\n"
                            "  - {kind: linear, out_features: 4}\n"}),
    ("export-output-onto-plan", ("export", "{d}/p.yaml", "--to", "megatron", "-w", "gpt3-125m",
                                 "-o", "{d}/p.yaml"), "--output", {"p.yaml": PLAN_YAML}),
    ("optimize-csv-onto-html", ("optimize", "-w", "gpt3-125m", "-c", "dgx-a100-80g:1",
                                "--global-batch", "8", "--html", "{d}/o.html", "--csv",
                                "{d}/o.html", "-q"), "--csv", {"o.html": "the old page\n"}),
    ("optimize-plot-onto-cluster", ("optimize", "-w", "adam-mnist", "-c", "{d}/c.yaml",
                                    "--plot", "{d}/c.yaml", "-q"), "--plot",
     {"c.yaml": "name: c\nmachines: 4\n"}),
    ("optimize-new-csv-twice", ("optimize", "-w", "gpt3-125m", "-c", "dgx-a100-80g:1",
                                "--global-batch", "8", "--html", "{d}/n.out", "--csv",
                                "{d}/n.out", "-q"), "--csv", {}),
]


def onto_input_cases() -> Iterator[Case]:
    for name, argv, field, files in ONTO_INPUTS:
        yield Case(name, "output-onto-input", argv, field, dict(files), keep=tuple(files))


def cases() -> Iterator[Case]:
    yield from special_file_cases()
    yield from json_purity_cases()
    yield from keeps_existing_cases()
    yield from onto_input_cases()
