"""test_match.py's job once, its raw times kept (match-paired.json) and its paired verdict printed (match-paired.txt).

From the repository root: ``PYTHONPATH=. .venv/bin/python bench/results/<this folder>/measure_match.py OUT.json``;
with ``--read OUT.json``, only the summary of a kept file."""

import json
import sys

import numpy as np


def summary(res: list) -> None:
    injected = res[0]["injected"]
    saved = (injected["add"]["mean_us"] - injected["match"]["mean_us"]) * 1e-3
    print(f"injected per call (rank 0's counters): add {injected['add']['mean_us'] / 1e3:.2f} ms, match "
          f"{injected['match']['mean_us'] / 1e3:.2f} ms: match injects {saved:.2f} ms less")  # fmt: skip
    for rank, r in enumerate(res):
        d = np.concatenate([np.subtract(r["times"]["add"][s], r["times"]["match"][s]) for s in ("1KiB", "4MiB")])
        se = d.std(ddof=1) / np.sqrt(len(d))
        print(f"rank {rank}: mean(add - match) {d.mean() * 1e3:.2f} ms, standard error {se * 1e3:.2f} ms, "
              f"z against {saved:.2f} ms: {(d.mean() * 1e3 - saved) / (se * 1e3):+.1f}")  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1] == "--read":
        with open(sys.argv[2]) as f:
            summary(json.load(f))
    else:
        from tests.delay import _workers as w
        from tests.delay._mp import spawn

        res = spawn(w.match_mode, 2, timeout=300, n=80)
        with open(sys.argv[1], "w") as f:
            json.dump(res, f)
        summary(res)
