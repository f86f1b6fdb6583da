#!/usr/bin/env bash
# CI step: the performance gate on what delaycomm adds per call, under a minute on the 2-core CI machine
# (scripts/test.sh calls it after the tests).
#
#   .ci/bench-gate.sh [PYTHON]                    the per-call gate against bench/baselines/cpu-percall.json
#   .ci/bench-gate.sh --update-baseline [PYTHON]  measure a new baseline with the gate's settings (commit it, say why)
#   .ci/bench-gate.sh --two-rank [PYTHON]         the former gate, not run by CI: 2-rank delaycomm/gloo ratios of
#                                                 python -m delaycomm.bench against bench/baselines/cpu-2rank.json
#
# The gate (python -m delaycomm.bench percall; its rule in python/delaycomm/bench/gate.py, compare_percall, and in
# docs/benchmark.md, "The per-call gate"): one process, world size 1, raw Gloo vs delaycomm with nothing configured,
# 8-byte all_reduce on every path (sync, async_op + wait, get_future().then), 3 runs of 30 interleaved pairs of
# 400-call blocks, process CPU time per call. A run's regression is (its delaycomm/gloo ratio - the baseline's) x its
# raw cost: microseconds per call at this machine's speed. The gate fails when the median over runs and a majority of
# runs exceed BENCH_MAX_ADDED_US (default 2.5) on some path, and again in a confirmation run. A 5 us/call regression
# fails it; an unchanged rerun passes (bench/results/).
#
# PYTHON: the first argument, else $PYTHON, else .venv/bin/python when present, else python3.
# BENCH_OUT (default a temporary directory): where this run's JSON record goes, for the CI artifacts.
# BENCH_INJECT_US: to see the gate fail, add this much work (microseconds of CPU time, calibrated on this machine)
# before every delaycomm call in the benchmark harness (--inject-us; the library is not touched).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=gate
case "${1:-}" in
  --update-baseline) mode=update; shift ;;
  --two-rank) mode=two-rank; shift ;;
esac
PYTHON=${1:-${PYTHON:-}}
if [[ -z "$PYTHON" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
OUT=${BENCH_OUT:-$(mktemp -d)}
mkdir -p "$OUT"
start=$SECONDS

if [[ $mode == two-rank ]]; then
  "$PYTHON" -m delaycomm.bench --nproc 2 --device cpu --backends delaycomm,gloo -C all_reduce -d float32 -o sum \
    -b 8 -e 4M -f 8 -n 10 -w 2 -r 21 --interleave call -c 1 --progress off --json "$OUT/bench-gate-2rank.json" \
    --compare bench/baselines/cpu-2rank.json --max-slowdown "${BENCH_MAX_SLOWDOWN:-1.5}" --confirm 1
  exit
fi

BASELINE=bench/baselines/cpu-percall.json
# The gate's settings. The baseline is measured with the same ones, over more runs (a steadier reference).
# NOTE: --pin-cpu: each run on one CPU. Unpinned, where the caller and each group's Gloo worker thread land decides
# a whole run's cost (one run in five cost 2-4x on one side), and the future path failed an unchanged rerun.
GATE_ARGS=(--device cpu -b 8 -e 8 --paths sync,async_wait,future_then --calls 400 --blocks 30 --pin-cpu --progress off)
if [[ $mode == update ]]; then
  "$PYTHON" -m delaycomm.bench percall "${GATE_ARGS[@]}" --runs 9 --json "$BASELINE"
  echo "wrote $BASELINE: review the figures above before committing it"
  exit 0
fi
"$PYTHON" -m delaycomm.bench percall "${GATE_ARGS[@]}" --runs 3 --json "$OUT/percall-gate.json" --compare "$BASELINE" \
  --max-added-us "${BENCH_MAX_ADDED_US:-2.5}" --confirm 1 ${BENCH_INJECT_US:+--inject-us "$BENCH_INJECT_US"}
echo "# bench gate passed in $((SECONDS - start)) s; this run's record: $OUT/percall-gate.json"
