"""The draw within a size class against the public nccl-tests tables (docs/profile.md, "Within a class, by size").

For every log in ``<repo>/../shared/data/nccl-tests`` and every collective in it, the profile the command writes
from that log alone, drawn two ways: by size within a class (its classes carry ``size_bytes``, as written) and by
class alone (the same profile without ``size_bytes``: how every profile drew before). Each pair of the table's
neighbouring rows (per-rank sizes s1 < s2) is a measured check: a call of 0.998 x s2 (just outside the 0.1% that
counts as s2's power of two) is 0.2% smaller than the row s2, so its latency is the row s2's time within 0.2%. The
script reports, per table and collective, the error of the draws' mean at that size against the row s2's time
(the median and the worst over the row pairs), both ways, and the same at the rows' own sizes.

    python bench/class_draw.py --out bench/results/DIR
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import statistics
import sys

from delaycomm import profile
from delaycomm.sources import build

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "nccl-tests")
POINTS = 400  # quantiles averaged for a draw's mean
NEAR = 0.998  # a call 0.2% under the next row


def _no_stats(paths):
    raise SystemExit(f"not a log: {paths}")


def _mean_us(p, op: str, nbytes: int) -> float:
    return sum(p.quantile((i + 0.5) / POINTS, op, nbytes) for i in range(POINTS)) / POINTS * 1e6


def table_errors(path: str) -> dict:
    doc, _ = build.build_profile([path], build.Options(), _no_stats)
    by_size = profile.check(doc)
    stripped = dict(doc, ops={op: [{k: v for k, v in c.items() if k != "size_bytes"} for c in cs]
                              for op, cs in doc["ops"].items()})  # fmt: skip
    by_class = profile.check(stripped)
    out, seen = {}, []
    for op, classes in sorted(doc["ops"].items(), key=lambda kv: kv[0].lstrip("_")):
        sig = [(c["bytes"], c.get("size_bytes"), c["sum_ns"]) for c in classes]
        if sig in seen:  # another name for a collective already measured (allreduce_coalesced, ...)
            continue
        seen.append(sig)
        rows = [(c["size_bytes"], c["sum_ns"] / c["count"] / 1e3) for c in classes if c["bytes"] >= 8]
        near = {"by_size": [], "by_class": []}
        at = {"by_size": [], "by_class": []}
        pairs = []
        for (s1, _), (s2, t2) in itertools.pairwise(rows):
            b = int(s2 * NEAR)
            if b <= s1:
                continue
            for name, p in (("by_size", by_size), ("by_class", by_class)):
                near[name].append(_mean_us(p, op, b) / t2 - 1.0)
                at[name].append(_mean_us(p, op, s2) / t2 - 1.0)
            pairs.append({"s1": s1, "s2": s2, "call": b, "row_us": t2, "by_size": near["by_size"][-1],
                          "by_class": near["by_class"][-1]})  # fmt: skip
        if not pairs:
            continue
        out[op] = {
            "row_pairs": len(pairs),
            "near_next_row": {k: {"median": statistics.median(v), "worst": max(v, key=abs)} for k, v in near.items()},
            "at_rows": {k: {"worst": max(v, key=abs)} for k, v in at.items()},
            "pairs": pairs,
        }
    return out


def markdown(rec: dict) -> str:
    lines = [
        "# The draw within a class against the public nccl-tests tables",
        "",
        f"`{rec['command']}` on {rec['machine']}. Per table and collective: the error of the draws' mean for a call",
        "0.2% under a row's per-rank size (the top of the class below it where the rows are powers of two) against",
        "that row's time, by size within a class (this profile, with `size_bytes`) and by class alone (the same",
        "profile without it: how profiles drew before). Median and worst over the table's neighbouring row pairs;",
        "the last column: the worst error at the rows' own sizes, by size.",
        "",
        "| table | op | row pairs | by size: median | by size: worst | by class: median | by class: worst | at rows |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for table, ops in rec["tables"].items():
        for op, r in ops.items():
            n, a = r["near_next_row"], r["at_rows"]
            lines.append(
                f"| {table} | {op} | {r['row_pairs']} | {n['by_size']['median']:+.1%} | {n['by_size']['worst']:+.1%} "
                f"| {n['by_class']['median']:+.1%} | {n['by_class']['worst']:+.1%} | {a['by_size']['worst']:+.1%} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for class_draw.json and README.md")
    ap.add_argument("--data", default=DATA, help="the nccl-tests logs' directory")
    args = ap.parse_args(argv)
    logs = sorted(glob.glob(os.path.join(args.data, "*.txt")))
    if not logs:
        print(f"no nccl-tests logs in {args.data}", file=sys.stderr)
        return 2
    rec = {
        "command": "python bench/class_draw.py --out " + args.out,
        "machine": f"{os.uname().nodename} ({os.cpu_count()} CPUs); the draws are deterministic",
        "tables": {os.path.basename(p): table_errors(p) for p in logs},
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "class_draw.json"), "w") as f:
        json.dump(rec, f, indent=1)
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(markdown(rec))
    print(markdown(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
