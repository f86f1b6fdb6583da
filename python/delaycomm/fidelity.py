"""``python -m delaycomm profile compare PROFILE STATS...``: how closely a replay followed its profile
(docs/profile.md, "Fidelity").

Per (op, size class) of the replay's stats files (every rank pooled, as a profile pools them): the target, what the
replay draws for the class (``spec.quantile``: the class's own distribution, or the interpolation a size the
profile lacks or a rare class gets), against the latency the replay's callers experienced, at p50, p90 and p99,
with the error of each; and delay_mode=match's counts: calls whose target was shorter than this machine's own
latency (nothing could be added) and calls carried before the own-latency estimate was calibrated.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from delaycomm import profile
from delaycomm._tools import table
from delaycomm._tools.table import Column

__all__ = ["compare", "format_rows", "main"]

QUANTILES = ((0.5, "p50"), (0.9, "p90"), (0.99, "p99"))


def _achieved(op: str, cls: dict[str, Any]):
    """The native distribution of one achieved (op, size class): a one-class profile (its quantile function is the
    one a replay draws with; docs/profile.md "Replay")."""
    doc = {
        "format": profile.FORMAT,
        "version": profile.VERSION,
        "histogram": {"base": profile.HISTOGRAM_BASE, "unit": "ns"},
        "metadata": {},
        "ops": {op: [cls]},
    }
    return profile.check(doc, f"the replay's {op} of {cls['bytes']} bytes")


def _match_counts(paths: Sequence[str]) -> dict[tuple[str, int], dict[str, int]]:
    """delay_mode=match's per-class counters of the stats files, summed over ranks."""
    out: dict[tuple[str, int], dict[str, int]] = {}
    for path in paths:
        for g in profile._groups(path):
            for op, classes in g["ops"].items():
                for nbytes, h in classes:
                    acc = out.setdefault((op, nbytes), {"nothing_added": 0, "uncalibrated": 0})
                    for k, v in h.get("match", {}).items():
                        acc[k] += v
    return out


def compare(profile_path: str, stats: Sequence[str]) -> list[dict[str, Any]]:
    """One row per (op, size class) that the replay's stats files recorded: ``op``, ``bytes``, ``calls`` (the
    replay's), ``profile_calls`` (0: a size the profile lacks), ``rare``, the target and achieved p50/p90/p99 in
    microseconds with their relative errors (``err_p50``...: achieved / target - 1), ``nothing_added`` and
    ``uncalibrated``.

    Raises:
        delaycomm._readers.FileError: a file cannot be read, is not a profile or not stats (named).
    """
    _, spec = profile.load(profile_path)
    known = {(c["op"], c["bytes"]): c for c in spec.profile.class_info()}
    present = {c["op"] for c in spec.profile.class_info()}
    replay = profile.build(list(stats))
    counts = _match_counts(stats)
    rows = []
    for op, classes in replay["ops"].items():
        for cls in classes:
            achieved = _achieved(op, cls)
            mine = known.get((op, cls["bytes"]))
            row: dict[str, Any] = {
                "op": op,
                "bytes": cls["bytes"],
                "calls": cls["count"],
                "profile_calls": mine["count"] if mine else 0,
                "rare": bool(mine and mine["rare"]),
                "kind_fallback": spec.profile.kind_fallback_of(op, cls["bytes"]) if op in present else "",
            }
            at = cls.get("size_bytes", cls["bytes"])  # the replay's calls' mean size, where its stats say it
            for q, name in QUANTILES:
                target = spec.quantile(q, op=op, nbytes=at) * 1e6
                got = achieved.quantile(q, op=op, nbytes=at) * 1e6
                row[f"target_{name}"] = target
                row[name] = got
                row[f"err_{name}"] = got / target - 1.0 if target > 0 else None
            row.update(counts.get((op, cls["bytes"]), {"nothing_added": 0, "uncalibrated": 0}))
            rows.append(row)
    return rows


def _note(r: dict[str, Any]) -> str:
    if r.get("kind_fallback"):
        return "drawn from " + r["kind_fallback"].split(":")[0]
    if not r["profile_calls"]:
        return "not in the profile (interpolated)"
    if r["rare"]:
        return f"rare in the profile ({r['profile_calls']} calls: drawn from the op's other classes)"
    return ""


def _err(name: str) -> Column:
    return Column(
        f"err {name}", "%", lambda r: None if r[f"err_{name}"] is None else 100 * r[f"err_{name}"], "{:+.0f}", width=8
    )


_COLUMNS = (
    Column("op", align="<", width=20),
    Column("size", "B", lambda r: r["bytes"], width=10),
    Column("calls", width=8),
    *(
        c
        for _, name in QUANTILES
        for c in (
            Column(f"target {name}", "us", lambda r, n=name: r[f"target_{n}"], "{:.0f}", width=11),
            Column(name, "us", lambda r, n=name: r[n], "{:.0f}", width=10),
            _err(name),
        )
    ),
    Column("short", value=lambda r: r["nothing_added"], width=6),
    Column("uncal", value=lambda r: r["uncalibrated"], width=6),
    Column("note", value=_note, align="<", width=12),
)


def format_rows(profile_path: str, rows: list[dict[str, Any]]) -> str:
    """The rows as a table under a one-line header."""
    header = [
        f"delaycomm profile compare {profile_path}: target (what the replay draws) vs achieved (what its callers "
        "experienced), every rank pooled; short: target below this machine's own latency (nothing added); "
        "uncal: carried before the own-latency estimate was calibrated (provisional own latency)"
    ]
    return table.format_table(_COLUMNS, rows, header=header)


def main(argv: Sequence[str]) -> int:
    """``python -m delaycomm profile compare PROFILE STATS... [--json]``: exit status 2 with ``error:`` and the
    file's name for a file that cannot be read or is not a profile or stats."""
    parser = argparse.ArgumentParser(
        prog="python -m delaycomm profile compare",
        description="Target (the profile, as a replay draws it) vs achieved (the replay's stats files) per op and "
        "size class (docs/profile.md, 'Fidelity').",
    )
    parser.add_argument("profile", metavar="PROFILE.json")
    parser.add_argument("stats", nargs="+", metavar="STATS", help="the replay's stats files (DELAYCOMM_STATS)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(list(argv))
    try:
        rows = compare(args.profile, args.stats)
    except ValueError as e:
        message = str(e)
        if not message.startswith("delaycomm: "):
            message = f"delaycomm: profile compare: {message}"
        print(f"error: {message}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=1) if args.json else format_rows(args.profile, rows))
    return 0
