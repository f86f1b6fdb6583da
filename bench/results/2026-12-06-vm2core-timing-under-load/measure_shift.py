"""The p50 shift of a const:20ms delay against its control, three times (shift-control.txt): from the repository root,
``PYTHONPATH=. .venv/bin/python bench/results/2026-12-06-vm2core-timing-under-load/measure_shift.py``."""

from tests.delay import _workers as w
from tests.delay._mp import spawn

if __name__ == "__main__":
    for _ in range(3):
        res = spawn(w.latency_shift, 2, timeout=200)
        pairs = [(round((p["slow"] - p["base"]) / 1000, 2), round(p["control_late"] / 1000, 2)) for p in res]
        with open("/proc/loadavg") as f:
            print(pairs, f.read().split()[:3], flush=True)
