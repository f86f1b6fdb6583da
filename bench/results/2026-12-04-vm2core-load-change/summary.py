"""Summary of run.sh's rounds (README.md): per estimate, size and window of 500 calls, B against A.

python summary.py OUT   (OUT: run.sh's output folder; the means need its times-*.json files)
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import sys

VARIANTS = ("decayed", "cumulative")
SIZES = ("1KiB", "4MiB")


def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _windows(out: str) -> list[tuple]:
    rows = []
    for path in sorted(glob.glob(os.path.join(out, "*-*", "result.json"))):
        variant, rnd = os.path.basename(os.path.dirname(path)).rsplit("-", 1)
        for size, row in _load(path)["jobs"]["B"]["sizes"].items():
            for w in row["windows"]:
                rows.append((variant, rnd, size, w["calls"][0], w["p50_vs_A"], w["p90_vs_A"], w["p99_vs_A"]))
    return rows


def _mae(rows: list[tuple]) -> str:
    if not rows:
        return "-"
    return " / ".join(f"{sum(abs(r[i]) for r in rows) / len(rows):.0%}" for i in (4, 5, 6))


def _times(run: str, job: str) -> list[dict]:
    return [_load(p)["times_s"] for p in sorted(glob.glob(os.path.join(run, f"times-{job}.rank*.json")))]


def _means(out: str) -> None:
    print("| variant | round | 1 KiB mean, calls 0-1000 / 1500-3000 | 4 MiB mean, the same | nothing added |")
    print("|---|---|---|---|---|")
    runs = sorted(glob.glob(os.path.join(out, "*-*")), key=lambda r: (os.path.basename(r).split("-")[1], r))
    for run in runs:
        a_times, b_times = _times(run, "A"), _times(run, "B")
        cells = []
        for s in SIZES:
            a = statistics.mean(x for r in a_times for x in r[s])
            before = statistics.mean(x for r in b_times for x in r[s][0:1000])
            after = statistics.mean(x for r in b_times for x in r[s][1500:3000])
            cells.append(f"{before / a - 1:+.0%} / {after / a - 1:+.0%}")
        stats = _load(os.path.join(run, "result.json"))["jobs"]["B"]["stats"].values()
        nothing, calls = sum(v["nothing_added"] for v in stats), sum(v["calls"] for v in stats)
        variant, rnd = os.path.basename(run).rsplit("-", 1)
        print(f"| {variant} | {rnd} | {cells[0]} | {cells[1]} | {nothing} of {calls} ({nothing / calls:.0%}) |")
    print()
    print("Means against A's mean (the times files, not committed: 2 MB); nothing added: carried calls, both ranks.")


def main(out: str) -> None:
    rows = _windows(out)
    print("| variant | round | size | " + " | ".join(f"calls {a}-{a + 500}" for a in range(0, 3000, 500)) + " |")
    print("|---|---|---|" + "---|" * 6)
    for variant in VARIANTS:
        for rnd in sorted({r[1] for r in rows}):
            for size in SIZES:
                cells = [f"{r[4]:+.0%}/{r[5]:+.0%}/{r[6]:+.0%}" for r in rows if r[:3] == (variant, rnd, size)]
                if cells:
                    print(f"| {variant} | {rnd} | {size} | " + " | ".join(cells) + " |")
    print()
    print("p50 / p90 / p99 against A per window of 500 calls (both ranks' calls pooled); the load starts before call")
    print("1000.")
    print()
    print("| variant | size | mean abs. error, calls 1500-3000, p50 / p90 / p99 | the same, calls 0-1000 |")
    print("|---|---|---|---|")
    for variant in VARIANTS:
        for size in SIZES:
            sel = [r for r in rows if r[0] == variant and r[2] == size]
            late = [r for r in sel if 1500 <= r[3] < 3000]
            early = [r for r in sel if r[3] < 1000]
            print(f"| {variant} | {size} | {_mae(late)} | {_mae(early)} |")
    print()
    _means(out)


if __name__ == "__main__":
    main(sys.argv[1])
