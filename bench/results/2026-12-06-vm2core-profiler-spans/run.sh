#!/usr/bin/env bash
# The per-call gate's measurement, main's build and this branch's side by side in one session, alternating
# (docs/telemetry.md, "In a profiler trace"; docs/benchmark.md, "The per-call cost"): no profiler, nothing
# configured (the fast path), sizes 8 B and 1 KiB, every path, 3 runs each, twice.
#   MAIN_PY=/path/to/main/.venv/bin/python bench/results/2026-12-06-vm2core-profiler-spans/run.sh
set -euo pipefail
here=bench/results/2026-12-06-vm2core-profiler-spans
main_py=${MAIN_PY:?set MAIN_PY to the python of a venv with the main build}
branch_py=${PYTHON:-.venv/bin/python}
uptime >"$here/load.txt"
for i in 1 2; do
  for who in main branch; do
    py=$main_py; [ "$who" = branch ] && py=$branch_py
    "$py" -m delaycomm.bench percall --runs 3 -b 8 -e 1K -f 128 --progress off --json "$here/percall-$who-$i.json" \
      >"$here/percall-$who-$i.log" 2>&1
    uptime >>"$here/load.txt"
  done
done
