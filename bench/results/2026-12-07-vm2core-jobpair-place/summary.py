"""Side by side: every run of bench/jobpair.py --replays step,call under this folder (runs/PAIR-N/result.json): per
(op, size class) of job B with enough calls to judge, each replay's error against B in production at p50 / p90 /
p99, and the mean and median step's error; the load average (1 min) before and after the run.

  cd bench/results/2026-12-07-vm2core-jobpair-place && python summary.py > summary.md
  python summary.py runs-v1 > summary-v1.md   # the first build (see README.md)
"""

from __future__ import annotations

import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PLACES = ("step", "call")


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:+.0f}%"


def _runs(folder: str) -> dict[str, list[tuple[str, dict]]]:
    out: dict[str, list[tuple[str, dict]]] = {}
    for path in sorted(glob.glob(os.path.join(HERE, folder, "*", "result.json"))):
        name = os.path.basename(os.path.dirname(path))
        with open(path) as f:
            out.setdefault(name.rsplit("-", 1)[0], []).append((name, json.load(f)))
    return out


def _table(runs: list[tuple[str, dict]]) -> list[str]:
    keys = sorted(
        {(r["op"], r["bytes"]) for _, d in runs for r in d["replays"]["step"]["classes"] if r["profile_calls"] > 0}
        - {(r["op"], r["bytes"]) for _, d in runs for r in d["replays"]["step"]["classes"] if r["rare"]}
    )
    head = "| run | load | placement | " + " | ".join(f"{op} {n} B p50 / p90 / p99" for op, n in keys)
    lines = [head + " | mean step | median step |", "|---|---|---|" + "---|" * (len(keys) + 2)]
    for name, d in runs:
        load = f"{d['machine']['load_before'][0]:.1f} → {d['load_after'][0]:.1f}"
        for place in PLACES:
            rep = d["replays"].get(place)
            if rep is None:
                continue
            cells = []
            for op, nbytes in keys:
                row = next((r for r in rep["classes"] if (r["op"], r["bytes"]) == (op, nbytes)), None)
                cells.append(
                    "-" if row is None else " / ".join(_pct(row[k]) for k in ("err_p50", "err_p90", "err_p99"))
                )
            ms = rep["mean_step_ms"]
            job = rep["job"]
            step = f"{_pct(rep['mean_step_err'])} ({ms['B-prod']} vs {ms[job]} ms)"
            p50 = f"{_pct(rep['p50_step_err'])} ({rep['p50_step_ms']['B-prod']} vs {rep['p50_step_ms'][job]} ms)"
            run = name.rsplit("-", 1)[1]
            lines.append(f"| {run} | {load} | {place} | " + " | ".join(cells) + f" | {step} | {p50} |")
    return lines


def main() -> None:
    folder = sys.argv[1] if len(sys.argv) > 1 else "runs"
    print(f"# bench/jobpair.py --replays step,call ({folder}/): B replayed against B in production, per class of B\n")
    print("Goals (issue 37): per class p50 within 35%, mean step within 10%, median step within 25%.\n")
    for pair, runs in _runs(folder).items():
        models = runs[0][1]["models"]
        print(f"## {pair}: A {models['A']} → B {models['B']}, {runs[0][1]['steps']} steps per job\n")
        print("\n".join(_table(runs)) + "\n")


if __name__ == "__main__":
    main()
