"""Issue 26's bad-input cases for export, report --validation, module workloads and run --gpu;
see tests/fuzz_cases.py for `Case`.

Every case must end before any device is touched (the run --gpu cases fail on their inputs, so
they give the same answer on a machine with CUDA), and every module workload imports a small
factory written into the case's folder under a module name of its own (a name imported once
stays in sys.modules for the rest of the test process).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from tests.fuzz_cases import FIFO, Case, dump

ENGINES = ("megatron", "deepspeed", "torchtitan")
PLAN: dict[str, Any] = {"workload": "gpt3-125m", "tp": 1, "pp": 1, "dp": 8, "micro_batch": 1,
                        "global_batch": 8}
PREDICTED_PLAN: dict[str, Any] = {  # ParallelPlan.to_dict() of PLAN, as predict --json has it
    "tensor": {"degree": 1, "rules": "megatron", "sequence_parallel": False},
    "pipeline": {"stages": 1, "schedule": "1f1b", "virtual_stages": 1},
    "data": {"replicas": 8, "aggregation": {"kind": "Collective", "algorithm": "ring",
                                            "zero_stage": 0, "overlap": False}},
    "batch": {"micro_batch": 1, "accumulation": 1}, "memory": {"recompute": "none"},
    "precision": {"compute": "bf16", "param_bytes": 2, "grad_bytes": 2,
                  "optimizer_state_bytes": 4, "activation_bytes": 2, "master_weights": True},
    "optimizer": "adam", "overlap": False, "epoch_fraction": 1.0}


def _with(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of `data` with the dotted `path` set to `value` (removed when DROP)."""
    out = json.loads(json.dumps(data))
    *parents, last = path.split(".")
    cur = out
    for key in parents:
        cur = cur[key]
    if value is DROP:
        del cur[last]
    else:
        cur[last] = value
    return out


DROP = object()


def _plan(**changes: Any) -> str:
    return dump({**PLAN, **changes})


def _optimize(path: str = "", value: Any = None) -> str:
    data = {"workload": "gpt3-125m", "best": {"plan_fields": {k: v for k, v in PLAN.items()
                                                             if k != "workload"}}}
    return json.dumps(_with(data, path, value) if path else data)


def _predicted(path: str, value: Any) -> str:
    return json.dumps({"config": None, "plan": _with(PREDICTED_PLAN, path, value)})


# -- export -------------------------------------------------------------------------------------

