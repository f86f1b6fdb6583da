#!/usr/bin/env bash
# The default-run tests whose verdicts depend on timing, under two busy loops per core on top of whatever the
# machine runs (docs/ci.md, "Timing under load"). Run from the repository root, after scripts/setup.sh:
#   bench/results/2026-12-06-vm2core-timing-under-load/run.sh OUT.txt
# Prints (and writes to OUT.txt) the machine, the load average before and after, and pytest's report.
# TESTS="FILE ..." runs those files instead.
set -uo pipefail
out=${1:?usage: run.sh OUT.txt}
tests=(
  tests/delay/test_match.py tests/delay/test_burst.py tests/delay/test_replay.py tests/delay/test_delay_ranks.py
  tests/delay/test_timeouts.py tests/delay/test_loader.py tests/stale/test_engine_waits.py tests/stale/test_limits.py
  tests/stale/test_divergence.py tests/backend/test_forwarding.py tests/tools/test_launch.py
  tests/harness/test_procs.py tests/experiment/test_experiment_ends.py tests/trace/test_profiler.py
  tests/stale/test_consume.py tests/stale/test_paths.py tests/delay/test_profile_replay.py tests/delay/test_local_latency.py
)
if [ -n "${TESTS:-}" ]; then read -r -a tests <<<"$TESTS"; fi
loops=$((2 * $(nproc)))
pids=()
for _ in $(seq "$loops"); do
  timeout 900 sh -c 'while :; do :; done' &
  pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
sleep 20  # let the load average see the loops
{
  echo "# $(date -u +%FT%TZ) $(hostname), $(nproc) cores, commit $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')"
  echo "# $loops busy loops (2 per core) besides the machine's own work; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  PYTHONDONTWRITEBYTECODE= .venv/bin/python -m pytest "${tests[@]}" -m "not slow" -n 4 --dist loadfile \
    -p no:cacheprovider -q -rfE --durations=15 2>&1
  echo "# pytest exit status: $?"
  echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out"
