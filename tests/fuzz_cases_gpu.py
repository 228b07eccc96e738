"""Issue 26's bad-input cases for one area (gpu); see tests/fuzz_cases.py for `Case`.

GPU plan flags out of range on `predict` and `optimize` (errors name the flag typed), the
search's restrictions that no plan meets, GPU node presets as NAME:NODES, `hf:` config fields of
every type, plan files, cluster files' booleans and names, and answers that would be absurd (a
global batch beyond the epoch, a step beyond MAX_SECONDS).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from tests.fuzz_cases import CLUSTER, Case, dump, nested

GPT = "gpt:layers=4,hidden=64,heads=4,seq=32,vocab=100"
"""A small transformer (4 blocks of 64, 4 heads): fast to build and price."""
GPT_FEW = GPT + ",samples=64"
"""The same with 64 samples per epoch: a global batch above 64 asks for an absurd epoch."""
NODE = "dgx-a100-80g:1"
PRESETS = ("dgx-a100-80g", "dgx-a100-40g", "dgx-h100", "hgx-h200", "dgx-v100", "a100-80g-roce",
           "h100-roce")


def _predict(*flags: str, workload: str = GPT, cluster: str = NODE) -> tuple[str, ...]:
    return ("predict", "-w", workload, "-c", cluster, *flags, "--json")


def _optimize(*flags: str, workload: str = GPT, cluster: str = NODE,
              batch: str | None = "8") -> tuple[str, ...]:
    given = ("--global-batch", batch) if batch is not None else ()
    return ("optimize", "-w", workload, "-c", cluster, *given, *flags, "--json")


# -- GPU plan flags, one out of range at a time --------------------------------------------------

INT_FLAGS = ("--tp", "--pp", "--dp", "--micro-batch", "--global-batch", "--virtual-stages")
BAD_INTS = {"zero": "0", "negative": "-1", "huge": str(10**30), "float": "1.5", "text": "two",
            "empty": ""}
CHOICE_FLAGS = {"--schedule": "zb-v", "--recompute": "most", "--precision": "int4"}


def flag_cases() -> Iterator[Case]:
    for flag in INT_FLAGS:
        for label, value in BAD_INTS.items():
            yield Case(f"predict{flag}-{label}", "gpu-flags", _predict(flag, value), flag)
    for label, value in (("negative", "-1"), ("four", "4"), ("huge", str(10**30)),
                         ("text", "one")):
        yield Case(f"predict--zero-{label}", "gpu-flags", _predict("--zero", value), "--zero")
    for flag, value in CHOICE_FLAGS.items():
        yield Case(f"predict{flag}-unknown", "gpu-flags", _predict(flag, value), flag)
        yield Case(f"predict{flag}-empty", "gpu-flags", _predict(flag, ""), flag)
        yield Case(f"optimize{flag}-unknown", "gpu-flags", _optimize(flag, value), flag)
    combinations: list[tuple[str, tuple[str, ...], str]] = [
        ("tp-not-dividing-heads", ("--tp", "3"), "--tp"),
        ("pp-not-dividing-layers", ("--pp", "3"), "--pp"),
        ("pp-over-layers", ("--pp", "8"), "--pp"),
        ("batch-not-multiple", ("--dp", "2", "--global-batch", "3"), "--global-batch"),
        ("micro-batch-over-batch", ("--micro-batch", "4", "--global-batch", "2"),
         "--global-batch"),
        ("interleaved-one-stage", ("--schedule", "interleaved", "--virtual-stages", "2"),
         "--schedule"),
        ("interleaved-no-chunks", ("--pp", "2", "--schedule", "interleaved"), "--schedule"),
        ("chunks-without-interleaved", ("--pp", "2", "--virtual-stages", "2"),
         "--virtual-stages"),
        ("interleaved-micro-batches", ("--pp", "2", "--schedule", "interleaved",
                                       "--virtual-stages", "2", "--global-batch", "3"),
         "--global-batch"),
        ("chunks-not-dividing", ("--pp", "2", "--schedule", "interleaved", "--virtual-stages",
                                 "3", "--global-batch", "2"), "--pp"),
        ("devices-over-cluster", ("--tp", "4", "--dp", "4", "--global-batch", "4"), "plan"),
        ("dp-over-cluster", ("--dp", "16", "--global-batch", "16"), "plan"),
        ("fp8-on-a100", ("--precision", "fp8"), "--precision"),
        ("adam-flag-mixed", ("--tp", "2", "-R", "2"), "--replicas"),
    ]
    for name, flags, field in combinations:
        yield Case(f"predict-{name}", "gpu-flags", _predict(*flags), field)
    optimize: list[tuple[str, tuple[str, ...], str]] = [
        ("tp-zero", ("--tp", "0"), "--tp"),
        ("tp-text", ("--tp", "1,x"), "--tp"),
        ("tp-empty-list", ("--tp", ","), "--tp"),
        ("tp-huge", ("--tp", str(10**30)), "--tp"),
        ("tp-many", ("--tp", ",".join(str(n) for n in range(1, 100))), "--tp"),
        ("pp-negative", ("--pp", "-2"), "--pp"),
        ("micro-batch-zero", ("--micro-batch", "0"), "--micro-batch"),
        ("micro-batch-float", ("--micro-batch", "1.5"), "--micro-batch"),
        ("zero-four", ("--zero", "4"), "--zero"),
        ("zero-negative", ("--zero", "-1"), "--zero"),
        ("schedule-empty-list", ("--schedule", ","), "--schedule"),
        ("recompute-one-bad", ("--recompute", "none,most"), "--recompute"),
        ("precision-empty", ("--precision", ""), "--precision"),
        ("objective-unknown", ("--objective", "speed"), "--objective"),
    ]
    for name, flags, field in optimize:
        yield Case(f"optimize-{name}", "gpu-flags", _optimize(*flags), field)
    for label, value in BAD_INTS.items():
        field = "--global-batch"
        yield Case(f"optimize--global-batch-{label}", "gpu-flags", _optimize(batch=value), field)
    yield Case("optimize-global-batch-missing", "gpu-flags", _optimize(batch=None),
               "--global-batch")


# -- the search's restrictions that no plan can meet ---------------------------------------------

def restriction_cases() -> Iterator[Case]:
    """Each is refused with one line naming the flag (issue 24's rules build the space)."""
    table: list[tuple[str, tuple[str, ...], str]] = [
        ("pp7", ("--pp", "7"), "--pp"),
        ("pp7-with-1", ("--pp", "1,7"), "--pp"),
        ("pp3", ("--pp", "3"), "--pp"),
        ("tp3", ("--tp", "3"), "--tp"),
        ("tp-16-beyond-heads", ("--tp", "16"), "--tp"),
        ("tp5-and-2", ("--tp", "2,5"), "--tp"),
        ("fp8-a100", ("--precision", "fp8"), "--precision"),
        ("mixed-gpu-adam-modes", ("--modes", "allreduce"), "--modes"),
        ("mixed-gpu-adam-minibatch", ("-n", "8"), "--minibatch"),
        ("exhaustive-gpu", ("--exhaustive",), "--exhaustive"),
        ("price-negative", ("--objective", "cost", "--price", "-1"), "--price"),
        ("price-nan", ("--objective", "cost", "--price", "nan"), "--price"),
    ]
    for name, flags, field in table:
        yield Case(f"optimize-{name}", "gpu-search", _optimize(*flags), field)
    no_plan = [
        ("deepspeed-zero2-only-pipeline", ("--engine", "deepspeed", "--pp", "2", "--zero", "2",
                                           "--schedule", "1f1b"), "--zero"),
        ("deepspeed-gpipe-only-pipeline", ("--engine", "deepspeed", "--pp", "4",
                                           "--schedule", "gpipe"), "--schedule"),
        ("torchtitan-zero1-only", ("--engine", "torchtitan", "--zero", "1"), "--zero"),
        ("torchtitan-fp16", ("--engine", "torchtitan", "--precision", "fp16"), "--precision"),
        ("engine-unknown", ("--engine", "colossal"), "--engine"),
        ("overlap-dp-maybe", ("--overlap-dp", "maybe"), "--overlap-dp"),
        ("sequence-parallel-yes", ("--sequence-parallel", "yes"), "--sequence-parallel"),
        ("interleaved-only-one-stage", ("--pp", "1", "--schedule", "interleaved"),
         "--schedule"),
        ("interleaved-chunks-not-dividing", ("--pp", "4", "--schedule", "interleaved"),
         "--pp"),
        ("micro-batch-not-dividing", ("--micro-batch", "3"), "--micro-batch"),
        ("micro-batch-over-batch", ("--micro-batch", "16"), "--micro-batch"),
        ("micro-batch-one-bad", ("--micro-batch", "1,3"), "--micro-batch"),
        ("budget-one-gpu-tp2", ("--tp", "2", "-M", "1"), "--tp"),
    ]
    for name, flags, field in no_plan:
        yield Case(f"optimize-{name}", "gpu-search", _optimize(*flags), field)
    for name, nodes in (("underscore", "1_0"), ("space", " 8"), ("plus", "+8"),
                        ("fullwidth", "\uff18"), ("hex", "0x8"), ("exponent", "1e3")):
        yield Case(f"nodes-{name}", "gpu-presets",
                   ("predict", "-w", "gpt3-125m", "-c", f"dgx-a100-80g:{nodes}", "--json"),
                   "cluster")
    yield Case("optimize-budget-two-tp2-pp2", "gpu-search",
               _optimize("--tp", "2", "--pp", "2", "-M", "2"), "--pp")
    yield Case("optimize-bad-tp-before-batch", "gpu-search",
               ("optimize", "-w", "gpt3-125m", "-c", NODE, "--tp", "x", "--json"), "--tp")
    yield Case("optimize-budget-over-cluster", "gpu-search", _optimize("-M", "16"), "--machines")
    yield Case("optimize-budget-zero", "gpu-search", _optimize("-M", "0"), "--machines")


# -- GPU node presets as NAME:NODES --------------------------------------------------------------

BAD_NODES = {"zero": ("0", "cluster.nodes"), "negative": ("-1", "cluster.nodes"),
             "huge": ("10000000", "cluster.nodes"), "float": ("1.5", "cluster"),
             "empty": ("", "cluster"), "text": ("many", "cluster")}


def preset_cases() -> Iterator[Case]:
    for preset in PRESETS:
        for label, (count, field) in BAD_NODES.items():
            yield Case(f"{preset}-{label}", "gpu-presets",
                       _predict("--tp", "1", cluster=f"{preset}:{count}"), field)
        yield Case(f"{preset}-batch-over-epoch", "gpu-presets",
                   _predict("--global-batch", "128", workload=GPT_FEW,
                            cluster=f"{preset}:1"), "--global-batch")
        yield Case(f"{preset}-optimize-batch-over-epoch", "gpu-presets",
                   _optimize(workload=GPT_FEW, cluster=f"{preset}:1", batch="1024"),
                   "--global-batch")
    yield Case("missing-name", "gpu-presets", _predict("--tp", "1", cluster=":8"), "cluster")
    yield Case("two-colons", "gpu-presets", _predict("--tp", "1", cluster="dgx-h100:1:2"),
               "cluster")
    yield Case("unknown-node", "gpu-presets", _predict("--tp", "1", cluster="dgx-z900:1"),
               "cluster")
    yield Case("optimize-zero-nodes", "gpu-presets", _optimize(cluster="dgx-h100:0"),
               "cluster.nodes")
    yield Case("v100-bf16", "gpu-presets", _predict("--precision", "bf16",
                                                    cluster="dgx-v100:1"), "--precision")
    yield Case("v100-optimize-default-bf16", "gpu-presets", _optimize(cluster="dgx-v100:1"),
               "precision")
    yield Case("ps-on-gpu", "gpu-presets", _predict("-P", "1", "-R", "2", "-S", "1"),
               "--partitions")  # Adam's flags chose the PS: the first one typed is named
    yield Case("ps-modes-on-gpu", "gpu-presets",
               ("optimize", "-w", "adam-mnist", "-c", NODE, "--modes", "ps-async,ps-sync",
                "--json"), "--modes")


# -- answers that would be absurd ----------------------------------------------------------------

SLOW_CLUSTER = nested("machine.flops_per_core", "1FLOP/s",
                      nested("machine.memory_bandwidth", "1B/s", CLUSTER))
"""A cluster whose cores do 1 FLOP/s: any real workload's epoch takes beyond MAX_SECONDS."""


def absurd_cases() -> Iterator[Case]:
    yield Case("issue-step-of-489m-days", "absurd-answers",
               _predict("--dp", "8", "--global-batch", "9007199254740992",
                        workload="gpt3-125m"), "--global-batch")
    yield Case("issue-optimize-2e52", "absurd-answers",
               _optimize(workload="gpt3-125m", batch="4503599627370496"), "--global-batch")
    for batch in ("65", "128", "6400", str(2**53)):
        yield Case(f"batch-{batch}-over-64", "absurd-answers",
                   _predict("--global-batch", batch, workload=GPT_FEW), "--global-batch")
        yield Case(f"optimize-batch-{batch}-over-64", "absurd-answers",
                   _optimize(workload=GPT_FEW, batch=batch), "--global-batch")
    yield Case("batch-over-epoch-dp", "absurd-answers",
               _predict("--dp", "8", "--global-batch", "128", workload=GPT_FEW),
               "--global-batch")
    yield Case("batch-over-epoch-micro-batches", "absurd-answers",
               _predict("--micro-batch", "2", "--global-batch", "66", workload=GPT_FEW),
               "--global-batch")
    yield Case("plan-file-batch-over-epoch", "absurd-answers",
               _predict("--config", "{d}/plan.yaml", workload=GPT_FEW), "plan.global_batch",
               {"plan.yaml": dump({"dp": 1, "global_batch": 100})})
    yield Case("hf-samples-over-epoch", "absurd-answers",
               _predict("--global-batch", "16", workload="hf:{d}/m/config.json:samples=8"),
               "--global-batch", {"m/config.json": json.dumps(GPT2)})
    slow = {"c.yaml": dump(SLOW_CLUSTER)}
    yield Case("epoch-beyond-max-seconds", "absurd-answers",
               ("predict", "-w", "alexnet", "-c", "{d}/c.yaml", "-P", "1", "-R", "1", "-S",
                "1", "--json"), "predict", slow)
    yield Case("optimize-epoch-beyond-max-seconds", "absurd-answers",
               ("optimize", "-w", "alexnet", "-c", "{d}/c.yaml", "-M", "4", "--json"),
               "optimize", slow)


# -- hf: config.json fields of every type --------------------------------------------------------

GPT2 = {"model_type": "gpt2", "n_ctx": 64, "n_embd": 64, "n_head": 4, "n_layer": 2,
        "n_positions": 64, "vocab_size": 100}
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "num_hidden_layers": 2,
         "vocab_size": 100, "max_position_embeddings": 64}
