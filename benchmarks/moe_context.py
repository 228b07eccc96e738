"""Score the model's expert (ep) and context (cp) parallelism on public measurements.

    .venv/bin/python benchmarks/moe_context.py      # about a second; writes results/moe_context/

Each row of benchmarks/data/moe_context_measurements.yaml (its README says where every figure
comes from and what had to be assumed) is a workload, a cluster preset and a Megatron-style
plan. The model predicts its step; the published figure is converted, by the source's own
FLOP count where it prints TFLOP/s, to tokens per second per GPU, and so to the step time of
the row's global batch. Compared: tokens/s per GPU, predicted over measured (below 1: the
model is too slow, i.e. its step too long), and the relative error |predicted - measured| /
measured. A held-out style check: nothing here is fitted or tuned to these rows, and every
prediction uses the presets as committed; rows the model refuses are listed with the reason.

Roles: `moe` (ep >= 2) and `context` (cp >= 2) rows make the headline; `control` rows are
the cp = 1 rows of the same tables, to tell the cp rows' error from the source's base error;
`dense` rows (ep = cp = 1) are the same source's other tables, dense plans and memory
readings beside them.

Where a source also published the peak memory a GPU held (`measured_memory_gib`: torchtitan's
tables), the model's memory of its fullest device is compared with it too (`memory` in the
summary), a check of the memory model as the steps are of the time model.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

DATA = ROOT / "benchmarks" / "data" / "moe_context_measurements.yaml"
OUT = ROOT / "results" / "moe_context"
ROLES = ("moe", "context", "control", "dense")
CONSISTENCY = 0.01
"""Relative gap allowed between the prediction's own tokens_per_s and global batch x seq /
step_time_s before a row is flagged (both come from the same prediction)."""
GIB = 2**30
"""Bytes in a GiB, the unit torchtitan reports its memory in (metrics.py _to_gib)."""


# --- the published figure as tokens per second per GPU ------------------------------------

def megatron_flops_per_token(f: dict[str, Any]) -> float:
    """Megatron-LM's num_floating_point_operations for one token (training.py, the commit the
    row cites): 12 L h^2 [(1 + g/a + s/h)(q/h) + (f/h) k m + (shared/h) m + V/(2 L h)], m = 3/2
    for SwiGLU, q = kv_channels * heads; full attention, no router, no recomputation."""
    layers, hidden, heads = f["layers"], f["hidden"], f["heads"]
    gated = 1.5 if f.get("swiglu") else 1.0
    q_ratio = f["kv_channels"] * heads / hidden
    attention = (1 + f["kv_heads"] / heads + f["seq"] / hidden) * q_ratio
    mlp = f["ffn"] / hidden * f.get("top_k", 1) * gated
    shared = f.get("shared_ffn", 0) / hidden * gated
    logit = f["padded_vocab"] / (2 * layers * hidden)
    return 12 * layers * hidden * hidden * (attention + mlp + shared + logit)


def palm_flops_per_token(c: dict[str, Any], seq: int) -> float:
    """PaLM's model FLOPs per token (Chowdhery et al. 2022, App. B): 6 N + 12 L H Q T, H Q = h."""
    return 6 * float(c["n_params"]) + 12 * c["layers"] * c["hidden"] * seq


def measured_tokens_per_gpu_s(row: dict[str, Any]) -> float:
    """The row's published figure converted to tokens/s per GPU (`conversion.kind`)."""
    conversion, value = row["conversion"], float(row["measured"]["value"])
    kind = conversion["kind"]
    if kind == "tokens_per_s_per_gpu":
        return value
    if kind == "megatron_flops":
        return value * 1e12 / megatron_flops_per_token(conversion["flops"])
    if kind == "palm_tflops":
        return value * 1e12 / palm_flops_per_token(conversion, row["seq"])
    if kind == "gpu_hours_per_tokens":
        return float(conversion["tokens"]) / (value * 3600)
    raise ValueError(f"{row['id']}: unknown conversion kind {kind!r}")


