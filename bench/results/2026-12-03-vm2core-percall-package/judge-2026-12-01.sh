#!/usr/bin/env bash
# The 2026-12-01 records (other VMs: kernels fc-v669 and fc-v857, pinned as the gate pins) judged against the
# baseline migrated to the VM of 2026-12-03: what the gate would say there about the same code. Nothing is measured:
# python -m delaycomm.bench percall --from-json RECORD --compare BASELINE reads a record and applies the gate's rule
# (only the 8 B rows are in common with the baseline). From the repository root; writes judge-2026-12-01.txt.
set -u
D=bench/results/2026-12-03-vm2core-percall-package
PY=${PYTHON:-.venv/bin/python}
{
  for f in bench/results/2026-12-01-vm2core-pinned-gate/gate-{unchanged,inject5}-{1,2}.json \
    bench/results/2026-12-01-vm2core-profile-percall/{main-c2956c4,main-c2956c4-again,d1-f262e96}.json; do
    echo "## $f"
    "$PY" -m delaycomm.bench percall --from-json "$f" --compare bench/baselines/cpu-percall.json >"$D/.judge.out"
    rc=$?
    grep -E '^ +8 B|^gate:' "$D/.judge.out"
    echo "# exit $rc"
  done
} >"$D/judge-2026-12-01.txt" 2>&1
rm -f "$D/.judge.out"