BERT = {"model_type": "bert", "hidden_size": 64, "num_attention_heads": 4,
        "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 100,
        "max_position_embeddings": 64, "type_vocab_size": 2}
BAD_COUNTS: dict[str, Any] = {"bool": True, "float": 2.0, "text": "4", "negative": -4,
                              "zero": 0, "huge": 10**30, "list": [4], "mapping": {"n": 4}}
COUNT_KEYS = {"gpt2": ("n_embd", "n_head", "n_layer", "n_positions", "n_ctx", "vocab_size",
                       "n_inner"),
              "llama": ("hidden_size", "num_attention_heads", "num_key_value_heads",
                        "intermediate_size", "num_hidden_layers", "max_position_embeddings",
                        "head_dim"),
              "bert": ("type_vocab_size",)}
FAMILY = {"gpt2": GPT2, "llama": LLAMA, "bert": BERT}
NON_COUNTS: dict[str, tuple[str, Any]] = {
    # name: (key, value), each read as a model_type, a flag, a dropout or an MoE count
    "model-type-list": ("model_type", ["llama"]),
    "model-type-mapping": ("model_type", {"name": "llama"}),
    "model-type-number": ("model_type", 7),
    "model-type-bool": ("model_type", True),
    "tie-string": ("tie_word_embeddings", "false"),
    "tie-number": ("tie_word_embeddings", 0),
    "tie-null": ("tie_word_embeddings", None),
    "tie-list": ("tie_word_embeddings", [True]),
    "dropout-text": ("attn_pdrop", "0.1"),
    "dropout-negative": ("resid_pdrop", -0.1),
    "dropout-bool": ("embd_pdrop", False),
    "dropout-list": ("attn_pdrop", [0.1]),
    "moe-experts": ("num_local_experts", 8),
    "moe-text": ("num_experts", "8"),
    "moe-list": ("n_routed_experts", [8]),
    "moe-bool": ("num_local_experts", True),
}


