#!/usr/bin/env bash
# The validation experiment (issue 11): predicted vs measured on the testbed, tails included.
# Run as root on an otherwise idle machine (load average well below 1):
#
#   sudo benchmarks/validate.sh            # the full validation, about 2 hours on 2 cores
#
# 1. CPU fidelity: compute after idle gaps for several CFS periods (results/testbed_check.md).
# 2. For each network setting (SETTINGS):
#      100mbit  6 hosts at 100 Mbit/s
#      1gbit    6 hosts at 1 Gbit/s
#      pshosts  4 worker hosts at 1 Gbit/s + 2 parameter-server hosts at 400 Mbit/s
#    every host 0.25 core with the default 10 ms CFS period: `testbed up`, `testbed check`
#    (links and CPU shares), `calibrate --testbed` (microbenchmarks only: compute inside a host
#    under its quota with the others busy; point-to-point, all-reduce at every group size, the
#    wait of a collective after compute under the quota, a synchronous PS's held pulls), then
#    `validate` on both benchmarks' committed grids (benchmarks/validation/grid-BENCH-GRID.yaml,
#    GRID = 6hosts or pshosts), each configuration 3 times, plus the optimizer's own choice.
# 3. The summary (summary.json / summary.md: per setting, per benchmark, overall, targets,
#    rows over 15 % with their per-phase reason) and the error bands the model reads.
#
# Knobs (environment): OUT (results folder, default results/validation), SETTINGS, BENCHES,
# REPEATS (override the grids'), QUICK=1 (quick calibration), GRID_DIR (grids, default
# benchmarks/validation), FIDELITY=0 (skip step 1), BANDS=0 (skip the error-band data file,
# which is only written when OUT is results/validation). A pilot:
#   sudo OUT=results/validation/pilot GRID_DIR=benchmarks/validation/pilot REPEATS=1 QUICK=1 \
#        FIDELITY=0 benchmarks/validate.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
OUT=${OUT:-results/validation}
SETTINGS=${SETTINGS:-"100mbit 1gbit pshosts"}
BENCHES=${BENCHES:-"cifar10 imagenet22k-small"}
GRID_DIR=${GRID_DIR:-benchmarks/validation}
REPEATS=${REPEATS:-}
QUICK=${QUICK:-}
FIDELITY=${FIDELITY:-1}
BANDS=${BANDS:-1}
CPU=0.25
mkdir -p "$OUT"

up_flags() {  # the `testbed up` flags of a setting
  case "$1" in
    100mbit) echo "--hosts 6 --rate 100mbit" ;;
    1gbit)   echo "--hosts 6 --rate 1gbit" ;;
    pshosts) echo "--hosts 4 --rate 1gbit --ps-hosts 2 --ps-rate 400mbit" ;;
    *) echo "unknown setting $1" >&2; exit 2 ;;
  esac
}
grid_of() { [ "$1" = pshosts ] && echo pshosts || echo 6hosts; }
name_of() { echo "v${1:0:5}" | tr -cd 'a-z0-9'; }   # testbed names: <= 6 characters

cleanup() { for s in $SETTINGS; do $BIN/dnnscale testbed down --name "$(name_of "$s")" >/dev/null 2>&1 || true; done; }
trap cleanup EXIT
trap 'exit 130' INT TERM HUP  # bash runs the EXIT trap on these only when they are trapped
log() { echo "[$(date -u +%H:%M:%S)] load $(cut -d' ' -f1 /proc/loadavg): $*" | tee -a "$OUT/validate.log"; }

if [ "$FIDELITY" = 1 ]; then
  log "CPU fidelity (compute after idle gaps)"
  $BIN/python benchmarks/testbed_check.py --fidelity-only
fi
for setting in $SETTINGS; do
  name=$(name_of "$setting")
  $BIN/dnnscale testbed down --name "$name" >/dev/null 2>&1 || true
  log "$setting: testbed up $(up_flags "$setting") --cpu $CPU --name $name"
  # shellcheck disable=SC2046
  $BIN/dnnscale testbed up $(up_flags "$setting") --cpu "$CPU" --name "$name" >/dev/null
  $BIN/dnnscale testbed check --name "$name" --json > "$OUT/check-$setting.json" || true
  log "$setting: calibrate (microbenchmarks only)"
  $BIN/dnnscale calibrate --testbed "$name" ${QUICK:+--quick} -o "$OUT/profile-$setting.yaml"
  for bench in $BENCHES; do
    log "$setting: validate $bench"
    $BIN/dnnscale validate --testbed "$name" --configs "$GRID_DIR/grid-$bench-$(grid_of "$setting").yaml" \
      --profile "$OUT/profile-$setting.yaml" ${REPEATS:+--repeats "$REPEATS"} -o "$OUT/$bench-$setting" \
      > /dev/null
  done
  $BIN/dnnscale testbed down --name "$name"
done
log "summary"
$BIN/python benchmarks/validation_summary.py "$OUT"
if [ "$BANDS" = 1 ] && [ "$OUT" = results/validation ]; then
  $BIN/python benchmarks/error_bands.py "$OUT"
elif [ "$BANDS" = 1 ]; then
  $BIN/python benchmarks/error_bands.py "$OUT" -o "$OUT/error_bands.json"
fi
log "done"