# --- one row ---------------------------------------------------------------------------------

def check_row(row: dict[str, Any]) -> None:
    """The row's own arithmetic: devices = tp pp dp ep cp, the cluster's GPUs, the batch."""
    from dnnscale.system.gpu import parse_gpu_cluster, preset_devices_per_node

    plan, rid = row["plan"], row["id"]
    degrees = [int(plan.get(k, 1)) for k in ("tp", "pp", "dp", "ep", "cp")]
    if math.prod(degrees) != row["devices"]:
        raise ValueError(f"{rid}: tp*pp*dp*ep*cp = {math.prod(degrees)}, devices "
                         f"{row['devices']}")
    parsed = parse_gpu_cluster(row["cluster"])
    if parsed is None or parsed[1] * preset_devices_per_node(parsed[0]) != row["devices"]:
        raise ValueError(f"{rid}: cluster {row['cluster']} does not hold {row['devices']} GPUs")
    lanes = int(plan.get("dp", 1)) * int(plan.get("ep", 1)) * int(plan.get("micro_batch", 1))
    if plan["global_batch"] % lanes:
        raise ValueError(f"{rid}: global_batch {plan['global_batch']} is not a multiple of "
                         f"dp*ep*micro_batch = {lanes}")
    memory = row.get("measured_memory_gib")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, (int, float))
                               or not 0 < memory < 10_000):
        raise ValueError(f"{rid}: measured_memory_gib must be a number of GiB, got {memory!r}")
    role = row["role"]
    if role not in ROLES:
        raise ValueError(f"{rid}: role {role!r} (known: {', '.join(ROLES)})")
    if role == "moe" and plan.get("ep", 1) < 2 or role == "context" and plan.get("cp", 1) < 2:
        raise ValueError(f"{rid}: a {role} row needs {'ep' if role == 'moe' else 'cp'} >= 2")
    if role == "dense" and (plan.get("ep", 1) > 1 or plan.get("cp", 1) > 1):
        raise ValueError(f"{rid}: a dense row has ep = cp = 1")


def predict_row(row: dict[str, Any]) -> dict[str, Any]:
    """Measured and predicted figures of one row, or the reason there is no prediction."""
    from dnnscale.errors import InputError
    from dnnscale.model.predict import predict_plan
    from dnnscale.plan.modern import modern_plan_from_dict
    from dnnscale.system.load import load_system
    from dnnscale.workload import load_workload

    check_row(row)
    plan, devices, seq = row["plan"], row["devices"], row["seq"]
    tokens_per_step = plan["global_batch"] * seq
    measured = measured_tokens_per_gpu_s(row)
    out: dict[str, Any] = {
        "id": row["id"], "role": row["role"], "what": row["what"], "model": row["model"],
        "cluster": row["cluster"], "devices": devices, "seq": seq,
        "plan": {k: v for k, v in plan.items()},
        "measured_value": row["measured"]["value"], "measured_unit": row["measured"]["unit"],
        "conversion": row["conversion"]["kind"],
        "measured_tokens_per_gpu_s": measured,
        "measured_step_s": tokens_per_step / (measured * devices),
        "assumed": len(row.get("assumed", [])),
    }
    try:
        workload = load_workload(row["model"])
        shape = workload.transformer
        if shape is None or shape.seq != seq:
            raise InputError("workload", f"{row['model']} has seq "
                             f"{getattr(shape, 'seq', None)}, the row {seq}")
        prediction = predict_plan(workload, load_system(row["cluster"]),
                                  modern_plan_from_dict(plan))
    except InputError as exc:
        out["error"] = str(exc)
        return out
    step = prediction.step_time_s
    predicted = tokens_per_step / (step * devices)
    own = (prediction.tokens_per_s or math.nan) / devices
    predicted_memory = prediction.memory_bytes["worker"] / GIB
    out.update(predicted_memory_gib=predicted_memory,
               capacity_gib=prediction.memory_capacity_bytes["worker"] / GIB)
    if row.get("measured_memory_gib") is not None:
        measured_memory = float(row["measured_memory_gib"])
        out.update(measured_memory_gib=measured_memory,
                   memory_ratio=predicted_memory / measured_memory,
                   memory_relative_error=abs(predicted_memory - measured_memory)
                   / measured_memory)
    out.update(
        predicted_step_s=step, predicted_tokens_per_gpu_s=predicted,
        prediction_tokens_per_gpu_s=own,
        consistent=bool(math.isfinite(own) and abs(own - predicted) <= CONSISTENCY * predicted),
        ratio=predicted / measured, relative_error=abs(predicted - measured) / measured,
        predicted_mfu=prediction.mfu, fits=bool(prediction.fits),
        bottleneck=str(prediction.bottleneck))
    if prediction.error_band is not None and prediction.error_band.key is not None:
        out["regime_key"] = prediction.error_band.key.to_dict()  # benchmarks/error_bands.py
    return out


