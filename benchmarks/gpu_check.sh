#!/usr/bin/env bash
# The single-GPU check of issue 17, as one command on the GPU machine (about 3-5 minutes on an
# H200; hard limit 7.5 minutes):
#     benchmarks/gpu_check.sh                 # calibrate, predict and run the grid -> results/gpu/
#     benchmarks/gpu_check.sh --dry-run       # the same flow on this CPU, tiny shapes (~1 minute)
# Runs dnnscale from the source tree (PYTHONPATH=src) with the machine's python3: the GPU
# machine reaches no registry, and its python3 already has torch, numpy, scipy, pyyaml, typer
# and rich. PYTHON=... picks another interpreter (this checkout's .venv/bin/python, say).
# At GPU_CHECK_LIMIT_S (default 450 s) the check gets SIGINT and writes what it has measured
# (summary.json "complete": false); its own --budget-s (default 420 s) skips grid runs that
# would not finish in time.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
LIMIT_S=${GPU_CHECK_LIMIT_S:-450}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" -c 'import torch, numpy, scipy, yaml, typer, rich' \
  || { echo "gpu_check: $PYTHON lacks torch, numpy, scipy, pyyaml, typer or rich" >&2; exit 2; }
exec timeout --signal=INT --kill-after=20 "$LIMIT_S" "$PYTHON" benchmarks/gpu_check.py "$@"
