"""How fast `dnnscale predict` answers: median wall time of the real command, 10 runs.

    .venv/bin/python benchmarks/cli_latency.py   # writes results/cli_latency.md
"""

from __future__ import annotations

import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

COMMAND = [sys.executable, "-m", "dnnscale.cli", "predict", "-w", "adam-imagenet22k", "-c",
           "adam-2014", "-P", "4", "-R", "8", "-S", "4", "-n", "32", "--json"]
RUNS = 10


def main() -> None:
    seconds = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run(COMMAND, check=True, capture_output=True)
        seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds)
    text = (f"# `dnnscale predict` latency\n\n"
            f"Machine: {platform.node()} ({platform.machine()}, {platform.processor() or 'cpu'}), "
            f"Python {platform.python_version()}; "
            f"date {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.\n\n"
            f"Command: `{' '.join(COMMAND[1:])}` (whole process: interpreter start, imports, "
            f"prediction, JSON).\n\n"
            f"| runs | median | min | max |\n|---|---|---|---|\n"
            f"| {RUNS} | {median * 1000:.0f} ms | {min(seconds) * 1000:.0f} ms | "
            f"{max(seconds) * 1000:.0f} ms |\n\n"
            f"Produced by `.venv/bin/python benchmarks/cli_latency.py`.\n")
    out = Path(__file__).resolve().parents[1] / "results" / "cli_latency.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
