#!/usr/bin/env bash
# CI step: the performance gate, about a minute on the 2-core CI machine (scripts/test.sh calls it).
#
#   .ci/bench-gate.sh [PYTHON]                    delaycomm/gloo ratios against bench/baselines/cpu-2rank.json
#   .ci/bench-gate.sh --update-baseline [PYTHON]  measure a new baseline with the same settings (commit it, say why)
#
# The gate judges ratios measured in one run (delaycomm vs gloo, interleaved call by call), so a slower or busier
# CI machine does not fail it and a real regression does; the rule is in docs/bench.md. The benchmark suite's
# smoke run (pytest bench/ --benchmark-disable) is a separate step of scripts/test.sh.
#
# PYTHON: the first argument, else $PYTHON, else .venv/bin/python when present, else python3.
# BENCH_MAX_SLOWDOWN (default 1.5: docs/bench.md, "Small sizes and choosing X"); BENCH_OUT (default a temporary
# directory): where this run's JSON record goes, for the CI artifacts.
set -euo pipefail
cd "$(dirname "$0")/.."
update=0
if [[ "${1:-}" == "--update-baseline" ]]; then update=1; shift; fi
PYTHON=${1:-${PYTHON:-}}
if [[ -z "$PYTHON" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
BASELINE=bench/baselines/cpu-2rank.json
# The gate's settings. The baseline must be measured with the same ones (--update-baseline does).
GATE_ARGS=(--nproc 2 --device cpu --backends delaycomm,gloo -C all_reduce -d float32 -o sum
           -b 8 -e 4M -f 8 -n 10 -w 2 -r 21 --interleave call -c 1 --progress off)

if [[ $update == 1 ]]; then
  "$PYTHON" -m delaycomm.bench "${GATE_ARGS[@]}" --json "$BASELINE"
  echo "wrote $BASELINE: review the ratios above before committing it"
  exit 0
fi

OUT=${BENCH_OUT:-$(mktemp -d)}
start=$SECONDS
"$PYTHON" -m delaycomm.bench "${GATE_ARGS[@]}" --json "$OUT/bench-gate.json" \
  --compare "$BASELINE" --max-slowdown "${BENCH_MAX_SLOWDOWN:-1.5}" --confirm 1
echo "# bench gate passed in $((SECONDS - start)) s; this run's record: $OUT/bench-gate.json"
