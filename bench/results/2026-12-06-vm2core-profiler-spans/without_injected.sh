#!/usr/bin/env bash
# `delaycomm profile --without-injected` on a job's own traces (docs/telemetry.md, "In a profiler trace"): the same
# profiled job (profiled_job.py, 2 ranks, 200 sync 1 KiB all-reduces) with no delay, and with const:5ms on 30% of
# the calls; the profile of the delayed traces as read, and with --without-injected, against the undelayed one.
#   bench/results/2026-12-06-vm2core-profiler-spans/without_injected.sh   (from the repository root)
set -euo pipefail
here=bench/results/2026-12-06-vm2core-profiler-spans
py=${PYTHON:-.venv/bin/python}
tmp=$(mktemp -d)
run() { OMP_NUM_THREADS=1 "$py" -m torch.distributed.run --standalone --nproc_per_node 2 "$here/profiled_job.py" "$@" >/dev/null 2>&1; }
run "$tmp/none-{rank}.json"
DELAYCOMM_DELAY=const:5ms DELAYCOMM_DELAY_FRACTION=0.3 run "$tmp/delayed-{rank}.json"
"$py" -m delaycomm profile "$tmp"/none-0.json "$tmp"/none-1.json -o "$tmp/none.profile.json"
"$py" -m delaycomm profile "$tmp"/delayed-0.json "$tmp"/delayed-1.json -o "$tmp/delayed.profile.json"
"$py" -m delaycomm profile "$tmp"/delayed-0.json "$tmp"/delayed-1.json --without-injected -o "$tmp/without.profile.json"
"$py" - "$tmp" <<'PY'
import json, sys
import numpy as np
from delaycomm.sources import injected
tmp = sys.argv[1]
print(f"{'traces':<34} {'calls':>5} {'p50 us':>8} {'p90 us':>8} {'p99 us':>8} {'mean us':>8}")
for name, label in [("none", "no delay"), ("delayed", "const:5ms on 30%, as read"),
                    ("without", "const:5ms on 30%, --without-injected")]:
    doc = json.load(open(f"{tmp}/{name}.profile.json"))
    (c,) = doc["ops"]["allreduce"]
    base = doc["histogram"]["base"]
    values = np.repeat([base ** b for b, _ in c["buckets"]], [n for _, n in c["buckets"]])
    values = np.concatenate([values, np.zeros(c["zeros"])])
    q = np.quantile(values, [0.5, 0.9, 0.99]) / 1e3
    print(f"{label:<34} {c['count']:>5} {q[0]:>8.0f} {q[1]:>8.0f} {q[2]:>8.0f} {c['sum_ns'] / c['count'] / 1e3:>8.0f}")
for p in ("delayed-0", "delayed-1"):
    print(f"audit {p}: {injected.audit(f'{tmp}/{p}.json') or 'every call present'}")
PY
rm -rf "$tmp"
