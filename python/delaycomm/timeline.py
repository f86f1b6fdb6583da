"""The job's timeline without the profiler (docs/telemetry.md, "Timeline").

``DELAYCOMM_TRACE=path-{rank}.json`` makes each rank keep a bounded ring of records (the newest
``DELAYCOMM_TRACE_EVENTS``, 100000 by default; csrc/stats/Trace.hpp): every call from its call to its completion,
every injected delay (or wait behind one) from the call to the op's issue, every stale decision. The rank writes
them as a Chrome trace-event file (the JSON Perfetto and chrome://tracing import) when a traced group is destroyed
and at interpreter exit. ``python -m delaycomm timeline FILES -o merged.json`` merges the ranks' files into one, a
process (track group) per rank; ``--png`` draws it.

Layout of a rank's file: ``pid`` is the global rank; calls are ``X`` events named by their op on the "calls"
threads (overlapping calls on lanes of their own), holds are ``X`` events ``delaycomm:delay`` / ``delaycomm:queued``
on the "delays" threads, stale decisions are instant events (``ph: i``) ``delaycomm:stale ...`` on the "stale"
thread. Timestamps are microseconds of the Unix epoch (ranks on different hosts align as well as their clocks do).
A CUDA call (not yet run on a GPU) is recorded when its CUDA events are harvested: from its call time on the host,
for the GPU's time between its events (``args.device`` "cuda", ``args.timing`` "gpu_events", or "untimed" with no
duration when that time is unknown).
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import sys
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["arm", "write", "to_chrome", "merge", "validate", "main"]

logger = logging.getLogger("delaycomm")

_CALL_TID, _DELAY_TID, _STALE_TID = 1, 101, 201
_MAX_LANES = 32
_lock = threading.Lock()
_path: str | None = None  # this process's file, once a traced group was created
_rank = 0  # this process's global rank


def file_for(template: str, rank: int, world: int) -> str:
    """The file of ``rank``: ``{rank}`` filled, or ``.rank{R}`` added before the extension in a job of several ranks
    (and ``.restart{N}`` after a torchrun restart): named as the stats files are, by the same function."""
    from delaycomm._config import restart_count, stats_file

    return stats_file(template, rank, "", world, default_group=True, restart=restart_count())


def arm(template: str | None, capacity: int, rank: int, world: int) -> None:
    """A group with ``trace`` set was created: turn the process's log on and remember its file."""
    global _path, _rank
    if template is None:
        return
    from delaycomm import _C

    _C._trace_enable(capacity)
    with _lock:
        _path = file_for(template, rank, world)
        _rank = rank


def on_shutdown() -> None:
    """A group is being destroyed: write the timeline so far (the file is rewritten whole each time)."""
    with _lock:
        path = _path
    if path is not None:
        try:
            write(path)
        except OSError as e:
            logger.error("delaycomm: the timeline was not written to %r: %s", path, e)


@atexit.register
def _write_at_exit() -> None:
    """The timeline of a process whose groups were never destroyed (or of what came after)."""
    on_shutdown()


def write(path: str) -> dict:
    """Write this process's timeline to ``path`` (atomically); return the document."""
    from delaycomm import _C
    from delaycomm._tools.output import write_json

    doc = to_chrome(_C._trace_records(), _rank)
    write_json(path, doc)
    logger.info("delaycomm: wrote the timeline (%d events) to %s", len(doc["traceEvents"]), path)
    return doc


def _lanes(spans: list[tuple[float, float]]) -> list[int]:
    """A lane per span so that spans of one lane do not overlap (greedy by start; the last lane takes the rest)."""
    order = sorted(range(len(spans)), key=lambda i: spans[i][0])
    ends: list[float] = []
    out = [0] * len(spans)
    for i in order:
        start, end = spans[i]
        lane = next((k for k, e in enumerate(ends) if e <= start), None)
        if lane is None and len(ends) < _MAX_LANES:
            lane = len(ends)
            ends.append(end)
        elif lane is None:
            lane = _MAX_LANES - 1  # too many at once: the last lane overlaps
        ends[lane] = max(ends[lane], end)
        out[i] = lane
    return out


