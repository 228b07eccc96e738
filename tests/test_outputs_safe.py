"""Outputs, stdout and signals at the boundary (issue 26): what must succeed without harm.

The refusals (exit 2, one line) are fuzz cases in tests/fuzz_cases_outputs.py. Here: writing
into a /dev/null twin or a named pipe with a reader leaves the device a device and the pipe a
pipe; a link to stdout without --json writes into stdout; a refused link leaves its target as
it was; a full or closed stdout ends in one line (or quietly) without a traceback; Ctrl-C at
any time from the entry module on exits 130; --json on stdout is one whole document or none.
Device twins are made with mknod (root only), never /dev itself.
"""

from __future__ import annotations

import json
import os
import select
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dnnscale.cli import app
from tests.fuzz_cases_outputs import CPU, EXPORT_PLAN, GPU_SEARCH, PLAN_FLAGS
from tests.signals import sigint_default, sigint_raises

runner = CliRunner()
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="mknod needs root")
PROGRAM = [sys.executable, "-m", "dnnscale"]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    [str(Path(__file__).resolve().parent.parent / "src"), os.environ.get("PYTHONPATH", "")])}

WRITERS = {
    # name: (argv with {o}, files it needs, what the output holds)
    "describe": (("describe", "adam-mnist", "-o", "{o}"), {}, b"name: adam-mnist"),
    "predict-html": (("predict", *CPU, *PLAN_FLAGS, "--html", "{o}", "-q"), {}, b"<html"),
    "predict-gpu-html": (("predict", "-w", "gpt3-125m", "-c", "dgx-a100-80g:1", "--dp", "8",
                          "--global-batch", "8", "--html", "{o}", "-q"), {}, b"<html"),
    "optimize-csv": (("optimize", *CPU, "-M", "8", "--csv", "{o}", "-q"), {}, b"rank"),
    "optimize-html": (("optimize", *CPU, "-M", "8", "--html", "{o}", "-q"), {}, b"<html"),
    "optimize-plot": (("optimize", *CPU, "-M", "8", "--plot", "{o}", "-q"), {}, b"PNG"),
    "optimize-gpu-csv": (("optimize", *GPU_SEARCH, "--csv", "{o}", "-q"), {}, b"rank"),
    "report": (("report", "-o", "{o}", *CPU, "-M", "8"), {}, b"<html"),
    "export": (("export", "{d}/plan.yaml", "--to", "megatron", "-o", "{o}"),
               {"plan.yaml": EXPORT_PLAN}, b"--tensor-model-parallel-size"),
}


def _argv(writer: str, folder: Path, out: str) -> list[str]:
    argv, files, _ = WRITERS[writer]
    for name, text in files.items():
        (folder / name).write_text(text)
    return [a.replace("{o}", out).replace("{d}", str(folder)) for a in argv]


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