def hf_cases() -> Iterator[Case]:
    for family, keys in COUNT_KEYS.items():
        for key in keys:
            for label, value in BAD_COUNTS.items():
                if key in ("n_layer", "n_embd") and label == "huge":
                    continue  # fuzz_cases.py's transformer-inputs has these
                config = {**FAMILY[family], key: value}
                yield Case(f"{family}-{key}-{label}", "hf-config-fields",
                           ("describe", "--hf-config", "{d}/m/config.json", "--json"),
                           f"hf_config.{key}", {"m/config.json": json.dumps(config)})
    for name, (key, value) in NON_COUNTS.items():
        config = {**GPT2, key: value}
        files: dict[str, "str | bytes | None"] = {"m/config.json": json.dumps(config)}
        yield Case(f"{name}-describe", "hf-config-fields",
                   ("describe", "--hf-config", "{d}/m/config.json", "--json"),
                   f"hf_config.{key}", files)
        yield Case(f"{name}-predict-gpu", "hf-config-fields",
                   _predict("--tp", "1", workload="hf:{d}/m/config.json"), f"hf_config.{key}",
                   files)
        yield Case(f"{name}-optimize-gpu", "hf-config-fields",
                   _optimize(workload="hf:{d}/m/config.json"), f"hf_config.{key}", files)
    for key in ("attention_bias", "mlp_bias"):
        yield Case(f"llama-{key}-string", "hf-config-fields",
                   ("describe", "--hf-config", "{d}/m/config.json", "--json"),
                   f"hf_config.{key}", {"m/config.json": json.dumps({**LLAMA, key: "true"})})
    yield Case("model-type-list-run-gpu", "hf-config-fields",
               ("run", "-w", "hf:{d}/m/config.json", "--gpu", "--global-batch", "8", "--json"),
               "hf_config.model_type",
               {"m/config.json": json.dumps({**GPT2, "model_type": ["gpt2"]})})
    yield Case("head-dim-mismatch", "hf-config-fields",
               ("describe", "--hf-config", "{d}/m/config.json", "--json"), "hf_config.head_dim",
               {"m/config.json": json.dumps({**LLAMA, "head_dim": 32})})
    yield Case("kv-heads-not-dividing", "hf-config-fields",
               ("describe", "--hf-config", "{d}/m/config.json", "--json"),
               "hf_config.num_key_value_heads",
               {"m/config.json": json.dumps({**LLAMA, "num_key_value_heads": 3})})
    yield Case("nan-literal", "hf-config-fields",
               ("describe", "--hf-config", "{d}/m/config.json", "--json"), "--hf-config",
               {"m/config.json": json.dumps(GPT2)[:-1] + ', "n_inner": NaN}'})


