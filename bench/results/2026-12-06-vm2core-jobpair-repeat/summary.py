"""Side by side: every run of bench/jobpair.py under this folder (runs/PAIR-N/result.json), per (op, size class)
of job B, B-replay's error against B in production at p50 / p90 / p99, and the mean step's error.

  cd bench/results/2026-12-06-vm2core-jobpair-repeat && python summary.py > summary.md
"""

from __future__ import annotations

import glob
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:+.0f}%"


def _runs() -> dict[str, list[tuple[str, dict]]]:
    out: dict[str, list[tuple[str, dict]]] = {}
    for path in sorted(glob.glob(os.path.join(HERE, "runs", "*", "result.json"))):
        name = os.path.basename(os.path.dirname(path))
        with open(path) as f:
            out.setdefault(name.rsplit("-", 1)[0], []).append((name, json.load(f)))
    return out


def _table(runs: list[tuple[str, dict]]) -> list[str]:
    keys = sorted({(r["op"], r["bytes"]) for _, d in runs for r in d["classes"] if not r["rare"]})
    lines = ["| op | size (B) | " + " | ".join(f"{n} p50 / p90 / p99" for n, _ in runs) + " |"]
    lines.append("|---|---|" + "---|" * len(runs))
    for op, nbytes in keys:
        cells = []
        for _, d in runs:
            row = next((r for r in d["classes"] if (r["op"], r["bytes"]) == (op, nbytes)), None)
            cells.append("-" if row is None else " / ".join(_pct(row[k]) for k in ("err_p50", "err_p90", "err_p99")))
        lines.append(f"| {op} | {nbytes} | " + " | ".join(cells) + " |")
    steps = " | ".join(
        f"{_pct(d['mean_step_err'])} ({d['mean_step_ms']['B-prod']} vs {d['mean_step_ms']['B-replay']} ms)"
        for _, d in runs
    )
    lines.append(f"| mean step | | {steps} |")
    loads = " | ".join(f"{d['machine']['load_before'][0]:.1f} → {d['load_after'][0]:.1f}" for _, d in runs)
    lines.append(f"| load (1 min) before → after | | {loads} |")
    return lines


def main() -> None:
    print("# bench/jobpair.py repeated: B-replay against B in production, per class of B\n")
    for pair, runs in _runs().items():
        models = runs[0][1]["models"]
        print(f"## {pair}: A {models['A']} → B {models['B']}, {runs[0][1]['steps']} steps per job\n")
        print("\n".join(_table(runs)) + "\n")


if __name__ == "__main__":
    main()
