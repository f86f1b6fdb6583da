"""What delaycomm's own spans in a PyTorch profiler trace say about its calls (docs/telemetry.md, "In a profiler
trace"): whether the trace holds every call, and the injected delay to subtract from them (``python -m delaycomm
profile --without-injected``).

- **The audit**: a ``c10d::*`` collective op that has no backend event (``gloo:*``, an NCCL kernel) is a call the
  trace lost (a backend that records its events on the thread that issues the op, issued off the profiled thread):
  the trace's latencies are then those of the calls it kept, and :func:`audit` says so.
- **The injected delay**: a call that delaycomm held back has a ``delaycomm:delay`` span (or ``delaycomm:queued``,
  behind a held-back call) from the call to the op's issue, on the calling thread, starting inside the call's
  ``c10d::*`` op. The op's backend event starts once it is issued (Gloo: when its worker starts it), so a rank's own
  event leaves its own hold out, and the peers' events hold it: they wait in the op for the rank that issues it
  last. Given the traces of every rank, the k-th call of an op is one call on every rank (its k-th ``c10d::*`` op
  and its k-th backend event); :func:`corrections` takes from rank r's event the longest hold of that call on any
  rank less r's own, but never more than r's event exceeds the call's shortest event on any rank (the one that
  issued last waited for nobody): ranks that call at different times, or ops that queue in the backend behind
  earlier ones, are never made faster than the call's fastest rank. Given one rank's trace alone, its peers' holds
  are unknown and nothing is taken (a report line says so).
"""

from __future__ import annotations

import bisect
from collections import defaultdict

from delaycomm.sources.kineto import KinetoError, load_json, looks_like
from delaycomm.sources.ops import op_of_trace_name

__all__ = ["SPAN_PREFIX", "audit", "corrections", "backend_events"]

SPAN_PREFIX = "delaycomm:"
_HOLDS = ("delaycomm:delay", "delaycomm:queued")


def _events(path: str) -> list[dict]:
    doc = load_json(path)
    if not looks_like(doc):
        raise KinetoError(f"trace {path!r} is not a PyTorch profiler trace (expected a JSON object with traceEvents)")
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [
        e
        for e in events
        if isinstance(e, dict)
        and e.get("ph") == "X"
        and isinstance(e.get("name"), str)
        and isinstance(e.get("ts"), (int, float))
        and isinstance(e.get("dur"), (int, float))
    ]


def _c10d_op(name: str) -> str | None:
    if not name.startswith("c10d::"):
        return None
    return op_of_trace_name(name[len("c10d::") :].strip("_")) or op_of_trace_name(name[len("c10d::") :].rstrip("_"))


def backend_events(events: list[dict]) -> list[dict]:
    """The backend events of calls (``gloo:*`` CPU events, NCCL kernels), by start."""
    out = [
        e
        for e in events
        if (e["name"].startswith("gloo:") or e["name"].startswith(("ncclKernel", "ncclDevKernel")))
        and op_of_trace_name(e["name"])
    ]
    return sorted(out, key=lambda e: e["ts"])


def audit(path: str) -> list[str]:
    """Report lines for a trace whose events do not add up: fewer backend events (``gloo:*`` events, NCCL kernels)
    than ``c10d::*`` collective ops. Counted in total, not per op: a backend may record an op under another name
    (Gloo's ``_allgather_base`` as ``gloo:all_gather``, NCCL's barrier as an all-reduce kernel, point-to-point calls
    as ``SendRecv``)."""
    events = _events(path)
    ops: dict[str, int] = defaultdict(int)
    for e in events:
        op = _c10d_op(e["name"])
        if op is not None:
            ops[op] += 1
    n = sum(ops.values())
    m = sum(1 for e in events if e["name"].startswith(("gloo:", "ncclKernel", "ncclDevKernel")))
    if m >= n:
        return []
    shown = ", ".join(f"{k} {v}" for k, v in sorted(ops.items()))
    return [
        f"{path}: {n} c10d collective op(s) ({shown}) but {m} backend event(s) (gloo:* events, NCCL kernels): "
        f"{n - m} call(s) are missing from the trace (issued where the profiler did not record them), and the "
        "latencies read are those of the calls it kept"
    ]


def _calls(events: list[dict]) -> dict[str, list[dict]]:
    """The ``c10d::*`` collective ops of a trace per op, in call order."""
    out: dict[str, list[dict]] = defaultdict(list)
    for e in sorted(events, key=lambda e: e["ts"]):
        op = _c10d_op(e["name"])
        if op is not None:
            out[op].append(e)
    return out


def _held(events: list[dict], calls: dict[str, list[dict]]) -> dict[tuple[str, int], float]:
    """How long delaycomm held each call back on this rank, by (op, index of the call): each hold span belongs to
    the c10d op of its thread that starts nearest to it (the span starts inside the call)."""
    by_thread: dict[tuple, list[tuple[float, str, int]]] = defaultdict(list)
    for op, ops in calls.items():
        for k, e in enumerate(ops):
            by_thread[(e.get("pid"), e.get("tid"))].append((e["ts"], op, k))
    for starts in by_thread.values():
        starts.sort()
    held: dict[tuple[str, int], float] = {}
    for span in (e for e in events if e["name"] in _HOLDS):
        starts = by_thread.get((span.get("pid"), span.get("tid")), [])
        i = bisect.bisect_left(starts, (span["ts"],))
        near = [c for c in starts[max(0, i - 1) : i + 1]]
        if near:
            _, op, k = min(near, key=lambda c: abs(c[0] - span["ts"]))
            held[(op, k)] = float(span["dur"])
    return held


def corrections(paths: list[str]) -> tuple[dict[str, dict[tuple, float]], list[str]]:
    """For each trace, the microseconds to take from each backend event (keyed ``(pid, tid, ts)``), and the report
    lines (module docstring)."""
    ranks = []
    for path in paths:
        events = _events(path)
        calls = _calls(events)
        by_op: dict[str, list[dict]] = defaultdict(list)
        for e in backend_events(events):
            by_op[op_of_trace_name(e["name"])].append(e)
        ranks.append((path, by_op, _held(events, calls)))
    report = []
    if len(paths) == 1:
        report.append(
            f"--without-injected: {paths[0]} is one rank's trace: the delays its peers injected are not known, and "
            "nothing is taken from its calls (give the traces of every rank)"
        )
    out: dict[str, dict[tuple, float]] = {p: {} for p in paths}
    for op in sorted({op for _, by_op, _ in ranks for op in by_op}):
        counts = sorted({len(by_op.get(op, [])) for _, by_op, _ in ranks})
        if len(counts) > 1:
            report.append(
                f"--without-injected: the traces hold different numbers of {op} calls ({counts}): only the first "
                f"{counts[0]} of each are corrected"
            )
        for k in range(counts[0]):
            held = [h.get((op, k), 0.0) for _, _, h in ranks]
            durs = [float(by_op[op][k]["dur"]) for _, by_op, _ in ranks]
            for (path, by_op, _), h, d in zip(ranks, held, durs):
                e = by_op[op][k]
                # The peers' longer hold, never below the call's duration on the rank that issued it last.
                out[path][(e.get("pid"), e.get("tid"), e["ts"])] = max(0.0, min(max(held) - h, d - min(durs)))
    return out, report