def _event_args(kind: str, op: str, why: str, seq: int, a: tuple) -> dict:
    if kind == "call":
        if a[2] == 1:  # a CUDA call (csrc/stats/Trace.hpp, recordCudaCall): its duration is the GPU's, or unknown
            ok = None if a[1] < 0 else bool(a[1])
            timing = "gpu_events" if a[3] == 1 else "untimed"
            return {"op": op, "seq": seq, "size_class_bytes": a[0], "ok": ok, "device": "cuda", "timing": timing}
        return {"op": op, "seq": seq, "size_class_bytes": a[0], "ok": bool(a[1])}
    if kind == "delay":
        return {"op": op, "seq": seq, "delay_us": a[0] // 1000, "carrier": a[1], "size_class_bytes": a[2]}
    if a[0] < 0:  # kept fresh
        return {"op": op, "why": why}
    return {
        "op": op,
        "stream": a[0],
        "step": seq,
        "deferred_steps": a[1],
        "landed": a[2],
        "landed_max_steps": a[3],
        "delay_us": a[4] // 1000,
    }


def to_chrome(raw: dict, rank: int) -> dict:
    """The Chrome trace-event document of one rank's records (``_C._trace_records()``)."""
    offset = int(raw["epoch_offset_ns"])
    rows = raw["records"]
    events: list[dict[str, Any]] = []
    spans = {"call": [], "delay": []}
    for row in rows:
        kind, _, _, _, start, dur = row[:6]
        if kind in spans:
            spans[kind].append(((start + offset) / 1e3, (start + offset + dur) / 1e3))
    lanes = {k: iter(_lanes(v)) for k, v in spans.items()}
    used: set[int] = set()
    for kind, name, op, why, start, dur, seq, _thread, a in rows:
        ts = (start + offset) / 1e3
        args = _event_args(kind, op, why, seq, a)
        if kind == "stale":
            events.append({"ph": "i", "s": "t", "name": name, "cat": "delaycomm.stale", "ts": ts, "pid": rank,
                           "tid": _STALE_TID, "args": args})  # fmt: skip
            used.add(_STALE_TID)
            continue
        tid = (_CALL_TID if kind == "call" else _DELAY_TID) + next(lanes[kind])
        used.add(tid)
        events.append({"ph": "X", "name": name, "cat": f"delaycomm.{kind}", "ts": ts, "dur": max(dur, 0) / 1e3,
                       "pid": rank, "tid": tid, "args": args})  # fmt: skip
    events.sort(key=lambda e: e["ts"])
    meta = [
        {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "ts": 0, "args": {"name": f"rank {rank}"}},
        {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "ts": 0, "args": {"sort_index": rank}},
    ]
    for tid in sorted(used):
        label = "stale decisions" if tid == _STALE_TID else ("calls" if tid < _DELAY_TID else "delays")
        lane = tid - (_CALL_TID if tid < _DELAY_TID else _DELAY_TID)
        name = label if tid == _STALE_TID else f"{label} {lane}"
        meta.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "ts": 0, "args": {"name": name}})
        meta.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid, "ts": 0,
                     "args": {"sort_index": tid}})  # fmt: skip
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ms",
        "otherData": {
            "delaycomm": {
                "rank": rank,
                "capacity": raw["capacity"],
                "dropped": raw["dropped"],
                "clock": "microseconds of the Unix epoch",
            }
        },
    }


_REQUIRED = ("ph", "name", "pid", "tid")


def validate(doc: object) -> list[str]:
    """What in ``doc`` breaks the Chrome trace-event format as delaycomm writes it (empty: valid): the JSON Object
    Format with ``traceEvents``; every event has ``ph``, ``name``, ``pid``, ``tid`` and a numeric ``ts`` (``M``
    metadata events aside); ``X`` events a ``dur`` >= 0; instant events a scope ``s`` of g, p or t; ``args`` an
    object; metadata events one of the known names with their ``args``."""
    errors: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["not a JSON object with a traceEvents list"]
    for i, e in enumerate(doc["traceEvents"]):
        where = f"traceEvents[{i}]"
        if not isinstance(e, dict):
            errors.append(f"{where}: not an object")
            continue
        missing = [k for k in _REQUIRED if k not in e]
        if missing:
            errors.append(f"{where}: missing {', '.join(missing)}")
            continue
        ph = e["ph"]
        if ph not in ("X", "B", "E", "i", "I", "M", "C", "b", "e", "n", "s", "t", "f"):
            errors.append(f"{where}: unknown ph {ph!r}")
        if not isinstance(e["pid"], int) or not isinstance(e["tid"], int):
            errors.append(f"{where}: pid and tid must be integers")
        if ph != "M" and not isinstance(e.get("ts"), (int, float)):
            errors.append(f"{where}: ts must be a number")
        if ph == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
            errors.append(f"{where}: an X event needs a dur >= 0")
        if ph in ("i", "I") and e.get("s", "t") not in ("g", "p", "t"):
            errors.append(f"{where}: an instant event's scope s must be g, p or t")
        if "args" in e and not isinstance(e["args"], dict):
            errors.append(f"{where}: args must be an object")
        if ph == "M":
            known = {"process_name": "name", "thread_name": "name", "process_sort_index": "sort_index",
                     "thread_sort_index": "sort_index", "process_labels": "labels"}  # fmt: skip
            if e["name"] not in known or known[e["name"]] not in e.get("args", {}):
                errors.append(f"{where}: metadata event {e['name']!r} without its args")
    return errors