class _Reader:
    """A reader on a named pipe (opened first, so the writer finds it), draining in a thread."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.data = bytearray()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while True:
            ready, _, _ = select.select([self.fd], [], [], 0.05)
            chunk = b""
            if ready:
                try:
                    chunk = os.read(self.fd, 65536)
                except BlockingIOError:
                    continue
                self.data += chunk
            if self.done.is_set() and not chunk:
                return

    def close(self) -> bytes:
        self.done.set()
        self.thread.join(10)
        os.close(self.fd)
        return bytes(self.data)


# -- output-special-files: writes that must succeed without harm ----------------------------

@needs_root
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_output_into_a_dev_null_twin_keeps_the_device(writer: str, tmp_path: Path) -> None:
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    result = runner.invoke(app, _argv(writer, tmp_path, str(null)))
    assert result.exit_code == 0, result.output
    info = os.lstat(null)
    assert stat.S_ISCHR(info.st_mode) and info.st_rdev == os.makedev(1, 3)
    assert not [n for n in _names(tmp_path) if n.startswith(".") or n.endswith(".partial")]


@needs_root
@pytest.mark.parametrize("writer", ["describe", "optimize-csv", "report"])
def test_output_through_a_link_to_a_dev_null_twin(writer: str, tmp_path: Path) -> None:
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    (tmp_path / "out").symlink_to(null)
    result = runner.invoke(app, _argv(writer, tmp_path, str(tmp_path / "out")))
    assert result.exit_code == 0, result.output
    assert os.readlink(tmp_path / "out") == str(null)
    assert stat.S_ISCHR(os.lstat(null).st_mode)


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_output_into_a_named_pipe_with_a_reader(writer: str, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = _Reader(fifo)
    try:
        result = runner.invoke(app, _argv(writer, tmp_path, str(fifo)))
    finally:
        data = reader.close()
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert WRITERS[writer][2] in data[:4096] or WRITERS[writer][2] in data
    assert _names(tmp_path) == sorted(["pipe", *WRITERS[writer][1]])


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_refused_link_leaves_its_target_and_itself(writer: str, tmp_path: Path) -> None:
    folder = tmp_path / "case"
    folder.mkdir()
    outside = tmp_path / "precious.txt"
    outside.write_text("not yours\n")
    (folder / "out").symlink_to(outside)
    result = runner.invoke(app, _argv(writer, folder, str(folder / "out")))
    assert result.exit_code == 2, result.output
    assert "symbolic link" in result.stderr
    assert outside.read_text() == "not yours\n"
    assert os.readlink(folder / "out") == str(outside)


@pytest.mark.parametrize("form", ["link-to-proc-self-fd-1", "dev-stdout"])
@pytest.mark.parametrize("writer", ["describe", "optimize-csv", "export"])
def test_a_link_to_stdout_without_json_writes_into_stdout(writer: str, form: str,
                                                          tmp_path: Path) -> None:
    out = "/dev/stdout"
    if form == "link-to-proc-self-fd-1":
        (tmp_path / "so").symlink_to("/proc/self/fd/1")
        out = str(tmp_path / "so")
    done = subprocess.run([*PROGRAM, *_argv(writer, tmp_path, out)], capture_output=True,
                          env=ENV, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert WRITERS[writer][2] in done.stdout
    if form == "link-to-proc-self-fd-1":
        assert os.readlink(tmp_path / "so") == "/proc/self/fd/1"


def test_a_regular_output_is_still_replaced_whole(tmp_path: Path) -> None:
    out = tmp_path / "w.yaml"
    out.write_text("old\n")
    result = runner.invoke(app, ["describe", "adam-mnist", "-o", str(out)])
    assert result.exit_code == 0
    assert out.read_text().startswith("name: adam-mnist")
    assert _names(tmp_path) == ["w.yaml"]


def test_outputs_together_replace_none_when_one_fails(tmp_path: Path) -> None:
    from dnnscale.atomic import atomic_write_text, outputs_together

    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("old a\n")
    with pytest.raises(RuntimeError):
        with outputs_together():
            atomic_write_text(first, "new a\n")
            atomic_write_text(second, "new b\n")
            raise RuntimeError("the third output failed")
    assert first.read_text() == "old a\n" and not second.exists()
    assert _names(tmp_path) == ["a.txt"]


@needs_root
def test_a_run_into_a_dev_null_twin(tmp_path: Path) -> None:
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    done = subprocess.run([*PROGRAM, "run", "-w", "mlp:32-16-4", *PLAN_FLAGS, "--steps", "3",
                           "--warmup", "1", "--local", "-o", str(null), "--json"],
                          capture_output=True, text=True, env=ENV, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    json.loads(done.stdout)
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    assert _names(tmp_path) == ["null"]


def test_the_partial_of_a_stream_is_never_beside_it(tmp_path: Path) -> None:
    from dnnscale.atomic import partial_path

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert partial_path(fifo).parent != tmp_path
    assert partial_path(tmp_path / "run.jsonl") == tmp_path / "run.jsonl.partial"


# -- stdout-errors: a full or closed stdout, for every kind of command ------------------------

STDOUT_COMMANDS = {
    "describe": ["describe", "adam-mnist"],
    "describe-json": ["describe", "adam-mnist", "--json"],
    "predict": ["predict", *CPU, *PLAN_FLAGS],
    "predict-json": ["predict", *CPU, *PLAN_FLAGS, "--json"],
    "optimize": ["optimize", *CPU, "-M", "8"],
    "optimize-json": ["optimize", *CPU, "-M", "8", "--json"],
    "optimize-csv-stdout": ["optimize", *CPU, "-M", "8", "--csv", "-"],
    "optimize-gpu-json": ["optimize", *GPU_SEARCH, "--json"],
    "bands": ["bands", "--all"],
    "bands-json": ["bands", "--all", "--json"],
    "help": ["--help"],
    "version": ["--version"],
}


@needs_root
@pytest.mark.parametrize("name", sorted(STDOUT_COMMANDS))
def test_a_full_stdout_ends_in_one_line(name: str, tmp_path: Path) -> None:
    full = tmp_path / "full"
    os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    with open(full, "w") as stdout:
        done = subprocess.run([*PROGRAM, *STDOUT_COMMANDS[name]], stdout=stdout,
                              stderr=subprocess.PIPE, text=True, env=ENV, timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr == "error: stdout: No space left on device\n"


@pytest.mark.parametrize("name", sorted(STDOUT_COMMANDS))
def test_a_closed_stdout_ends_quietly(name: str) -> None:
    read, write = os.pipe()
    os.close(read)  # nobody will read: the first write is EPIPE
    try:
        done = subprocess.run([*PROGRAM, *STDOUT_COMMANDS[name]], stdout=write,
                              stderr=subprocess.PIPE, text=True, env=ENV, timeout=120)
    finally:
        os.close(write)
    assert done.returncode == 141, done.stderr[-2000:]
    assert done.stderr == ""


# -- json-purity: one whole document or nothing -------------------------------------------

def test_print_json_holds_ctrl_c_until_the_document_is_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dnnscale.jsonout import print_json

    written: list[str] = []
    flushes = []

    class Interrupting:
        def write(self, text: str) -> int:
            if not written:
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of the writes
                time.sleep(0.05)
            written.append(text)
            return len(text)

        def flush(self) -> None:
            flushes.append(len(written))

    monkeypatch.setattr(sys, "stdout", Interrupting())
    with sigint_raises(), pytest.raises(KeyboardInterrupt):
        print_json({"rows": list(range(5000))})
    assert len(written) > 1 and flushes[-1] == len(written)
    assert json.loads("".join(written))["rows"][-1] == 4999
    assert max(len(piece) for piece in written) <= 4096  # a pipe takes each whole


@pytest.mark.parametrize("delay_s", [0.5, 1.0, 1.5, 2.0, 3.0])
def test_interrupted_optimize_json_is_whole_or_empty(delay_s: float) -> None:
    child = subprocess.Popen([*PROGRAM, "optimize", *CPU, "-M", "64", "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
                             preexec_fn=sigint_default)
    time.sleep(delay_s)
    child.send_signal(signal.SIGINT)
    stdout, stderr = child.communicate(timeout=120)
    assert b"Traceback" not in stderr
    assert child.returncode in (0, 130)
    if stdout:
        json.loads(stdout)
    else:
        assert child.returncode == 130


# -- signals: Ctrl-C from the entry module on ----------------------------------------------

ENTRY = ("import os, sys; import dnnscale.entry as entry; os.write({fd}, b'.'); "
         "sys.argv = ['dnnscale', *sys.argv[1:]]; entry.main()")
# exhaustive: about 7 s of work, far past the longest delay even on a quiet machine (the
# fast search at M = 120 finishes in about 0.3 s, so a 400 ms signal could arrive after it)
LONG = ["optimize", "-w", "adam-imagenet22k", "-c", "adam-2014", "-M", "120", "--exhaustive",
        "--json"]


def _interrupt(delay_s: float, after_entry: bool) -> tuple[int, bytes, bytes, bool]:
    """Start the program, send SIGINT `delay_s` after its start (or after the entry module is
    imported); (exit code, stdout, stderr, whether the entry was in place then)."""
    read, write = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", ENTRY.format(fd=write), *LONG],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
                             pass_fds=(write,), preexec_fn=sigint_default)
    os.close(write)
    try:
        if after_entry:
            select.select([read], [], [], 60)
        time.sleep(delay_s)
        ready = bool(select.select([read], [], [], 0)[0])
        child.send_signal(signal.SIGINT)
        stdout, stderr = child.communicate(timeout=60)
    finally:
        os.close(read)
        if child.poll() is None:
            child.kill()
            child.wait()
    return child.returncode, stdout, stderr, ready


@pytest.mark.parametrize("delay_ms", [0, 1, 5, 20, 50, 100, 200, 400])
def test_ctrl_c_after_the_entry_exits_130(delay_ms: int) -> None:
    code, stdout, stderr, _ = _interrupt(delay_ms / 1000, after_entry=True)
    assert code == 130, stderr[-2000:]
    assert stderr == b"" and stdout == b""


@pytest.mark.parametrize("delay_ms", [0, 20, 50, 100, 200])
def test_ctrl_c_early_after_start(delay_ms: int) -> None:
    """From process start: once the entry module is in (it reported so before the signal),
    exit 130 and nothing on stderr; before that the interpreter itself is starting, which no
    Python program can handle (a death by SIGINT there is Python's)."""
    code, _, stderr, ready = _interrupt(delay_ms / 1000, after_entry=False)
    if ready:
        assert code == 130 and stderr == b"", (code, stderr[-2000:])
    else:
        assert code in (130, -signal.SIGINT, 1), stderr[-2000:]


def test_an_ignored_sigint_stays_ignored() -> None:
    """A background job (SIGINT ignored when it starts) is not made interruptible."""
    code = ("import signal, dnnscale.entry; "
            "print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
                          timeout=60)
    assert done.stdout.strip() == "True"


def test_python_m_dnnscale_runs_the_program() -> None:
    done = subprocess.run([*PROGRAM, "--version"], capture_output=True, text=True, env=ENV,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("dnnscale ")
