"""Instant answers (issue 24): the wall time of `predict` and of the one search, on this machine.

    .venv/bin/python benchmarks/speed.py     # writes results/speed.md and results/speed.json

Four figures, each a median over repeats measured in this one run, with the load average
before and after (a run on a busy machine is not a measurement: the script says so and exits 1
when the 1-minute load average before it exceeds MAX_LOAD):

- `predict` of GPT-3 175B (TP8 PP8 DP8 on 64 DGX A100 nodes) as a whole process,
  `python -c "import dnnscale; dnnscale.predict(...)"`, minus a bare `python -c pass`
  (interpreter start): target < 0.25 s;
- the search of GPT-3 175B at global batch 1536 on 512 and on 4,096 A100s through
  `dnnscale.optimize` (the one entry point, in-process, workload and system loaded once, after
  a warm-up call on another budget so imports are not counted): the best plan and the top 5,
  as issue 14's figure measured it (curve=False): targets < 0.5 s and < 1 s;
- Adam's search of adam-imagenet22k on adam-2014 sized to M = 10,000 machines, the same way:
  target < 0.3 s.
The same three searches with the scalability curve (curve=True, the CLI's default) are
reported beside them, without a target.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LOAD = 1.5
PROCESS_RUNS = 10
SEARCH_RUNS = 5
PREDICT_CODE = ("import dnnscale; dnnscale.predict('gpt3-175b', 'dgx-a100-80g:64', "
                "{'tp': 8, 'pp': 8, 'dp': 8, 'micro_batch': 1, 'global_batch': 1536})")
TARGETS_S = {"predict_gpt3_175b_above_bare_python": 0.25, "search_gpt3_175b_512_gpus": 0.5,
             "search_gpt3_175b_4096_gpus": 1.0, "search_adam_10000_machines": 0.3}


def _process_s(code: str) -> list[float]:
    out = []
    for _ in range(PROCESS_RUNS):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        out.append(time.perf_counter() - start)
    return out


def _search_s(call) -> list[float]:  # noqa: ANN001
    out = []
    for _ in range(SEARCH_RUNS):
        start = time.perf_counter()
        call()
        out.append(time.perf_counter() - start)
    return out


def main() -> int:
    load_before = os.getloadavg()
    if load_before[0] > MAX_LOAD:
        print(f"load average {load_before[0]:.2f} > {MAX_LOAD}: the machine is busy, not "
              "measuring", file=sys.stderr)
        return 1
    import dnnscale
    from dnnscale.system import load_system
    from dnnscale.workload import load_workload

    bare = _process_s("pass")
    predict = _process_s(PREDICT_CODE)
    gpt = load_workload("gpt3-175b")
    dgx512, dgx4096 = load_system("dgx-a100-80g:64"), load_system("dgx-a100-80g:512")
    adam = load_system("adam-2014").with_machines(10_000)
    imagenet = load_workload("adam-imagenet22k")
    dnnscale.optimize(gpt, "dgx-a100-80g:16", global_batch=1536, curve=False)  # warm-up
    dnnscale.optimize(imagenet, adam, machines=100, curve=False)
    curves = {}
    for curve in (False, True):
        curves[curve] = (
            _search_s(lambda: dnnscale.optimize(gpt, dgx512, global_batch=1536, curve=curve)),
            _search_s(lambda: dnnscale.optimize(gpt, dgx4096, global_batch=1536, curve=curve)),
            _search_s(lambda: dnnscale.optimize(imagenet, adam, machines=10_000, curve=curve)))
    gpu512, gpu4096, adam10k = curves[False]
    with_curve = {name: statistics.median(times) for name, times in zip(
        ("search_gpt3_175b_512_gpus", "search_gpt3_175b_4096_gpus",
         "search_adam_10000_machines"), curves[True])}
    load_after = os.getloadavg()
    medians = {
        "predict_gpt3_175b_above_bare_python": statistics.median(predict)
        - statistics.median(bare),
        "search_gpt3_175b_512_gpus": statistics.median(gpu512),
        "search_gpt3_175b_4096_gpus": statistics.median(gpu4096),
        "search_adam_10000_machines": statistics.median(adam10k),
    }
    raw = {"bare_python_s": bare, "predict_process_s": predict, "search_512_s": gpu512,
           "search_4096_s": gpu4096, "search_adam_10000_s": adam10k}
    when = datetime.now(timezone.utc)
    machine = f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores)"
    summary = {"date_utc": when.isoformat(timespec="seconds"), "machine": machine,
               "python": platform.python_version(), "load_average_before": load_before,
               "load_average_after": load_after, "medians_s": medians, "targets_s": TARGETS_S,
               "met": {k: medians[k] < TARGETS_S[k] for k in TARGETS_S},
               "with_curve_medians_s": with_curve, "raw_s": raw}
    (ROOT / "results" / "speed.json").write_text(json.dumps(summary, indent=2) + "\n")
    rows = "\n".join(f"| {name} | {medians[name]:.3f} s | < {TARGETS_S[name]} s | "
                     f"{'met' if medians[name] < TARGETS_S[name] else '**missed**'} |"
                     for name in TARGETS_S)
    text = (f"# Instant answers: predict and search wall time\n\n"
            f"Machine: {machine}, Python {platform.python_version()}; "
            f"date {when:%Y-%m-%d %H:%M} UTC; load average before "
            f"{', '.join(f'{v:.2f}' for v in load_before)}, after "
            f"{', '.join(f'{v:.2f}' for v in load_after)} (nothing else running).\n\n"
            f"| figure | median | target | |\n|---|---|---|---|\n{rows}\n\n"
            f"- predict: a whole process `python -c \"{PREDICT_CODE}\"`, median of "
            f"{PROCESS_RUNS} = {statistics.median(predict):.3f} s, minus a bare `python -c pass`"
            f" (median {statistics.median(bare):.3f} s).\n"
            f"- searches: `dnnscale.optimize(...)` in-process after a warm-up call, median of "
            f"{SEARCH_RUNS} (min {min(gpu512):.3f} / {min(gpu4096):.3f} / {min(adam10k):.3f} s)."
            f"\n- with the scalability curve (curve=True): "
            + ", ".join(f"{k} {v:.3f} s" for k, v in with_curve.items()) +
            f"\n\nProduced by `.venv/bin/python benchmarks/speed.py` (raw times in "
            f"results/speed.json).\n")
    (ROOT / "results" / "speed.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
