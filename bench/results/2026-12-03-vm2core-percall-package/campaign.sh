#!/usr/bin/env bash
# The commands of this folder's README, in order, from the repository root (branch tools). OLD: a checkout of
# 4d6af63 (the commit the previous baseline was measured at) built into its own .venv (scripts/dev-venv.sh).
# FROM=gates: only the four gate runs against the baseline of step 2 (they were run again that way: see README.md).
set -u
D=bench/results/2026-12-03-vm2core-percall-package
OLD=${OLD:-/tmp/old-4d6}
T=$(mktemp -d)
mark() { echo "$1 $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$D/campaign-progress.txt"; }
export OMP_NUM_THREADS=1
A=(--device cpu -b 8 -e 8 --paths sync,async_wait,future_then --calls 400 --blocks 30 --progress off --runs 3)
mark "start${FROM:+ from $FROM}"
if [ "${FROM:-}" != gates ]; then
# 1. The same settings, side by side: the previous baseline's code (its bench/percall.py had no --pin-cpu: the
#    whole command under taskset) and this branch's package (--pin-cpu: every measuring process on CPU 0).
(cd "$OLD" && taskset -c 0 .venv/bin/python bench/percall.py "${A[@]}" --json "$T/old.json") >"$D/old-4d6af63.log" 2>&1
cp "$T/old.json" "$D/old-4d6af63.json"; mark "old-4d6af63 rc=$?"
.venv/bin/python -m delaycomm.bench percall "${A[@]}" --pin-cpu --json "$D/tools-branch.json" >"$D/tools-branch.log" 2>&1
mark "tools-branch rc=$?"
# 2. A new baseline on this machine, then the proof: two unchanged runs, two with 5 us injected.
.ci/bench-gate.sh --update-baseline >"$D/baseline-cpu-percall.log" 2>&1; mark "baseline rc=$?"
fi
for i in 1 2; do
  BENCH_OUT=$T/u$i .ci/bench-gate.sh >"$D/gate-unchanged-$i.log" 2>&1; rc=$?
  cp "$T/u$i/percall-gate.json" "$D/gate-unchanged-$i.json"; mark "unchanged-$i rc=$rc"
done
for i in 1 2; do
  BENCH_OUT=$T/i$i BENCH_INJECT_US=5 .ci/bench-gate.sh >"$D/gate-inject5-$i.log" 2>&1; rc=$?
  cp "$T/i$i/percall-gate.json" "$D/gate-inject5-$i.json"; mark "inject5-$i rc=$rc"
done
mark end
