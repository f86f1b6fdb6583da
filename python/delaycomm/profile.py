"""Latency profiles: per op and size class, the latency a job's callers experienced (docs/profile.md).

``python -m delaycomm profile STATS... -o PROFILE.json`` merges the stats files of the ranks of one or more jobs
(``DELAYCOMM_STATS``) into a profile; ``DELAYCOMM_DELAY=profile:PROFILE.json`` replays it. The native loader
(csrc/delay/Profile.hpp) is the one validator of a profile and the one quantile function: this module builds the
file, and reads its numbers back through :class:`delaycomm._C.DelaySampler`.
"""

from __future__ import annotations

import datetime
import json
import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

from delaycomm._tools import table
from delaycomm._tools.output import write_json
from delaycomm._tools.table import Column
from delaycomm._tools.units import format_size

__all__ = ["FORMAT", "VERSION", "build", "load", "format_profile", "plot", "profile_rows"]

FORMAT = "delaycomm-profile"
VERSION = 1
HISTOGRAM_BASE = 1.02  # csrc/stats/Histogram.hpp, LogHistogram::kBase
QUANTILES = ((0.5, "p50"), (0.9, "p90"), (0.99, "p99"), (0.999, "p999"))


class ProfileError(ValueError):
    """A stats file cannot be made into a profile (the message names the file and what is wrong)."""


