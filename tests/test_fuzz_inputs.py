"""Bad input never crashes, hangs or lies, and nothing is half-written (issue 15).

Every case of tests/fuzz_cases.py runs a real command line: in-process through typer's CliRunner
(fast), or, for the classes that used to hang the interpreter, grow its memory without bound or
overflow the C stack (alias bombs, 100,000-deep nesting), as the installed `dnnscale` in a child
process with an address-space limit. Each must end with exit code 2 and exactly one line on
stderr, ``error: FIELD: problem``, naming the field; print nothing on stdout under --json; show
no traceback; leave no file behind (and no existing file changed); and stay within a time and a
memory cap. Python API cases (Config, Workload and Cluster objects) must raise InputError naming
the field. JSON cases check that every --json output is strict JSON. A Ctrl-C case checks that
`run -o` keeps an existing file intact.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import dnnscale
from dnnscale.cli import app
from dnnscale.system import load_system
from dnnscale.errors import MAX_LINE_CHARS, InputError
from dnnscale.workload import Layer, load_workload, zoo_workload
from tests.fuzz_cases import FIFO, Case, all_cases
from tests.signals import sigint_default

DNNSCALE = str(Path(sys.executable).parent / "dnnscale")
CASES = all_cases()
TIME_CAP_S = 20.0
"""Wall-time cap of one case (the slowest, a file of 500,000 values, takes about 5 s on a shared
2-core machine; a hang hits the cap)."""
IN_PROCESS_MEMORY_CAP_BYTES = 512 * 2**20
"""How much one in-process case may raise the test process's peak resident memory."""
CHILD_ADDRESS_SPACE_BYTES = 2 * 2**30
"""Address-space limit of a child process (an alias bomb used to grow past 2.5 GB)."""

runner = CliRunner()