def merge(paths: Sequence[str]) -> dict:
    """One document of the ranks' files: each rank's events under its own pid (its rank), in time order.

    Raises:
        ValueError: a file that is not valid JSON or not a delaycomm timeline, or two files of one rank.
    """
    events: list[dict] = []
    ranks: dict[int, str] = {}
    dropped = {}
    for path in paths:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"delaycomm: timeline: {path!r} cannot be read as JSON ({e})") from None
        info = doc.get("otherData", {}).get("delaycomm") if isinstance(doc, dict) else None
        errors = validate(doc)
        if not isinstance(info, dict) or errors:
            why = errors[0] if errors else "no otherData.delaycomm (not written by DELAYCOMM_TRACE)"
            raise ValueError(f"delaycomm: timeline: {path!r} is not a delaycomm timeline: {why}")
        rank = int(info["rank"])
        if rank in ranks:
            raise ValueError(f"delaycomm: timeline: {path!r} and {ranks[rank]!r} are both rank {rank}")
        ranks[rank] = path
        dropped[rank] = info.get("dropped", 0)
        events.extend(doc["traceEvents"])
    meta = [e for e in events if e["ph"] == "M"]
    timed = sorted((e for e in events if e["ph"] != "M"), key=lambda e: e["ts"])
    return {
        "traceEvents": meta + timed,
        "displayTimeUnit": "ms",
        "otherData": {"delaycomm": {"ranks": sorted(ranks), "files": [ranks[r] for r in sorted(ranks)],
                                    "dropped_by_rank": {str(r): dropped[r] for r in sorted(ranks)}}},
    }  # fmt: skip


def render_png(doc: dict, path: str, title: str = "") -> None:
    """Draw a merged timeline: a row per rank and track (calls, delays, stale decisions), time in ms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [e for e in doc["traceEvents"] if e["ph"] != "M"]
    if not timed:
        raise ValueError("delaycomm: timeline: nothing to draw (no events)")
    t0 = min(e["ts"] for e in timed)
    ranks = sorted({e["pid"] for e in timed})
    tracks = ["calls", "delays", "stale"]
    rows = {(r, t): i for i, (r, t) in enumerate((r, t) for r in ranks for t in tracks)}
    colors = {"calls": "tab:blue", "delays": "tab:orange", "stale": "tab:green"}
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 2.0), dpi=80)
    for e in timed:
        track = "stale" if e["ph"] == "i" else ("calls" if e["tid"] < _DELAY_TID else "delays")
        y = rows[(e["pid"], track)]
        x = (e["ts"] - t0) / 1e3
        if e["ph"] == "X":
            ax.broken_barh([(x, max(e["dur"] / 1e3, 0.02))], (y - 0.35, 0.7), color=colors[track], alpha=0.55)
        else:
            deferred = "deferred" in e["name"]
            ax.plot([x], [y], marker="v" if deferred else "|", color="tab:red" if deferred else colors[track])
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ax.legend(
        handles=[
            Patch(color=colors["calls"], alpha=0.55, label="call (call to completion)"),
            Patch(color=colors["delays"], alpha=0.55, label="delaycomm:delay / queued (call to issue)"),
            Line2D([], [], color="tab:red", marker="v", linestyle="", label="stale: own contribution deferred"),
            Line2D([], [], color=colors["stale"], marker="|", linestyle="", label="stale: fresh / other decision"),
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.18),
        ncol=2,
        fontsize="small",
        frameon=False,
    )
    ax.set_yticks(list(rows.values()))
    ax.set_yticklabels([f"rank {r} {t}" for (r, t) in rows])
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_title(title or "delaycomm timeline")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m delaycomm timeline",
        description="Merge the ranks' DELAYCOMM_TRACE files into one Chrome trace (a track per rank) for Perfetto "
        "or chrome://tracing (docs/telemetry.md, 'Timeline').",
    )
    parser.add_argument("files", nargs="+", metavar="TRACE.json", help="the ranks' DELAYCOMM_TRACE files")
    parser.add_argument("-o", "--output", required=True, metavar="MERGED.json", help="write the merged trace here")
    parser.add_argument("--png", metavar="FILE.png", help="also draw it (needs matplotlib)")
    args = parser.parse_args(argv)
    from delaycomm._tools.optional import require_for_flag
    from delaycomm._tools.output import write_json

    if args.png:
        require_for_flag(parser, "--png", "matplotlib")  # before anything is read or written

    try:
        doc = merge(args.files)
        write_json(args.output, doc)
        if args.png:
            render_png(doc, args.png)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    ranks = doc["otherData"]["delaycomm"]["ranks"]
    n = sum(1 for e in doc["traceEvents"] if e["ph"] != "M")
    print(f"merged {len(ranks)} rank(s), {n} events -> {args.output}" + (f" (drawn: {args.png})" if args.png else ""))
    return 0
