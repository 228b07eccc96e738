#!/usr/bin/env bash
# The validation experiment (issue: predicted vs measured on the testbed), reproducible with one
# command as root:   benchmarks/validate.sh        (about 40 minutes on a quiet 2-core machine)
# For each network setting: bring up a 6-host testbed (0.25 core each), measure it (`check`),
# calibrate from microbenchmarks only (`calibrate`: compute on this machine, network between two
# testbed hosts), then predict and run both benchmarks' grids; finally merge the summaries.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
OUT=results/validation
mkdir -p "$OUT"
settings=("100mbit:v100" "1gbit:v1g")
cleanup() { for s in "${settings[@]}"; do $BIN/dnnscale testbed down --name "${s#*:}" >/dev/null 2>&1 || true; done; }
trap cleanup EXIT
for setting in "${settings[@]}"; do
  rate=${setting%%:*}; name=${setting#*:}
  $BIN/dnnscale testbed down --name "$name" >/dev/null 2>&1 || true
  $BIN/dnnscale testbed up --hosts 6 --rate "$rate" --cpu 0.25 --name "$name" >/dev/null
  $BIN/dnnscale testbed check --name "$name" --json > "$OUT/check-$rate.json" || true
  # microbenchmarks only; an existing profile is reused (delete it to calibrate again)
  [ -f "$OUT/profile-$rate.yaml" ] || $BIN/dnnscale calibrate --testbed "$name" -o "$OUT/profile-$rate.yaml"
  for grid in cifar10 imagenet22k-small; do
    $BIN/dnnscale validate --testbed "$name" --configs "benchmarks/validation/grid-$grid.yaml" \
      --profile "$OUT/profile-$rate.yaml" -o "$OUT/$grid-$rate"
  done
  $BIN/dnnscale testbed down --name "$name"
done
$BIN/python benchmarks/validation_summary.py "$OUT"
