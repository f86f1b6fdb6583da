"""Telemetry of delaycomm groups as dicts, tables and JSON (the numbers come from the native histograms)."""

from __future__ import annotations

import os
import re
import socket
from typing import Any

import torch

__all__ = ["stats", "reset_stats", "report", "group_stats"]


def group_stats(backend, group_name: str) -> dict[str, Any]:
    """One group's telemetry: per-op calls, bytes, latency and injected-delay summaries, staleness."""
    data = backend.stats()
    data["group"] = group_name
    data["rank"] = backend.rank()
    data["world_size"] = backend.size()
    data["host"] = socket.gethostname()
    data["pid"] = os.getpid()
    return data


def stats(group=None) -> dict[str, Any]:
    """Telemetry of delaycomm process groups.

    Args:
        group: a process group created with ``backend="delaycomm"``; None for every live delaycomm group.

    Returns:
        For a group: ``{"ops": {op: {"calls", "bytes", "errors", "delayed_calls", "latency": {"count",
        "p50_us", "p90_us", "p99_us", "p999_us", "max_us", ...}, "delay": {...}}}, "staleness": {...},
        "group", "rank", "world_size"}``. For None: ``{"groups": {group_name: <that dict>}}``.

    Raises:
        ValueError: ``group`` is not a delaycomm group.
    """
    from delaycomm._backend import backend_of, live_backends

    if group is not None:
        backend = backend_of(group)
        return group_stats(backend, str(getattr(group, "group_name", "")))
    return {"groups": {name: group_stats(b, name) for name, (b, _) in live_backends().items()}}


def reset_stats(group=None) -> None:
    """Zero the telemetry of ``group`` (None: every live delaycomm group)."""
    from delaycomm._backend import backend_of, live_backends

    if group is not None:
        backend_of(group).reset_stats()
        return
    for b, _ in live_backends().values():
        b.reset_stats()


_COLUMNS = (
    # (header, unit, key path, format)
    ("op", "", None, "{:<24}"),
    ("calls", "", ("calls",), "{:>9}"),
    ("bytes", "B", ("bytes",), "{:>12}"),
    ("p50", "us", ("latency", "p50_us"), "{:>10.1f}"),
    ("p90", "us", ("latency", "p90_us"), "{:>10.1f}"),
    ("p99", "us", ("latency", "p99_us"), "{:>10.1f}"),
    ("p999", "us", ("latency", "p999_us"), "{:>10.1f}"),
    ("max", "us", ("latency", "max_us"), "{:>10.1f}"),
    ("delayed", "", ("delayed_calls",), "{:>8}"),
    ("delay p50", "us", ("delay", "p50_us"), "{:>10.1f}"),
    ("delay p99", "us", ("delay", "p99_us"), "{:>10.1f}"),
    ("errors", "", ("errors",), "{:>7}"),
)


def _width(fmt: str) -> int:
    return int(re.search(r"[<>](\d+)", fmt).group(1))


def format_table(data: dict[str, Any]) -> str:
    """Format one group's stats (as :func:`stats` returns them for a group) as a fixed-column table."""
    lines = [f"# delaycomm group {data.get('group', '?')!r} rank {data.get('rank')}/{data.get('world_size')}"]
    header = []
    units = []
    for name, unit, _, fmt in _COLUMNS:
        w = _width(fmt)
        align = "<" if fmt.startswith("{:<") else ">"
        header.append(f"{name:{align}{w}}")
        units.append(f"{('(' + unit + ')') if unit else '':{align}{w}}")
    lines.append("# " + " ".join(header))
    lines.append("# " + " ".join(units))
    for op, row in sorted(data.get("ops", {}).items()):
        cells = []
        for _, _, path, fmt in _COLUMNS:
            if path is None:
                cells.append(fmt.format(op))
                continue
            v = row
            for k in path:
                v = v[k]
            cells.append(fmt.format(v))
        lines.append("  " + " ".join(cells))
    sd = data.get("slowdown", {})
    if sd.get("calls"):
        lines.append("# slowdown: blocked {n} times, {t:.1f} ms in all (p50 {p50:.2f} ms, max {mx:.2f} ms)".format(
            n=sd["calls"], t=sd["blocked"]["mean_ms"] * sd["blocked"]["count"], p50=sd["blocked"]["p50_ms"],
            mx=sd["blocked"]["max_ms"]))
    st = data.get("staleness", {})
    if st.get("steps"):
        lines.append(
            "# staleness: steps {steps} fresh {fresh} stale {stale} dropped {dropped} stale:fresh {r:.3f} "
            "blocked {b:.1f} ms staleness p50 {p50:.1f} p99 {p99:.1f} max {mx:.0f}".format(
                steps=st["steps"], fresh=st["fresh"], stale=st["stale"], dropped=st["dropped"],
                r=st["stale_fresh_ratio"], b=st["blocked_ms"], p50=st["staleness"]["p50"],
                p99=st["staleness"]["p99"], mx=st["staleness"]["max"]))
        lines.append("# staleness " + _step_text(st))
    return "\n".join(lines)


def _step_text(st: dict[str, Any]) -> str:
    """Where the staleness engine's step time came from, for the report (docs/staleness.md, "Calibration")."""
    source = st.get("step_source")
    if source == "step_ms":
        return f"step: {st['step_ms']:.3f} ms (step_ms)"
    if source == "calibrated":
        return (f"step: {st['step_ms']:.3f} ms (step_ms=auto: median of {st['step_intervals']} intervals of "
                f"{st['step_key']} on rank 0, agreed at stale reduction #{st['step_call']})")
    return "step: not calibrated yet (step_ms=auto; nothing is deferred until a stream recurs)"



def report(group=None) -> str:
    """The telemetry as a readable table (one block per group).

    Args:
        group: a delaycomm process group, or None for every live delaycomm group.

    Returns:
        The table as a string (also suitable for logging).
    """
    if group is not None:
        return format_table(stats(group))
    blocks = [format_table(g) for g in stats()["groups"].values()]
    return "\n\n".join(blocks) if blocks else "# no delaycomm groups"


# torch is imported for its side effect of registering c10d before any backend object is touched.
_ = torch