# -- plan files ----------------------------------------------------------------------------------

BAD_PLAN_FIELDS: dict[str, tuple[str, Any]] = {
    "tp-text": ("tp", "2"), "tp-bool": ("tp", True), "tp-float": ("tp", 1.5),
    "tp-zero": ("tp", 0), "tp-huge": ("tp", 10**30), "tp-list": ("tp", [2]),
    "pp-negative": ("pp", -1), "dp-mapping": ("dp", {"n": 2}),
    "micro-batch-zero": ("micro_batch", 0), "global-batch-float": ("global_batch", 8.0),
    "global-batch-huge": ("global_batch", 2**60), "schedule-list": ("schedule", ["1f1b"]),
    "schedule-unknown": ("schedule", "zb-h1"), "virtual-stages-huge": ("virtual_stages", 10**6),
    "zero-four": ("zero", 4), "zero-text": ("zero", "1"), "recompute-bool": ("recompute", True),
    "precision-number": ("precision", 16), "sequence-parallel-text":
        ("sequence_parallel", "false"), "overlap-dp-number": ("overlap_dp", 1),
    "grad-bytes-three": ("grad_bytes", 3), "grad-bytes-bool": ("grad_bytes", True),
    "adam-field-mixed": ("replicas", 2), "unknown-field": ("experts", 8),
}