# --- summary ---------------------------------------------------------------------------------

def block(rows: list[dict[str, Any]], error: str = "relative_error",
          ratio: str = "ratio") -> dict[str, Any]:
    """Median and max relative error and the median ratio of the rows that have them: the
    step's (`relative_error`, `ratio`), or the peak memory's of the rows whose source
    published one (`memory_relative_error`, `memory_ratio`)."""
    scored = [r for r in rows if error in r]
    if not scored:
        return {"rows": 0, "median_relative_error": None, "max_relative_error": None,
                "median_ratio": None}
    return {"rows": len(scored),
            "median_relative_error": statistics.median(r[error] for r in scored),
            "max_relative_error": max(r[error] for r in scored),
            "median_ratio": statistics.median(r[ratio] for r in scored)}


def memory_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The peak-memory table of the rows with a published memory reading."""
    scored = [r for r in rows if "memory_relative_error" in r]
    if not scored:
        return []
    lines = ["Peak memory a GPU, where the source published it (torchtitan: the caching "
             "allocator's peak reserved bytes, the maximum over the GPUs) against the model's "
             "fullest device (its reserve included); capacity is the preset's.", "",
             "| id | measured GiB | predicted GiB | ratio pred/meas | error | preset capacity GiB |",
             "|---|---|---|---|---|---|"]
    for r in scored:
        lines.append(f"| {r['id']} | {r['measured_memory_gib']:.1f} | "
                     f"{r['predicted_memory_gib']:.1f} | {r['memory_ratio']:.2f} | "
                     f"{r['memory_relative_error']:.1%} | {r['capacity_gib']:.1f} |")
    return lines + [""]


def git_head() -> dict[str, Any]:
    """HEAD's commit and whether src/ differs from it (the model under test may be uncommitted)."""
    def run(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                                  timeout=10, check=False).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    return {"commit": run("rev-parse", "HEAD") or None,
            "src_modified": bool(run("status", "--porcelain", "--", "src"))}


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| id | role | what | measured tok/s/GPU | predicted tok/s/GPU | ratio pred/meas | "
             "error | measured step s | predicted step s | fits | bottleneck |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['id']} | {r['role']} | {r['what']} | "
                         f"{r['measured_tokens_per_gpu_s']:,.1f} | not predicted: "
                         f"{r['error']} | | | {r['measured_step_s']:.3g} | | | |")
            continue
        flag = "" if r["consistent"] else " (!)"
        lines.append(
            f"| {r['id']} | {r['role']} | {r['what']} | {r['measured_tokens_per_gpu_s']:,.1f} | "
            f"{r['predicted_tokens_per_gpu_s']:,.1f}{flag} | {r['ratio']:.2f} | "
            f"{r['relative_error']:.1%} | {r['measured_step_s']:.3g} | "
            f"{r['predicted_step_s']:.3g} | {'yes' if r['fits'] else 'no'} | {r['bottleneck']} |")
    return lines


