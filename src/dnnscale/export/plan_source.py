"""The plan `export` hands on, read from a plan file or from a command's JSON.

Three inputs are accepted (docs/export.md):

- a plan YAML (or JSON) of the GPU plan fields (plan/modern.py: tp, pp, dp, micro_batch, ...),
  which may also name its workload (``workload: gpt3-175b``; a key only `export` reads);
- the JSON `optimize --json` prints: ``best.plan_fields`` (the plan fields) when present, else
  ``best.prediction.plan`` (`ParallelPlan.to_dict()`), and the top-level ``workload``;
- the JSON `predict --json` prints: its ``plan`` (`ParallelPlan.to_dict()`); no workload name.

Whatever the input, the plan goes through `modern_plan_from_dict`, so it obeys the same rules
as a plan given to `predict`. Errors are one-line `InputError`s naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dnnscale.errors import MAX_COUNT, InputError, require_int, short_repr
from dnnscale.plan.flags import WORKLOAD_KEY, workload_name
from dnnscale.plan.modern import MODERN_FIELDS, modern_plan_from_dict
from dnnscale.plan.plan import USERBUFFERS, ParallelPlan


@dataclass(frozen=True)
class PlanSource:
    """A validated plan and the workload its file names (None when it names none)."""

    plan: ParallelPlan
    workload: str | None
    origin: str
    """What the plan came from: 'plan file', 'optimize JSON' or 'predict JSON'."""


def read_plan_source(path: "str | Path", field: str = "plan") -> PlanSource:
    """Read the plan at `path` (see the module docstring); errors name `field`."""
    data = _read_mapping(Path(path), field)
    if "best" in data:
        return _from_optimize(data, field)
    if "plan" in data and isinstance(data.get("plan"), dict) and "config" in data:
        return PlanSource(_from_plan_dict(data["plan"], f"{field}.plan"), None, "predict JSON")
    return _from_plan_file(data, field)


def _read_mapping(path: Path, field: str) -> dict[str, Any]:
    """The file's top-level mapping: strict JSON when it starts with '{', else safe YAML."""
    from dnnscale.safe_yaml import load_yaml_text, read_limited

    text = read_limited(path, field)
    shown = short_repr(str(path))
    if text.lstrip().startswith("{"):
        data = _strict_json(text, field, shown)
    else:
        data = load_yaml_text(text, field, shown)
    if not isinstance(data, dict):
        raise InputError(field, f"{shown} must hold a mapping of plan fields (or the JSON of "
                         f"optimize --json), got {type(data).__name__}")
    return data


def _strict_json(text: str, field: str, shown: str) -> Any:
    """JSON as the standard defines it (no NaN or Infinity), one-line errors."""
    def refuse(constant: str) -> None:
        raise InputError(field, f"{shown} holds {constant}, which is not JSON")

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise InputError(field, f"{shown} gives the key {short_repr(key)} twice")
            out[key] = value
        return out

    try:
        return json.loads(text, parse_constant=refuse, object_pairs_hook=unique)
    except InputError:
        raise
    except json.JSONDecodeError as exc:
        raise InputError(field, f"{shown} is not JSON: {exc.msg} at line {exc.lineno}") \
            from None
    except RecursionError:
        raise InputError(field, f"{shown} nests too deeply") from None
    except ValueError:  # an integer of more digits than Python converts (4,300)
        raise InputError(field, f"{shown} holds an integer too long to be a plan value") \
            from None


def _from_plan_file(data: dict[str, Any], field: str) -> PlanSource:
    workload = workload_name(data, f"{field}.{WORKLOAD_KEY}")
    fields = {k: v for k, v in data.items() if k != WORKLOAD_KEY}
    if not any(key in fields for key in MODERN_FIELDS):
        raise InputError(field, f"holds no GPU plan fields (expected some of "
                         f"{', '.join(MODERN_FIELDS)}; Project Adam's plans have no engine to "
                         f"export to)")
    return PlanSource(modern_plan_from_dict(fields, field), workload, "plan file")


def _from_optimize(data: dict[str, Any], field: str) -> PlanSource:
    best = data["best"]
    if not isinstance(best, dict):
        raise InputError(f"{field}.best", f"must be a mapping (the best plan of optimize "
                         f"--json), got {short_repr(best)}")
    workload = workload_name(data, f"{field}.{WORKLOAD_KEY}")
    fields = best.get("plan_fields")
    if fields is not None:
        if not isinstance(fields, dict):
            raise InputError(f"{field}.best.plan_fields", f"must be a mapping of plan fields, "
                             f"got {short_repr(fields)}")
        return PlanSource(modern_plan_from_dict(fields, f"{field}.best.plan_fields"), workload,
                          "optimize JSON")
    prediction = best.get("prediction")
    plan = prediction.get("plan") if isinstance(prediction, dict) else None
    if not isinstance(plan, dict):
        raise InputError(f"{field}.best", "has neither plan_fields nor prediction.plan (is "
                         "this the JSON of optimize --json for a GPU cluster?)")
    return PlanSource(_from_plan_dict(plan, f"{field}.best.prediction.plan"), workload,
                      "optimize JSON")


def _section(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = data.get(key)
    if not isinstance(value, dict):
        raise InputError(f"{where}.{key}", f"must be a mapping, got {short_repr(value)}")
    return value


PLAN_DICT_PATHS = {
    "tp": "tensor.degree", "pp": "pipeline.stages", "dp": "data.replicas",
    "micro_batch": "batch.micro_batch", "global_batch": "batch.accumulation",
    "schedule": "pipeline.schedule", "virtual_stages": "pipeline.virtual_stages",
    "zero": "data.aggregation.zero_stage", "recompute": "memory.recompute",
    "precision": "precision.compute", "sequence_parallel": "tensor.sequence_parallel",
    "overlap_dp": "data.aggregation.overlap", "grad_bytes": "precision.grad_bytes",
    "ep": "expert.degree", "expert_imbalance": "expert.imbalance", "cp": "context.degree",
    "cp_algorithm": "context.algorithm", "etp": "expert.tensor", "loss": "memory.loss",
    "overlap_tp": "tensor.overlap", "overlap_pp": "pipeline.overlap_p2p",
    "zero3_fetch": "data.aggregation.fetch", "grad_accumulation": "batch.grad_accumulation",
    "amp": "precision.amp", "overlap_tp_method": "tensor.overlap_method",
    "pp_scatter_gather": "pipeline.scatter_gather"}
"""Plan field -> where `ParallelPlan.to_dict()` holds it (global_batch: micro · accumulation ·
replicas · ep), so that an error names the key the file has."""


def _from_plan_dict(plan: dict[str, Any], where: str) -> ParallelPlan:
    """A `ParallelPlan.to_dict()` mapping back to the plan fields, then validated; a value the
    plan fields cannot express (another algorithm, other byte widths, another optimizer) is
    refused rather than dropped."""
    tensor = _section(plan, "tensor", where)
    pipeline = _section(plan, "pipeline", where)
    data = _section(plan, "data", where)
    aggregation = _section(data, "aggregation", f"{where}.data")
    batch = _section(plan, "batch", where)
    memory = _section(plan, "memory", where)
    precision = _section(plan, "precision", where)
    # expert and context parallelism: absent from the JSON of versions before them (ep = cp = 1)
    expert = _section(plan, "expert", where) if "expert" in plan else {}
    context = _section(plan, "context", where) if "context" in plan else {}
    kind = aggregation.get("kind")
    if kind != "Collective":
        raise InputError(f"{where}.data.aggregation.kind", f"{short_repr(kind)}: a "
                         f"parameter-server plan (Project Adam) has no engine to export to")
    if tensor.get("rules") != "megatron":
        raise InputError(f"{where}.tensor.rules", f"{short_repr(tensor.get('rules'))}: only "
                         f"Megatron-style tensor splits have an engine to export to")
    micro, accumulation, replicas, ep = (batch.get("micro_batch"), batch.get("accumulation"),
                                         data.get("replicas"), expert.get("degree", 1))
    counts = {"batch.micro_batch": micro, "batch.accumulation": accumulation,
              "data.replicas": replicas, "expert.degree": ep}
    for name, value in counts.items():
        require_int(f"{where}.{name}", value, maximum=MAX_COUNT)
    fields = {"tp": tensor.get("degree"), "pp": pipeline.get("stages"), "dp": replicas,
              "micro_batch": micro, "global_batch": micro * accumulation * replicas * ep,
              "schedule": pipeline.get("schedule"),
              "virtual_stages": pipeline.get("virtual_stages"),
              "zero": aggregation.get("zero_stage"), "recompute": memory.get("recompute"),
              "loss": memory.get("loss", "inplace"),
              "overlap_tp": tensor.get("overlap", False),
              "overlap_tp_method": tensor.get("overlap_method", USERBUFFERS),
              "overlap_pp": pipeline.get("overlap_p2p"),
              "pp_scatter_gather": pipeline.get("scatter_gather", False),
              "zero3_fetch": aggregation.get("fetch", "blocks"),
              "grad_accumulation": batch.get("grad_accumulation", "fused"),
              "precision": precision.get("compute"), "amp": precision.get("amp", "half"),
              "sequence_parallel": tensor.get("sequence_parallel"),
              "overlap_dp": aggregation.get("overlap"), "grad_bytes": precision.get("grad_bytes"),
              "ep": ep, "expert_imbalance": expert.get("imbalance", 1.0),
              "cp": context.get("degree", 1), "cp_algorithm": context.get("algorithm", "ring"),
              "etp": expert.get("tensor")}
    try:
        result = modern_plan_from_dict(fields, where)
    except InputError as exc:
        name = exc.field.removeprefix(f"{where}.")
        raise InputError(f"{where}.{PLAN_DICT_PATHS[name]}" if name in PLAN_DICT_PATHS
                         else exc.field, exc.problem) from None
    _refuse_dropped(plan, result.to_dict(), where)
    return result


def _refuse_dropped(given: dict[str, Any], rebuilt: dict[str, Any], where: str) -> None:
    """Every key the file gives must read back as the plan fields rebuild it: an all-reduce
    algorithm, byte widths or an optimizer the fields do not carry would otherwise be exported
    as something else without a word."""
    for key, value in given.items():
        if key not in rebuilt:
            raise InputError(f"{where}.{key}", "not a key of a GPU plan (predict --json's plan)")
        if isinstance(value, dict) and isinstance(rebuilt[key], dict):
            _refuse_dropped(value, rebuilt[key], f"{where}.{key}")
        elif value != rebuilt[key] or isinstance(value, bool) != isinstance(rebuilt[key], bool):
            raise InputError(f"{where}.{key}", f"{short_repr(value)} differs from what the plan "
                             f"fields give ({short_repr(rebuilt[key])}); the export carries only "
                             f"the plan fields ({', '.join(MODERN_FIELDS)})")