PLAN_FILES: dict[str, tuple[str, "str | bytes | None"]] = {
    # name: (field, the plan file's content); run for every engine
    "tp-not-dividing-heads": ("plan.tp", _plan(tp=5)),
    "pp-not-dividing-layers": ("plan.pp", _plan(pp=7, dp=1)),
    "dp-over-limit": ("plan.dp", _plan(dp=10**11, global_batch=10**11)),
    "world-over-limit": ("plan.dp", _plan(dp=1_000_000, global_batch=1_000_000)),
    "global-batch-2-53": ("plan.global_batch", _plan(global_batch=2**53)),
    "micro-batch-trillion": ("plan.global_batch", _plan(micro_batch=10**12,
                                                        global_batch=8 * 10**12)),
    "grad-bytes-one": ("plan.grad_bytes", _plan(grad_bytes=1)),
    "tf32": ("plan.precision", _plan(precision="tf32")),
    "zero-negative": ("plan.zero", _plan(zero=-1)),
    "virtual-stages-too-many": ("plan.pp", _plan(pp=2, dp=1, global_batch=64,
                                                 schedule="interleaved", virtual_stages=1000)),
    "cnn-workload": ("plan.workload", _plan(workload="alexnet")),
    "encoder-workload": ("plan.workload", _plan(workload="bert-large")),
    "unknown-workload": ("plan.workload", _plan(workload="no-such-net")),
    "long-workload": ("plan.workload", _plan(workload="w" * 5000)),
    "workload-number": ("plan.workload", _plan(workload=42)),
    "workload-mapping": ("plan.workload", _plan(workload={"a": 1})),
    "no-plan-fields": ("plan", dump({"workload": "gpt3-125m"})),
    "adam-plan": ("plan", dump({"partitions": 2, "replicas": 4})),
    "unknown-field": ("plan.bogus", _plan(bogus=1)),
    "tp-text": ("plan.tp", _plan(tp="1")),
    "tp-infinite": ("plan.tp", _plan(tp=float("inf"))),
    "precision-list": ("plan.precision", _plan(precision=["bf16"])),
    "schedule-number": ("plan.schedule", _plan(schedule=1)),
    "recompute-bool": ("plan.recompute", _plan(recompute=True)),
    "global-batch-not-multiple": ("plan.global_batch", _plan(global_batch=12)),
    "top-list": ("plan", "- tp: 1\n"),
    "malformed-yaml": ("plan", "tp: [1\n"),
    "integer-key": ("plan", "workload: gpt3-125m\n1: 2\ntp: 1\n"),
    "binary": ("plan", bytes(range(256))),
    "empty": ("plan", ""),
    "folder": ("plan", None),
    "fifo": ("plan", FIFO),
    "optimize-truncated": ("plan", _optimize()[:40]),
    "optimize-nan": ("plan", _optimize().replace('"tp": 1', '"tp": NaN')),
    "optimize-long-integer": ("plan", _optimize().replace('"tp": 1', '"tp": 1' + "0" * 5000)),
    "optimize-duplicate-key": ("plan", '{"workload": "gpt3-125m", "tp": 1, "tp": 5}'),
    "optimize-deep": ("plan", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    "optimize-best-list": ("plan.best", _optimize("best", [1])),
    "optimize-best-null": ("plan.best", _optimize("best", None)),
    "optimize-no-plan": ("plan.best", json.dumps({"workload": "gpt3-125m", "best": {}})),
    "optimize-fields-text": ("plan.best.plan_fields", _optimize("best.plan_fields", "tp=1")),
    "optimize-tp-float": ("plan.best.plan_fields.tp", _optimize("best.plan_fields.tp", 1.5)),
    "optimize-tp-bool": ("plan.best.plan_fields.tp", _optimize("best.plan_fields.tp", True)),
    "optimize-sp-text": ("plan.best.plan_fields.sequence_parallel",
                         _optimize("best.plan_fields.sequence_parallel", "false")),
    "optimize-workload-list": ("plan.workload", _optimize("workload", ["gpt3-125m"])),
    "optimize-of-cpu-search": ("plan.best.prediction.plan.tensor.rules", json.dumps(
        {"workload": "adam-mnist", "best": {"config": {"partitions": 1}, "prediction": {
            "plan": _with(PREDICTED_PLAN, "tensor.rules", "adam")}}})),
}

PREDICTED: dict[str, tuple[str, str, Any]] = {
    # name: (field after "plan.plan.", the key changed in predict --json's plan, its value)
    "parameter-server": ("data.aggregation.kind", "data.aggregation.kind", "ParameterServer"),
    "aggregation-list": ("data.aggregation.kind", "data.aggregation.kind", ["Collective"]),
    "tree-algorithm": ("data.aggregation.algorithm", "data.aggregation.algorithm", "tree"),
    "param-bytes": ("precision.param_bytes", "precision.param_bytes", 4),
    "master-weights-text": ("precision.master_weights", "precision.master_weights", "yes"),
    "sgd": ("optimizer", "optimizer", "sgd"),
    "epoch-fraction": ("epoch_fraction", "epoch_fraction", 0.5),
    "extra-key": ("speed", "speed", 1),
    "accumulation-zero": ("batch.accumulation", "batch.accumulation", 0),
    "replicas-huge": ("data.replicas", "data.replicas", 10**30),
    "degree-text": ("tensor.degree", "tensor.degree", "x"),
    "stages-zero": ("pipeline.stages", "pipeline.stages", 0),
    "schedule-unknown": ("pipeline.schedule", "pipeline.schedule", "zigzag"),
    "zero-stage-nine": ("data.aggregation.zero_stage", "data.aggregation.zero_stage", 9),
    "tensor-list": ("tensor", "tensor", [1]),
    "rules-adam": ("tensor.rules", "tensor.rules", "adam"),
}


def export_cases() -> Iterator[Case]:
    for engine in ENGINES:
        for name, (expected, content) in PLAN_FILES.items():
            yield Case(f"{name}-{engine}", "export-inputs",
                       ("export", "{d}/plan.yaml", "--to", engine, "--json"), expected,
                       {"plan.yaml": content})
    for name, (expected, key, value) in PREDICTED.items():
        yield Case(f"predicted-{name}", "export-inputs",
                   ("export", "{d}/pred.json", "--to", "megatron", "-w", "gpt3-125m", "--json"),
                   f"plan.plan.{expected}", {"pred.json": _predicted(key, value)})
    plan = {"plan.yaml": _plan()}
    unnamed = {"plan.yaml": dump({k: v for k, v in PLAN.items() if k != "workload"})}
    table: list[tuple[str, tuple[str, ...], str, dict[str, "str | bytes | None"]]] = [
        ("predicted-no-workload", ("--to", "megatron"), "--workload",
         {"plan.yaml": _predicted("tensor.degree", 1)}),
        ("flag-unknown-workload", ("--to", "megatron", "-w", "no-such-net"), "--workload",
         unnamed),
        ("flag-long-workload", ("--to", "megatron", "-w", "w" * 5000), "--workload", unnamed),
        ("flag-nul-workload", ("--to", "megatron", "-w", "gpt3\0"), "--workload", unnamed),
        ("flag-mlp-workload", ("--to", "deepspeed", "-w", "mlp:32-16-4"), "--workload",
         unnamed),
        ("flag-module-workload", ("--to", "torchtitan", "-w", "fuzz_export_m:f"), "--workload",
         unnamed),
        ("flag-workload-disagrees", ("--to", "megatron", "-w", "gpt3-350m"), "--workload",
         plan),
        ("engine-unknown", ("--to", "colossal"), "--to", plan),
        ("engine-capitalised", ("--to", "Megatron"), "--to", plan),
        ("engine-long", ("--to", "m" * 5000), "--to", plan),
        ("format-unknown", ("--to", "megatron", "--format", "yaml"), "--format", plan),
        ("format-long", ("--to", "megatron", "--format", "y" * 5000), "--format", plan),
        ("format-other-engine", ("--to", "deepspeed", "--format", "torchrun"), "--format",
         plan),
        ("gpus-per-node-zero", ("--to", "megatron", "--format", "torchrun",
                                "--gpus-per-node", "0"), "--gpus-per-node", plan),
        ("gpus-per-node-huge", ("--to", "megatron", "--format", "torchrun",
                                "--gpus-per-node", "9" * 30), "--gpus-per-node", plan),
        ("gpus-per-node-not-whole", ("--to", "megatron", "--format", "torchrun",
                                     "--gpus-per-node", "3"), "--gpus-per-node", plan),
        ("gpus-per-node-without-torchrun", ("--to", "megatron", "--gpus-per-node", "8"),
         "--gpus-per-node", plan),
        ("deepspeed-overlap-without-zero", ("--to", "deepspeed"), "plan.overlap_dp",
         {"plan.yaml": _plan(overlap_dp=True)}),
        ("torchtitan-zero1", ("--to", "torchtitan"), "plan.zero", {"plan.yaml": _plan(zero=1)}),
        ("torchtitan-ddp-with-pipeline", ("--to", "torchtitan"), "plan.zero",
         {"plan.yaml": _plan(pp=2, dp=4)}),
        ("megatron-zero3-with-pipeline", ("--to", "megatron"), "plan.zero",
         {"plan.yaml": _plan(pp=2, dp=4, zero=3)}),
        ("deepspeed-zero2-with-pipeline", ("--to", "deepspeed"), "plan.zero",
         {"plan.yaml": _plan(pp=2, dp=4, zero=2)}),
        ("deepspeed-overlap-with-pipeline", ("--to", "deepspeed"), "plan.overlap_dp",
         {"plan.yaml": _plan(pp=2, dp=4, zero=1, overlap_dp=True)}),
        ("torchtitan-fp16", ("--to", "torchtitan"), "plan.precision",
         {"plan.yaml": _plan(precision="fp16")}),
        ("megatron-gpipe", ("--to", "megatron"), "plan.schedule",
         {"plan.yaml": _plan(pp=2, dp=4, schedule="gpipe")}),
        ("megatron-fp32-narrow-gradients", ("--to", "megatron"), "plan.grad_bytes",
         {"plan.yaml": _plan(precision="fp32", grad_bytes=2)}),
        ("failed-export-keeps-output", ("--to", "megatron", "-o", "{d}/out.args"), "plan.tp",
         {"plan.yaml": _plan(tp=5), "out.args": "the previous export\n"}),
    ]
    for name, args, expected, files in table:
        if name == "flag-module-workload":
            files = {**files, "fuzz_export_m.py": "def f():\n    raise ValueError('x')\n"}
        yield Case(name, "export-inputs", ("export", "{d}/plan.yaml", *args, "--json"), expected,
                   files, keep=tuple(n for n in files if n.endswith(".args")))


# -- report --validation ------------------------------------------------------------------------

ROW: dict[str, Any] = {
    "id": "c01", "set": "validation", "label": "allreduce P=1 R=2",
    "config": {"sync": "allreduce"}, "machines": 2, "predicted_throughput_samples_per_s": 100.0,
    "predicted_bottleneck": "compute", "relative_error": 0.11,
    "measured": {"throughput_samples_per_s": 90.0, "observed_bottleneck": "compute"}}
RESULTS: dict[str, Any] = {
    "workload": "adam-mnist", "network": "1 Gbit/s", "repeats": 1, "steps": 10,
    "rows": [ROW, {**ROW, "id": "c02", "machines": 4}],
    "summary": {"configs": 2, "median_relative_error": 0.1, "p90_relative_error": 0.2,
                "max_relative_error": 0.3, "kendall_tau": 1.0}}


def _results(path: str, value: Any) -> str:
    data = json.loads(json.dumps(RESULTS))
    *parents, last = path.split(".")
    cur: Any = data
    for key in parents:
        cur = cur[int(key)] if isinstance(cur, list) else cur[key]
    index: Any = int(last) if isinstance(cur, list) else last
    if value is DROP:
        del cur[index]
    else:
        cur[index] = value
    return json.dumps(data)


VALIDATION: dict[str, tuple[str, "str | bytes | None"]] = {
    # name: (field after "--validation", results.json's content)
    "machines-missing": (": rows[0].machines", _results("rows.0.machines", DROP)),
    "machines-text": (": rows[0].machines", _results("rows.0.machines", "two")),
    "machines-zero": (": rows[0].machines", _results("rows.0.machines", 0)),
    "machines-float": (": rows[0].machines", _results("rows.0.machines", 2.5)),
    "id-missing": (": rows[1].id", _results("rows.1.id", DROP)),
    "id-mapping": (": rows[0].id", _results("rows.0.id", {"a": 1})),
    "label-list": (": rows[0].label", _results("rows.0.label", [1, 2])),
    "set-list": (": rows[0].set", _results("rows.0.set", ["calibration"])),
    "bottleneck-list": (": rows[0].predicted_bottleneck",
                        _results("rows.0.predicted_bottleneck", [1])),
    "sync-list": (": rows[0].config.sync", _results("rows.0.config", {"sync": ["allreduce"]})),
    "sync-mapping": (": rows[0].config.sync", _results("rows.0.config", {"sync": {"a": 1}})),
    "config-text": (": rows[0].config", _results("rows.0.config", "allreduce")),
    "row-number": (": rows[0]", _results("rows.0", 5)),
    "relative-error-text": (": rows[0].relative_error",
                            _results("rows.0.relative_error", "big")),
    "measured-text-number": (": rows[0].measured.throughput_samples_per_s",
                             _results("rows.0.measured", {"throughput_samples_per_s": "90"})),
    "measured-bool": (": rows[0].measured.throughput_samples_per_s",
                      _results("rows.0.measured", {"throughput_samples_per_s": True})),
    "measured-negative": (": rows[0].measured.throughput_samples_per_s",
                          _results("rows.0.measured", {"throughput_samples_per_s": -1.0})),
    "measured-1e308": (": rows[0].measured.throughput_samples_per_s",
                       _results("rows.0.measured", {"throughput_samples_per_s": 1e308})),
    "measured-list": (": rows[0].measured", _results("rows.0.measured", [1])),
    "observed-bottleneck-number": (": rows[0].measured.observed_bottleneck", _results(
        "rows.0.measured", {"throughput_samples_per_s": 9.0, "observed_bottleneck": 3})),
    "predicted-infinity": (": rows[0].predicted_throughput_samples_per_s",
                           json.dumps(RESULTS).replace("100.0", "Infinity", 1)),
    "predicted-nan": (": rows[0].predicted_throughput_samples_per_s",
                      json.dumps(RESULTS).replace("100.0", "NaN", 1)),
    "summary-median-text": (": summary.median_relative_error",
                            _results("summary.median_relative_error", "small")),
    "summary-p90-list": (": summary.p90_relative_error",
                         _results("summary.p90_relative_error", [1])),
    "summary-tau-text": (": summary.kendall_tau", _results("summary.kendall_tau", "x")),
    "summary-configs-text": (": summary.configs", _results("summary.configs", "9" * 5000)),
    "workload-mapping": (": workload", _results("workload", {"x": 1})),
    "rows-mapping": ("", _results("rows", {"a": 1})),
    "summary-missing": ("", _results("summary", DROP)),
    "top-list": ("", "[1]"),
    "empty": ("", ""),
    "truncated": ("", json.dumps(RESULTS)[:100]),
    "binary": ("", bytes(range(256))),
    "deep": ("", "[" * 100_000 + "]" * 100_000),
    "long-integer": ("", json.dumps(RESULTS).replace('"machines": 2', '"machines": 2'
                                                     + "0" * 5000, 1)),
    "folder": ("", None),
    "fifo": ("", FIFO),
}


def report_cases() -> Iterator[Case]:
    argv = ("report", "--validation", "{d}/v", "-o", "{d}/report.html")
    for name, (suffix, content) in VALIDATION.items():
        yield Case(name, "report-inputs", argv, f"--validation{suffix}",
                   {"v/results.json": content})
    yield Case("failed-report-keeps-page", "report-inputs", argv,
               "--validation: rows[0].machines",
               {"v/results.json": _results("rows.0.machines", DROP),
                "report.html": "the previous page\n"}, keep=("report.html",))
    yield Case("no-results-file", "report-inputs", argv, "--validation", {"v/other": "x"})


# -- module workloads ---------------------------------------------------------------------------

LINEAR = ("import torch\n\ndef f():\n    return torch.nn.Sequential(torch.nn.Linear(8, 4), "
          "torch.nn.ReLU(), torch.nn.Linear(4, 2))\n")


def _module(body: str) -> str:
    return ("import sys\nimport torch\n\nclass M(torch.nn.Module):\n    def __init__(self):\n"
            "        super().__init__()\n        self.l = torch.nn.Linear(8, 2)\n\n"
            "    def forward(self, x):\n" + body + "\n\ndef f():\n    return M()\n")


MODULES: dict[str, tuple[str, str, str]] = {
    # name: (field of describe --torch (predict -w names --workload for "torch"), the
    #        factory's source, --input-shape)
    "shape-zero": ("--input-shape", LINEAR, "0"),
    "int64-into-linear": ("torch", LINEAR, "8:int64"),
    "bool-into-linear": ("torch", LINEAR, "8:bool"),
    "float64-into-float32-linear": ("torch", LINEAR, "8:float64"),
    "int32-into-linear": ("torch", LINEAR, "8:int32"),
    "shape-negative": ("--input-shape", LINEAR, "8,-1"),
    "shape-empty": ("--input-shape", LINEAR, ""),
    "shape-semicolon": ("--input-shape", LINEAR, ";"),
    "shape-trailing-semicolon": ("--input-shape", LINEAR, "8;"),
    "shape-float": ("--input-shape", LINEAR, "8.5"),
    "shape-huge": ("--input-shape", LINEAR, "100000000000,100000000000"),
    "shape-digits": ("--input-shape", LINEAR, "9" * 5000),
    "shape-200-dims": ("--input-shape", LINEAR, ",".join(["1"] * 200)),
    "shape-500-inputs": ("--input-shape", LINEAR, ";".join(["8"] * 500)),
    "dtype-unknown": ("--input-shape", LINEAR, "8:complex64"),
    "dtype-long": ("--input-shape", LINEAR, "8:" + "x" * 5000),
    "dtype-two": ("--input-shape", LINEAR, "8:float32:int64"),
    "wrong-width": ("torch", LINEAR, "7"),
    "two-inputs-for-one": ("torch", LINEAR, "8;8"),
    "factory-raises-long": ("torch", "def f():\n    raise ValueError('x' * 100000)\n", "8"),
    "factory-exits": ("torch", "import sys\n\ndef f():\n    sys.exit(0)\n", "8"),
    "factory-returns-none": ("torch", "def f():\n    return None\n", "8"),
    "factory-returns-list": ("torch", "import torch\n\ndef f():\n    return "
                                      "[torch.nn.Linear(8, 2)]\n", "8"),
    "factory-needs-arguments": ("torch", "def f(a, b):\n    pass\n", "8"),
    "class-not-module": ("torch", "class f:\n    pass\n", "8"),
    "no-parameters": ("torch", "import torch\n\ndef f():\n    return torch.nn.ReLU()\n", "8"),
    "reads-values": ("torch", _module("        if x.sum().item() > 0:\n            pass\n"
                                      "        return self.l(x)"), "8"),
    "forward-raises-long": ("torch", _module("        raise RuntimeError('y' * 10000)"), "8"),
    "forward-exits": ("torch", _module("        sys.exit(4)"), "8"),
    "forward-recurses": ("torch", _module("        return self.forward(x)"), "8"),
    "forward-out-of-memory": ("torch", _module("        raise MemoryError()"), "8"),
    "output-integer": ("torch", _module("        return self.l(x).argmax(-1)"), "8"),
    "output-none": ("torch", _module("        return None"), "8"),
    "absurd-parameters": ("torch", "import torch\n\ndef f():\n    return "
                                   "torch.nn.Linear(10**10, 10**10)\n", "10000000000"),
    "embedding-of-floats": ("torch", "import torch\n\ndef f():\n    return "
                                     "torch.nn.Embedding(100, 8)\n", "4"),
}


def module_cases() -> Iterator[Case]:
    for index, (name, (expected, source, shape)) in enumerate(MODULES.items()):
        for command in ("describe", "predict"):
            module = f"fuzz_module_{command}_{index}"
            if command == "describe":
                argv: tuple[str, ...] = ("describe", "--torch", f"{module}:f", "--input-shape",
                                         shape, "--json")
                field = expected
            else:
                argv = ("predict", "-w", f"{module}:f", "--input-shape", shape, "-c",
                        "adam-2014", "-P", "1", "-R", "2", "-S", "1", "--json")
                field = "--workload" if expected == "torch" else expected
            yield Case(f"{name}-{command}", "module-workloads", argv, field,
                       {f"{module}.py": source})
    specs: list[tuple[str, tuple[str, ...], str]] = [
        ("describe-spec-long", ("describe", "--torch", "a" * 5000 + ":f", "--input-shape", "8",
                                "--json"), "--torch"),
        ("predict-spec-long", ("predict", "-w", "a" * 5000 + ":f", "--input-shape", "8", "-c",
                               "adam-2014", *("-P", "1", "-R", "2", "-S", "1"), "--json"),
         "--workload"),
        ("predict-spec-not-identifiers", ("predict", "-w", "fuzz_module_x:f-g",
                                          "--input-shape", "8", "-c", "adam-2014", "-P", "1",
                                          "-R", "2", "-S", "1", "--json"), "--workload"),
        ("describe-module-missing", ("describe", "--torch", "fuzz_no_such_module:f",
                                     "--input-shape", "8", "--json"), "--torch"),
        ("describe-stdlib-function", ("describe", "--torch", "os:getcwd", "--input-shape", "8",
                                      "--json"), "torch"),
        ("describe-sys-exit", ("describe", "--torch", "sys:exit", "--input-shape", "8",
                               "--json"), "torch"),
    ]
    for name, argv, field in specs:
        yield Case(name, "module-workloads", argv, field)


# -- run --gpu ----------------------------------------------------------------------------------

GPT = "gpt:layers=2,hidden=64,heads=4,seq=8,vocab=10"
GPU_RUNS: list[tuple[str, tuple[str, ...], str, dict[str, "str | bytes | None"]]] = [
    # name, arguments after `run --gpu`, field, files
    ("cnn-workload", ("-w", "alexnet"), "--workload", {}),
    ("adam-workload", ("-w", "adam-mnist"), "--workload", {}),
    ("unknown-workload", ("-w", "no-such-net"), "--workload", {}),
    ("long-workload", ("-w", "w" * 5000), "--workload", {}),
    ("nul-workload", ("-w", "gpt\0"), "--workload", {}),
    ("hf-config-missing", ("-w", "hf:{d}/none.json"), "--workload", {}),
    ("module-workload", ("-w", "fuzz_gpu_m:f"), "--workload",
     {"fuzz_gpu_m.py": "def f():\n    pass\n"}),
    ("gpt-too-deep", ("-w", "gpt:layers=100000,hidden=64,heads=4,seq=8,vocab=10"),
     "workload.gpt.layers", {}),
    ("steps-zero", ("-w", GPT, "--steps", "0"), "--steps", {}),
    ("steps-huge", ("-w", GPT, "--steps", "9" * 20), "--steps", {}),
    ("warmup-negative", ("-w", GPT, "--warmup", "-1"), "--warmup", {}),
    ("warmup-all-steps", ("-w", GPT, "--steps", "3", "--warmup", "3"), "--warmup", {}),
    ("lr-nan", ("-w", GPT, "--lr", "nan"), "--lr", {}),
    ("lr-negative", ("-w", GPT, "--lr", "-1"), "--lr", {}),
    ("lr-1e300", ("-w", GPT, "--lr", "1e300"), "--lr", {}),
    ("seed-negative", ("-w", GPT, "--seed", "-1"), "--seed", {}),
    ("seed-huge", ("-w", GPT, "--seed", "9" * 23), "--seed", {}),
    ("micro-batch-zero", ("-w", GPT, "--micro-batch", "0"), "--micro-batch", {}),
    ("micro-batch-trillion", ("-w", GPT, "--micro-batch", "1000000000000", "--global-batch",
                              "1000000000000"), "--global-batch", {}),
    ("global-batch-2-53", ("-w", GPT, "--global-batch", str(2**53)), "--global-batch", {}),
    ("global-batch-not-multiple", ("-w", GPT, "--micro-batch", "2", "--global-batch", "3"),
     "--global-batch", {}),
    ("precision-fp16", ("-w", GPT, "--precision", "fp16"), "--precision", {}),
    ("precision-unknown", ("-w", GPT, "--precision", "int4"), "--precision", {}),
    ("recompute-selective", ("-w", GPT, "--recompute", "selective"), "--recompute", {}),
    ("bf16-mode-long", ("-w", GPT, "--bf16-mode", "b" * 5000), "--bf16-mode", {}),
    ("device-tpu", ("-w", GPT, "--device", "tpu"), "--device", {}),
    ("device-long", ("-w", GPT, "--device", "c" * 5000), "--device", {}),
    ("device-index-digits", ("-w", GPT, "--device", "cuda:" + "9" * 5000), "--device", {}),
    ("plan-tp2", ("-w", GPT, "--config", "{d}/p.yaml"), "plan.tp", {"p.yaml": "tp: 2\n"}),
    ("plan-zero1", ("-w", GPT, "--config", "{d}/p.yaml"), "plan.zero",
     {"p.yaml": "zero: 1\n"}),
    ("plan-sequence-parallel", ("-w", GPT, "--config", "{d}/p.yaml"),
     "plan.sequence_parallel", {"p.yaml": "sequence_parallel: true\n"}),
    ("plan-overlap-dp", ("-w", GPT, "--config", "{d}/p.yaml"), "plan.overlap_dp",
     {"p.yaml": "overlap_dp: true\n"}),
    ("plan-grad-bytes", ("-w", GPT, "--config", "{d}/p.yaml"), "plan.grad_bytes",
     {"p.yaml": "grad_bytes: 4\n"}),
    ("plan-schedule", ("-w", GPT, "--config", "{d}/p.yaml"), "plan.schedule",
     {"p.yaml": "schedule: gpipe\n"}),
    ("plan-unknown-field", ("-w", GPT, "--config", "{d}/p.yaml"), "plan.foo",
     {"p.yaml": "foo: 1\n"}),
    ("plan-list", ("-w", GPT, "--config", "{d}/p.yaml"), "config", {"p.yaml": "- 1\n"}),
    ("plan-binary", ("-w", GPT, "--config", "{d}/p.yaml"), "config",
     {"p.yaml": bytes(range(256))}),
    ("failed-run-keeps-output", ("-w", "alexnet", "-o", "{d}/out.jsonl"), "--workload",
     {"out.jsonl": "the previous run\n"}),
]


def gpu_cases() -> Iterator[Case]:
    for name, args, field, files in GPU_RUNS:
        yield Case(name, "gpu-run-inputs", ("run", "--gpu", *args, "--json"), field, files,
                   keep=tuple(n for n in files if n.endswith(".jsonl")))


REPORT_STRAYS: list[tuple[str, tuple[str, ...]]] = [
    # name, arguments after `report -o {d}/r.html`: a word that is neither a flag nor its value
    ("stray-file-first", ("pred.json",)),
    ("stray-file-last", ("-w", "adam-mnist", "-c", "adam-2014", "-M", "8", "pred.json")),
    ("stray-after-on-off-flag", ("-w", "adam-mnist", "-c", "adam-2014", "--overlap", "x")),
    ("stray-gpu", ("-w", "gpt3-125m", "-c", "dgx-a100-80g:1", "--tp", "2", "--global-batch",
                   "8", "extra")),
    ("stray-after-equals", ("--workload=adam-mnist", "adam-2014")),
]


def report_stray_cases() -> Iterator[Case]:
    for name, args in REPORT_STRAYS:
        yield Case(name, "report-inputs", ("report", "-o", "{d}/r.html", *args), "arguments")


def cases() -> Iterator[Case]:
    for generate in (export_cases, report_cases, report_stray_cases, module_cases, gpu_cases):
        yield from generate()