def _materialise(case: Case, folder: Path) -> list[str]:
    """Write the case's files into `folder`; the argv with {d} filled in."""
    for name, content in case.files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is None:
            path.mkdir()
        elif content is FIFO:
            os.mkfifo(path)
        elif callable(content):  # makes a link, a socket or a device (fuzz_cases_outputs.py)
            content(path)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return [arg.replace("{d}", str(folder)) for arg in case.argv]


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder` with its bytes (None for folders and FIFOs)."""
    result: dict[str, bytes | None] = {}
    for path in sorted(folder.rglob("*")):
        regular = path.is_file() and not path.is_fifo()
        result[str(path.relative_to(folder))] = path.read_bytes() if regular else None
    return result


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _limit_child() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_ADDRESS_SPACE_BYTES, CHILD_ADDRESS_SPACE_BYTES))
    resource.setrlimit(resource.RLIMIT_CPU, (int(TIME_CAP_S), int(TIME_CAP_S) + 1))


def _run(case: Case, argv: list[str], folder: Path) -> tuple[int, str, str, str]:
    """(exit code, stdout, stderr, how it ended: '' or the exception's repr)."""
    if case.subprocess:
        done = subprocess.run([DNNSCALE, *argv], capture_output=True, text=True,
                              timeout=TIME_CAP_S, preexec_fn=_limit_child, cwd=folder,
                              env={**os.environ, "COLUMNS": "100"})
        return done.returncode, done.stdout, done.stderr, ""
    result = runner.invoke(app, argv)
    ended = "" if result.exception is None or isinstance(result.exception, SystemExit) \
        else repr(result.exception)
    return result.exit_code, result.stdout, result.stderr, ended


@pytest.mark.timeout(int(TIME_CAP_S) * 3)
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_exits_2_with_one_line(case: Case, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "case"
    folder.mkdir()
    argv = _materialise(case, folder)
    monkeypatch.chdir(folder)  # --torch factories are imported from the working folder
    monkeypatch.syspath_prepend(str(folder))
    before = _snapshot(folder)
    peak = _peak_rss_bytes()
    start = time.monotonic()
    code, stdout, stderr, ended = _run(case, argv, folder)
    elapsed = time.monotonic() - start
    assert not ended, f"raised instead of a clean exit: {ended}"
    assert "Traceback" not in stderr + stdout
    lines = stderr.strip().splitlines()
    assert code == 2, (code, stderr[-2000:])
    assert len(lines) == 1, stderr[-2000:]
    assert lines[0].startswith(f"error: {case.field}: "), lines[0][:300]
    assert len(lines[0]) <= MAX_LINE_CHARS  # a user's huge value is cut, never echoed whole
    if "--json" in argv:
        assert stdout == ""
    assert _snapshot(folder) == before  # nothing written, nothing changed, no temporary left
    assert elapsed < TIME_CAP_S
    if not case.subprocess:
        assert _peak_rss_bytes() - peak < IN_PROCESS_MEMORY_CAP_BYTES


# -- the Python API -------------------------------------------------------------------------

def _replace_layer(workload: Any, index: int, **changes: Any) -> Any:
    layers = list(workload.layers)
    layers[index] = dataclasses.replace(layers[index], **changes)
    return dataclasses.replace(workload, layers=tuple(layers))


BAD_CONFIGS = {
    "replicas-negative": (dict(replicas=-2), "config.replicas"),
    "replicas-zero": (dict(replicas=0), "config.replicas"),
    "partitions-zero": (dict(partitions=0), "config.partitions"),
    "partitions-float": (dict(partitions=1.5), "config.partitions"),
    "ps-shards-negative": (dict(ps_shards=-1), "config.ps_shards"),
    "sync-gossip": (dict(sync="gossip"), "config.sync"),
    "minibatch-zero": (dict(minibatch=0), "config.minibatch"),
    "minibatch-string": (dict(minibatch="32"), "config.minibatch"),
    "push-every-zero": (dict(push_every=0), "config.push_every"),
    "fc-protocol": (dict(fc_protocol="both"), "config.fc_protocol"),
    "optimizer": (dict(optimizer="lion"), "config.optimizer"),
    "optimizer-unhashable": (dict(optimizer=["sgd"]), "config.optimizer"),
    "overlap-string": (dict(overlap="no"), "config.overlap"),
    "epoch-fraction-zero": (dict(epoch_fraction=0.0), "config.epoch_fraction"),
    "epoch-fraction-nan": (dict(epoch_fraction=math.nan), "config.epoch_fraction"),
    "allreduce-shards": (dict(sync="allreduce", ps_shards=3), "config.ps_shards"),
    "replicas-huge": (dict(replicas=10**8), "config.replicas"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(BAD_CONFIGS))
def test_api_predict_validates_config_objects(name: str) -> None:
    kwargs, field = BAD_CONFIGS[name]
    with pytest.raises(InputError) as caught:
        dnnscale.predict("adam-mnist", "adam-2014", dnnscale.Config(**kwargs))
    assert caught.value.field == field


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(set(BAD_CONFIGS) - {"replicas-huge"}))
def test_api_optimize_validates_its_base_config(name: str) -> None:
    kwargs, field = BAD_CONFIGS[name]
    with pytest.raises(InputError) as caught:
        dnnscale.optimize("adam-mnist", "adam-2014", machines=8, base=dnnscale.Config(**kwargs))
    assert caught.value.field == field.replace("config.", "base.")


def _bad_objects() -> dict[str, tuple[Any, Any, str]]:
    """name -> (workload, cluster, field) with one of them broken."""
    w, c = zoo_workload("mlp:32-16-4"), load_system("adam-2014")
    first = w.layers[0]
    return {
        "layer-params-negative": (_replace_layer(w, 0, params=-5), c,
                                  "workload.layers[0].params"),
        "layer-flops-nan": (_replace_layer(w, 0, fwd_flops=math.nan), c,
                            "workload.layers[0].fwd_flops"),
        "layer-flops-inf": (_replace_layer(w, 0, weight_grad_flops=math.inf), c,
                            "workload.layers[0].weight_grad_flops"),
        "layer-bytes-negative": (_replace_layer(w, 1, fwd_bytes=-1.0), c,
                                 "workload.layers[1].fwd_bytes"),
        "shapes-do-not-chain": (_replace_layer(w, 1, input_shape=(99,)), c,
                                "workload.layers[1].input_shape"),
        "shape-negative": (_replace_layer(w, 0, output_shape=(-16,)), c,
                           "workload.layers[0].output_shape"),
        "not-a-layer": (dataclasses.replace(w, layers=(first, "relu")), c, "workload.layers[1]"),
        "no-layers": (dataclasses.replace(w, layers=()), c, "workload.layers"),
        "samples-zero": (dataclasses.replace(w, samples_per_epoch=0), c,
                         "workload.samples_per_epoch"),
        "bytes-per-value": (dataclasses.replace(w, bytes_per_value=3), c,
                            "workload.bytes_per_value"),
        "input-shape": (dataclasses.replace(w, input_shape=(0,)), c, "workload.input_shape"),
        "cluster-machines-zero": (w, dataclasses.replace(c, machines=0), "cluster.machines"),
        "cluster-machines-10e12": (w, dataclasses.replace(c, machines=10**12),
                                   "cluster.machines"),
        "cluster-memory-nan": (w, dataclasses.replace(c, machine=dataclasses.replace(
            c.machine, memory_bytes=math.nan)), "cluster.machine.memory_bytes"),
        "cluster-bandwidth-negative": (w, dataclasses.replace(c, network=dataclasses.replace(
            c.network, bandwidth_bytes_per_s=-1.0)), "cluster.network.bandwidth"),
        "cluster-latency-inf": (w, dataclasses.replace(c, network=dataclasses.replace(
            c.network, latency_s=math.inf)), "cluster.network.latency"),
        "cluster-gamma": (w, dataclasses.replace(c, overlap_gamma=0.5), "cluster.overlap_gamma"),
        "workload-not-object": (42, c, "workload"),
        "cluster-not-object": (w, 3.5, "cluster"),
        "workload-nul-name": ("mlp\0", c, "workload"),
    }


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(_bad_objects()))
def test_api_validates_workload_and_cluster_objects(name: str) -> None:
    workload, cluster, field = _bad_objects()[name]
    for call in (lambda: dnnscale.predict(workload, cluster, dnnscale.Config()),
                 lambda: dnnscale.optimize(workload, cluster, machines=8)):
        with pytest.raises(InputError) as caught:
            call()
        assert caught.value.field == field


@pytest.mark.timeout(60)
def test_api_config_of_wrong_type() -> None:
    with pytest.raises(InputError) as caught:
        dnnscale.predict("adam-mnist", "adam-2014", 3)  # type: ignore[arg-type]
    assert caught.value.field == "config"


def test_valid_objects_still_predict() -> None:
    """The checks pass what is valid: a zoo workload object and a preset cluster object give
    the same prediction as their names."""
    w, c = zoo_workload("adam-mnist"), load_system("adam-2014")
    config = dnnscale.Config(partitions=2, replicas=4, ps_shards=2)
    assert dnnscale.predict(w, c, config) == dnnscale.predict("adam-mnist", "adam-2014", config)
    assert isinstance(w.layers[0], Layer)


# -- strict JSON ----------------------------------------------------------------------------

def _strict(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise AssertionError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


JSON_COMMANDS = {
    "describe": ["describe", "adam-cifar10", "--json"],
    "predict-ps": ["predict", "-w", "adam-mnist", "-c", "adam-2014", "-P", "2", "-R", "4",
                   "-S", "2", "--json", "--layers"],
    "predict-allreduce": ["predict", "-w", "adam-mnist", "-c", "adam-2014", "-P", "1", "-R", "4",
                          "--sync", "allreduce", "--json"],
    "predict-sync-overlap": ["predict", "-w", "alexnet", "-c", "adam-2014", "-P", "1", "-R",
                             "2", "-S", "1", "--sync", "ps-sync", "--overlap", "--json"],
    "optimize": ["optimize", "-w", "adam-mnist", "-c", "adam-2014", "-M", "16", "--json"],
    "bands": ["bands", "--all", "--json"],
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(JSON_COMMANDS))
def test_json_output_is_strict(name: str) -> None:
    result = runner.invoke(app, JSON_COMMANDS[name])
    assert result.exit_code == 0, result.stderr
    _strict(result.stdout)


def test_non_finite_numbers_become_null() -> None:
    from dnnscale.jsonout import dumps

    text = dumps({"a": math.inf, "b": [math.nan, -math.inf, 1.5], "c": (2, "x")})
    assert _strict(text) == {"a": None, "b": [None, None, 1.5], "c": [2, "x"]}


def test_run_records_are_strict(tmp_path: Path) -> None:
    """A diverged run's NaN loss is written as null, and reads back as NaN in the summary."""
    from dnnscale.runtime.records import JsonlWriter, read_records, worker_totals

    writer = JsonlWriter(tmp_path / "r.jsonl")
    step = {"type": "step", "rank": 0, "replica": 0, "partition": 0, "step": 0, "loss": math.nan,
            "samples": 8, "t_start_s": 0.0, "t_end_s": 1.0, "step_s": 1.0,
            **{f"{phase}_s": 0.0 for phase in ("compute", "partition_comm", "ps_push",
                                               "ps_pull", "allreduce")}}
    writer.write(step)
    writer.close()
    _strict((tmp_path / "r.jsonl").read_text())
    records = read_records(tmp_path / "r.jsonl")
    assert records[0]["loss"] is None
    assert math.isnan(worker_totals(records, 0)["loss_first"])


# -- Ctrl-C during `run -o` -----------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_during_run_keeps_the_existing_output(tmp_path: Path) -> None:
    """Ctrl-C while the ranks train: exit 130, the old output as it was, no partial file.

    It used to flake in full-suite runs: the run had `--timeout 20` and the test 60 s to see a
    step (90 s in all), while on a loaded 2-core machine two ranks take 20-50 s to import torch
    and meet. A run that gives up waiting for its peer fails by itself, before any Ctrl-C, and
    a failed run's records replace the output by design (they end with the error), so the
    test saw exit 1 and a changed file. The run's own timeout is now far beyond the test's
    waits, the waits are long enough for a loaded machine, and a run that ends before the
    Ctrl-C fails the test with the launcher's own error instead of a bare assertion."""
    out = tmp_path / "run.jsonl"
    out.write_text("the previous run\n")
    partial = tmp_path / "run.jsonl.partial"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "dnnscale", "run", "-w", "mlp:32-16-4", "-P", "1", "-R", "2",
         "--sync", "allreduce", "-n", "8", "--steps", "100000", "--timeout", "3600", "--local",
         "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=sigint_default)
    try:
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and launcher.poll() is None:
            try:
                if '"type":"step"' in partial.read_text():
                    break
            except FileNotFoundError:  # not made yet (or removed: the run ended)
                pass
            time.sleep(0.1)
        if launcher.poll() is not None:
            pytest.fail(f"the run ended before Ctrl-C (exit {launcher.returncode}): "
                        f"{launcher.communicate()[1][-2000:]}")
        assert out.read_text() == "the previous run\n"  # not truncated while running
        launcher.send_signal(signal.SIGINT)
        _, stderr = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr
    assert out.read_text() == "the previous run\n"
    assert not partial.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.jsonl"]


# -- the size of the suite ------------------------------------------------------------------

def test_the_suite_covers_every_class() -> None:
    """At least 300 generated cases, across the classes of issue 15."""
    groups: dict[str, int] = {}
    for case in CASES:
        groups[case.group] = groups.get(case.group, 0) + 1
    assert {"yaml-bomb", "yaml-structure", "layer-values", "config-values", "cluster-values",
            "huge-inputs", "output-paths", "usage-errors", "names-and-paths",
            "torch-import", "transformer-inputs"} <= set(groups)
    assert len(CASES) >= 300


ISSUE_26_CLASSES = {
    "output-special-files", "output-keeps-existing", "json-purity",  # tests/fuzz_cases_outputs
    "output-onto-input",
    "gpu-flags", "gpu-presets", "gpu-search", "hf-config-fields", "plan-files",  # ..._gpu
    "cluster-files", "absurd-answers", "validation-results",
    "inapplicable-flags", "typed-flag-names", "long-values",  # tests/fuzz_cases_flags
    "export-inputs", "report-inputs", "module-workloads", "gpu-run-inputs"}  # ..._export


def test_the_suite_covers_issue_26s_classes() -> None:
    """At least 300 new cases across the GPU flow, export, report, module workloads and outputs
    (the API's are tests/test_fuzz_api.py's), each class with cases. Device twins are made with
    mknod, so the output classes need root (CI runs as root)."""
    from tests import fuzz_cases_export, fuzz_cases_flags, fuzz_cases_gpu, fuzz_cases_outputs

    new = [case for module in (fuzz_cases_outputs, fuzz_cases_gpu, fuzz_cases_flags,
                               fuzz_cases_export) for case in module.cases()]
    groups = {case.group for case in new}
    assert ISSUE_26_CLASSES - ({"output-special-files"} if os.geteuid() else set()) <= groups
    assert len(new) >= 300


def test_the_suite_covers_issue_27s_network() -> None:
    """The network between GPU nodes (a GPU cluster file's fields, predict's and optimize's
    inter-node flags, those flags on CPU clusters) and a shared host's cores: at least 100
    cases, in the suite."""
    from tests import fuzz_cases_network

    new = list(fuzz_cases_network.cases())
    assert {case.group for case in new} == {"gpu-network", "shared-host"} and len(new) >= 100
    assert {case.id for case in new} <= {case.id for case in CASES}