def plan_file_cases() -> Iterator[Case]:
    for name, (key, value) in BAD_PLAN_FIELDS.items():
        plan = {"tp": 1, "dp": 1, "global_batch": 8, key: value}
        yield Case(name, "plan-files", _predict("--config", "{d}/plan.yaml"), f"plan.{key}",
                   {"plan.yaml": dump(plan)})
    yield Case("only-sequence-parallel-text", "plan-files", _predict("--config", "{d}/plan.yaml"),
               "plan.sequence_parallel", {"plan.yaml": "sequence_parallel: 'no'\n"})
    yield Case("plan-rules-from-file", "plan-files", _predict("--config", "{d}/plan.yaml"),
               "plan.schedule", {"plan.yaml": dump({"pp": 1, "schedule": "interleaved",
                                                    "virtual_stages": 2, "global_batch": 8})})
    yield Case("flag-over-file-named-as-typed", "plan-files",
               _predict("--config", "{d}/plan.yaml", "--tp", "3"), "--tp",
               {"plan.yaml": dump({"dp": 1, "global_batch": 8})})


# -- cluster files: booleans and names -----------------------------------------------------------

CLUSTER_TEXT: dict[str, tuple[str, Any, str]] = {
    "calibrated-string-false": ("calibrated", "false", "cluster.calibrated"),
    "calibrated-string-yes": ("calibrated", "yes", "cluster.calibrated"),
    "calibrated-number": ("calibrated", 1, "cluster.calibrated"),
    "calibrated-null": ("calibrated", None, "cluster.calibrated"),
    "calibrated-list": ("calibrated", [True], "cluster.calibrated"),
    "name-list": ("name", ["a"], "cluster.name"),
    "name-mapping": ("name", {"a": 1}, "cluster.name"),
    "description-mapping": ("description", {"a": 1}, "cluster.description"),
}