def _groups(path: str) -> list[dict[str, Any]]:
    """The group dicts of one stats file: a stats file (one group) or a ``delaycomm.stats()`` dump (``groups``)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise ProfileError(f"delaycomm: profile: stats file {path!r} cannot be read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise ProfileError(f"delaycomm: profile: stats file {path!r} is not JSON ({e})") from None
    if isinstance(data, dict) and isinstance(data.get("groups"), dict):
        groups = list(data["groups"].values())
    elif isinstance(data, dict) and isinstance(data.get("ops"), dict):
        groups = [data]
    else:
        raise ProfileError(
            f"delaycomm: profile: stats file {path!r} is not delaycomm stats (expected the JSON of a "
            "DELAYCOMM_STATS file or of delaycomm.stats())"
        )
    for g in groups:
        for op, d in g.get("ops", {}).items():
            if d.get("calls") and "by_size" not in d:
                raise ProfileError(
                    f"delaycomm: profile: stats file {path!r}, op {op!r}, has no by_size histograms (written by "
                    "an older delaycomm; record the job again)"
                )
    return groups


def build(paths: Sequence[str]) -> dict[str, Any]:
    """A profile from the stats files of the ranks of one or more jobs of the same world size.

    Every file's per-size histograms are added up per (op, size class): the profile is the distribution of the
    latency of every call of every rank.

    Raises:
        ProfileError: a file is unreadable or not stats, the jobs have different world sizes, or no call was timed.
    """
    if not paths:
        raise ProfileError("delaycomm: profile: no stats files given")
    hists: dict[str, dict[int, dict[str, Any]]] = {}
    jobs: list[dict[str, Any]] = []
    current: dict[tuple[str, str], dict[str, Any]] = {}
    world_sizes: dict[int, str] = {}
    backends: set[str] = set()
    versions: list[dict[str, Any]] = []
    machines: dict[str, dict[str, Any]] = {}
    for path in paths:
        for g in _groups(path):
            world = g.get("world_size")
            world_sizes.setdefault(world, path)
            # A job: the files of one directory and group, one per rank (a rank seen again starts another job).
            key = (os.path.dirname(os.path.abspath(path)), str(g.get("group", "")))
            job = current.get(key)
            if job is None or g.get("rank") in job["ranks"]:
                job = {"directory": key[0], "group": g.get("group"), "world_size": world, "ranks": []}
                jobs.append(job)
                current[key] = job
            job["ranks"].append(g.get("rank"))
            backends.update(g.get("backends", []))
            if g.get("versions") and g["versions"] not in versions:
                versions.append(g["versions"])
            if g.get("host"):
                machines.setdefault(g["host"], g.get("machine", {"hostname": g["host"]}))
            for op, d in g.get("ops", {}).items():
                for entry in d.get("by_size", []):
                    _add(hists.setdefault(op, {}), entry, path, op)
    if len(world_sizes) > 1:
        shown = ", ".join(f"{w} in {p!r}" for w, p in world_sizes.items())
        raise ProfileError(
            f"delaycomm: profile: the stats files come from jobs of different world sizes ({shown}); a profile is "
            "for one world size: build one per world size"
        )
    if not hists:
        raise ProfileError(
            "delaycomm: profile: the stats files hold no timed calls (expected DELAYCOMM_STATS files of jobs that "
            "ran collectives)"
        )
    ops = {
        op: [
            {
                "bytes": size,
                "count": h["count"],
                "zeros": h["zeros"],
                "min_ns": h["min_ns"],
                "max_ns": h["max_ns"],
                "sum_ns": h["sum_ns"],
                "buckets": [[i, c] for i, c in sorted(h["buckets"].items())],
            }
            for size, h in sorted(classes.items())
        ]
        for op, classes in sorted(hists.items())
    }
    return {
        "format": FORMAT,
        "version": VERSION,
        "histogram": {"base": HISTOGRAM_BASE, "unit": "ns"},
        "metadata": {
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "world_size": next(iter(world_sizes)),
            "backends": sorted(backends),
            "latency": "caller-experienced, from the call until wait() returns or the future completes",
            "jobs": [dict(j, ranks=sorted(j["ranks"])) for j in jobs],
            "sources": [os.path.abspath(p) for p in paths],
            "versions": versions,
            "machines": list(machines.values()),
        },
        "ops": ops,
    }


def _add(classes: dict[int, dict[str, Any]], entry: dict[str, Any], path: str, op: str) -> None:
    h = entry.get("histogram") or {}
    if h.get("base") != HISTOGRAM_BASE or h.get("unit") != "ns":
        raise ProfileError(
            f"delaycomm: profile: stats file {path!r}, op {op!r}: its histograms have base {h.get('base')!r} and "
            f"unit {h.get('unit')!r} (expected {HISTOGRAM_BASE} and 'ns')"
        )
    if not h.get("count"):
        return
    acc = classes.setdefault(
        int(entry["bytes"]),
        {"count": 0, "zeros": 0, "min_ns": h["min_ns"], "max_ns": h["max_ns"], "sum_ns": 0.0, "buckets": Counter()},
    )
    acc["count"] += h["count"]
    acc["zeros"] += h["zeros"]
    acc["sum_ns"] += h["sum_ns"]
    acc["min_ns"] = min(acc["min_ns"], h["min_ns"])
    acc["max_ns"] = max(acc["max_ns"], h["max_ns"])
    for i, c in h["buckets"]:
        acc["buckets"][int(i)] += int(c)


def write(profile: dict[str, Any], path: str) -> None:
    """Writes ``profile`` to ``path`` and checks it with the native loader (what a replay will read)."""
    write_json(path, profile)
    load(path)


def load(path: str):
    """The profile at ``path``, validated by the native loader, and its sampler.

    Returns:
        ``(document, sampler)``: the JSON document and a :class:`delaycomm._C.DelaySampler` of ``profile:PATH``
        (``sampler.quantile(q, op=..., nbytes=...)`` is the replay's quantile function).

    Raises:
        ValueError: the file is not a valid profile (the message names the field).
    """
    from delaycomm import _C

    sampler = _C.DelaySampler(f"profile:{path}")
    with open(path) as f:
        return json.load(f), sampler


def profile_rows(doc: dict[str, Any], sampler) -> list[dict[str, Any]]:
    """One row per (op, size class): op, bytes, calls and the replay's quantiles and max in microseconds."""
    rows = []
    for op, classes in doc["ops"].items():
        for c in classes:
            row: dict[str, Any] = {"op": op, "bytes": c["bytes"], "calls": c["count"]}
            for q, name in QUANTILES:
                row[name] = sampler.quantile(q, op=op, nbytes=c["bytes"]) * 1e6
            row["max"] = c["max_ns"] * 1e-3
            rows.append(row)
    return rows


_COLUMNS = (
    Column("op", align="<", width=20),
    Column("size", "B", lambda r: r["bytes"], width=12),
    Column("calls", width=9),
    *(Column(name, "us", fmt="{:.1f}", width=10) for _, name in QUANTILES),
    Column("max", "us", fmt="{:.1f}", width=10),
)


def format_profile(path: str) -> str:
    """The profile at ``path`` as a table (one row per op and size class) under a header of its metadata."""
    doc, sampler = load(path)
    meta = doc["metadata"]
    jobs = meta.get("jobs", [])
    header = [
        f"delaycomm profile {path} (format version {doc['version']})",
        f"world size {meta.get('world_size')}, backends {','.join(meta.get('backends', [])) or '?'}, "
        f"{len(jobs)} job(s), {sum(len(j.get('ranks', [])) for j in jobs)} rank file(s), created "
        f"{meta.get('created', '?')}",
    ]
    return table.format_table(_COLUMNS, profile_rows(doc, sampler), header=header)


def plot(path: str, png: str) -> None:
    """Plots the profile's quantiles against the size, one panel per op, to ``png`` (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ProfileError(
            "delaycomm: profile: --png needs matplotlib (pip install matplotlib); the profile was written"
        ) from None
    doc, sampler = load(path)
    rows = profile_rows(doc, sampler)
    ops = list(doc["ops"])
    fig, axes = plt.subplots(1, len(ops), figsize=(5 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        mine = [r for r in rows if r["op"] == op]
        sizes = [max(r["bytes"], 1) for r in mine]
        for _, name in QUANTILES:
            ax.plot(sizes, [r[name] for r in mine], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes, [format_size(s) for s in sizes], rotation=45, fontsize=7)
        ax.set_xlabel("size (class)")
        ax.set_ylabel("latency (us)")
        ax.set_title(op)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{os.path.basename(path)}: world size {doc['metadata'].get('world_size')}")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def main(args) -> int:
    """``python -m delaycomm profile`` (arguments parsed by delaycomm.__main__)."""
    import sys

    try:
        if args.stats:
            if not args.output:
                print("error: profile: -o PROFILE.json is required with stats files", file=sys.stderr)
                return 2
            from delaycomm.sources import build as sources  # nccl-tests logs, Kineto traces (docs/profile.md)

            doc, notes = sources.build_profile(args.stats, sources.options_from(args), build)
            write(doc, args.output)
            for note in notes:
                print(f"# {note}", file=sys.stderr)
            print(f"# wrote {args.output}", file=sys.stderr, flush=True)
        target = args.show or args.output
        if args.png:
            if not target:
                print("error: profile: --png needs a profile (-o or --show)", file=sys.stderr)
                return 2
            plot(target, args.png)
            print(f"# wrote {args.png}", file=sys.stderr, flush=True)
        if args.show:
            print(format_profile(args.show))
        if not (args.stats or args.show):
            print("error: profile: give stats files and -o PROFILE.json, or --show PROFILE.json", file=sys.stderr)
            return 2
    except ValueError as e:  # ProfileError, and the native loader's ValueError naming the field
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