def summary_markdown(summary: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    head = summary["git"]
    lines = [f"# ep / cp against public measurements ({summary['date']})", "",
             f"Machine {summary['machine']}; HEAD {head['commit']}"
             + (" with uncommitted changes under src/" if head["src_modified"] else "")
             + f"; {summary['seconds']} s. Data: `{summary['data']}`. Command: "
             "`.venv/bin/python benchmarks/moe_context.py`.", "",
             "Compared: tokens/s per GPU (ratio < 1: the model is too slow). Nothing fitted.",
             "(!) marks a row whose prediction's own tokens_per_s disagrees with global batch x "
             "seq / step_time_s by more than 1 %.", "",
             "| group | rows | median error | max error | median ratio |",
             "|---|---|---|---|---|"]
    for name, b in summary["groups"].items():
        lines.append(f"| {name} | {b['rows']} | {fmt(b['median_relative_error'], '.1%')} | "
                     f"{fmt(b['max_relative_error'], '.1%')} | {fmt(b['median_ratio'], '.2f')} |")
    memory = summary["memory"]
    if memory["rows"]:
        lines += ["", f"Peak memory: {memory['rows']} rows, median error "
                  f"{fmt(memory['median_relative_error'], '.1%')}, max "
                  f"{fmt(memory['max_relative_error'], '.1%')}, median ratio "
                  f"{fmt(memory['median_ratio'], '.2f')}."]
    lines += ["", *table_lines(rows), "", *memory_lines(rows)]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    started = time.monotonic()
    from dnnscale.errors import InputError
    from dnnscale.yamlio import load_yaml_file

    try:
        data = load_yaml_file(args.data, "moe-context measurements")
        rows = [predict_row(row) for row in data["rows"]]
    except (InputError, KeyError, ValueError, OSError) as exc:
        print(f"error: --data {args.data}: {exc}", file=sys.stderr)
        return 2
    headline = [r for r in rows if r["role"] in ("moe", "context")]
    groups = {"ep / cp rows (moe + context)": block(headline),
              **{role: block([r for r in rows if r["role"] == role]) for role in ROLES}}
    summary: dict[str, Any] = {
        "data": str(args.data.relative_to(ROOT) if args.data.is_relative_to(ROOT) else args.data),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} ({platform.machine()})",
        "git": git_head(),
        "rows_in_data": len(rows),
        "rows_predicted": sum("relative_error" in r for r in rows),
        "groups": groups,
        "memory": block(rows, "memory_relative_error", "memory_ratio"),
        "not_predicted": [{"id": r["id"], "error": r["error"]} for r in rows if "error" in r],
        "inconsistent": [r["id"] for r in rows if "consistent" in r and not r["consistent"]],
        "rows": rows,
        "seconds": round(time.monotonic() - started, 2),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (args.out / "summary.md").write_text(summary_markdown(summary, rows))
    print(f"{'id':28} {'role':8} {'measured':>10} {'predicted':>10} {'ratio':>6} {'error':>7}"
          f"  (tokens/s per GPU)")
    for r in rows:
        if "error" in r:
            print(f"{r['id']:28} {r['role']:8} {r['measured_tokens_per_gpu_s']:10,.1f}   "
                  f"not predicted: {r['error']}")
            continue
        print(f"{r['id']:28} {r['role']:8} {r['measured_tokens_per_gpu_s']:10,.1f} "
              f"{r['predicted_tokens_per_gpu_s']:10,.1f} {r['ratio']:6.2f} "
              f"{r['relative_error']:7.1%}{'' if r['consistent'] else '  (!) tokens_per_s'}")
    for name, b in groups.items():
        print(f"  {name:30} rows {b['rows']:2}  median {fmt(b['median_relative_error'], '6.1%')}"
              f"  max {fmt(b['max_relative_error'], '6.1%')}  median ratio "
              f"{fmt(b['median_ratio'], '.2f')}")
    print(f"wrote {args.out / 'summary.json'} in {summary['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