def cluster_file_cases() -> Iterator[Case]:
    for name, (key, value, field) in CLUSTER_TEXT.items():
        files: dict[str, "str | bytes | None"] = {"c.yaml": dump({**CLUSTER, key: value})}
        yield Case(name, "cluster-files",
                   ("predict", "-w", "adam-mnist", "-c", "{d}/c.yaml", "-P", "1", "-R", "1",
                    "-S", "1", "--json"), field, files)
        yield Case(f"{name}-optimize", "cluster-files",
                   ("optimize", "-w", "adam-mnist", "-c", "{d}/c.yaml", "--json"), field, files)


# -- report --validation on results files ---------------------------------------------------------

ROW = {"id": "c01", "label": "P=1 R=2", "machines": 3, "config": {"sync": "ps-async"},
       "measured": {"throughput_samples_per_s": 10.0},
       "predicted_throughput_samples_per_s": 11.0, "relative_error": 0.1}
BAD_ROWS: dict[str, tuple[str, dict[str, Any]]] = {
    "machines-missing": ("machines", {k: v for k, v in ROW.items() if k != "machines"}),
    "machines-text": ("machines", {**ROW, "machines": "3"}),
    "label-number": ("label", {**ROW, "label": 7}),
    "throughput-text": ("measured.throughput_samples_per_s",
                        {**ROW, "measured": {"throughput_samples_per_s": "10"}}),
    "measured-list": ("measured", {**ROW, "measured": [10]}),
    "predicted-bool": ("predicted_throughput_samples_per_s",
                       {**ROW, "predicted_throughput_samples_per_s": True}),
    "relative-error-text": ("relative_error", {**ROW, "relative_error": "10 %"}),
    "sync-missing": ("config.sync", {**ROW, "config": {}}),
    "bottleneck-list": ("predicted_bottleneck", {**ROW, "predicted_bottleneck": ["ps"]}),
}


def validation_cases() -> Iterator[Case]:
    for name, (field, row) in BAD_ROWS.items():
        text = json.dumps({"rows": [row], "summary": {}})
        yield Case(name, "validation-results",
                   ("report", "--validation", "{d}/v", "-o", "{d}/r.html"),
                   f"--validation: rows[0].{field}", {"v/results.json": text})
    yield Case("summary-text", "validation-results",
               ("report", "--validation", "{d}/v", "-o", "{d}/r.html"),
               "--validation: summary.median_relative_error",
               {"v/results.json": json.dumps({"rows": [ROW],
                                              "summary": {"median_relative_error": "5 %"}})})


def cases() -> Iterator[Case]:
    for generate in (flag_cases, restriction_cases, preset_cases, absurd_cases, hf_cases,
                     plan_file_cases, cluster_file_cases, validation_cases):
        yield from generate()
