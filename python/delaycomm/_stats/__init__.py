"""Telemetry of delaycomm groups as dicts, tables and JSON (the numbers come from the native histograms).

The stats file of each group, from its creation to its write, is :mod:`delaycomm._stats.file`.
"""

from __future__ import annotations

import copy
import functools
import os
import platform
import socket
from typing import Any

from delaycomm._registry import backend_of, live_backends
from delaycomm._tools import table
from delaycomm._tools.machine import machine_info
from delaycomm._tools.table import Column
from delaycomm._tools.units import format_size

__all__ = ["stats", "reset_stats", "report", "group_stats"]


def group_stats(backend, group_name: str) -> dict[str, Any]:
    """One group's telemetry: per-op calls, bytes, latency and injected-delay summaries, staleness."""
    data = backend.stats()
    data["group"] = group_name
    data["rank"] = backend.rank()
    data["world_size"] = backend.size()
    data["host"] = socket.gethostname()
    data["pid"] = os.getpid()
    data.update(copy.deepcopy(_metadata(backend)))
    return data


def _metadata(backend) -> dict[str, Any]:
    """What a profile records of the job besides its latencies (docs/profile.md): the inner backends, versions and
    the machine."""
    return _static_metadata(backend.inner("cpu") is not None, backend.inner("cuda") is not None)


@functools.lru_cache(maxsize=4)
def _static_metadata(gloo: bool, nccl: bool) -> dict[str, Any]:
    """Computed once per process (stats() may be called every step; the CPU model is read from a file)."""
    import torch

    import delaycomm

    return {
        "backends": [name for name, present in (("gloo", gloo), ("nccl", nccl)) if present],
        "versions": {
            "delaycomm": delaycomm.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "cuda": torch.version.cuda,
        },
        "machine": {
            **{k: v for k, v in machine_info().items() if k != "loadavg"},  # the load would be stale
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if nccl else [],
        },
    }


def stats(group=None) -> dict[str, Any]:
    """Telemetry of delaycomm process groups.

    Args:
        group: a process group created with ``backend="delaycomm"``; None for every live delaycomm group.

    Returns:
        For a group: ``{"ops": {op: {"calls", "bytes", "errors", "delayed_calls", "latency": {"count",
        "p50_us", "p90_us", "p99_us", "p999_us", "max_us", ...}, "delay": {...}, "by_size": [{"bytes", "calls",
        "latency", "histogram", "match", "sizes"}, ...]}}, "staleness": {...}, "group", "rank", "world_size",
        "backends", "versions", "machine"}``; ``by_size`` is the latency the caller experienced per size class, with its
        whole histogram (docs/profile.md). For None: ``{"groups": {group_name: <that dict>}}``.

    Raises:
        ValueError: ``group`` is not a delaycomm group.
    """
    if group is not None:
        backend = backend_of(group)
        return group_stats(backend, str(getattr(group, "group_name", "")))
    return {"groups": {name: group_stats(b, name) for name, (b, _) in live_backends().items()}}


def reset_stats(group=None) -> None:
    """Zero the telemetry of ``group`` (None: every live delaycomm group)."""
    if group is not None:
        backend_of(group).reset_stats()
        return
    for b, _ in live_backends().values():
        b.reset_stats()


def _latency(key: str) -> Column:
    return Column(key.removesuffix("_us"), "us", lambda r: r[1]["latency"][key], "{:.1f}", width=10)


def _delay(key: str) -> Column:
    return Column("delay " + key.removesuffix("_us"), "us", lambda r: r[1]["delay"][key], "{:.1f}", width=10)


# One row per op: (op name, that op's dict of stats()).
_COLUMNS = (
    Column("op", value=lambda r: r[0], align="<", width=24),
    Column("calls", value=lambda r: r[1]["calls"], width=9),
    Column("bytes", "B", lambda r: r[1]["bytes"], width=12),
    *(_latency(k) for k in ("p50_us", "p90_us", "p99_us", "p999_us", "max_us")),
    Column("delayed", value=lambda r: r[1]["delayed_calls"], width=8),
    _delay("p50_us"),
    _delay("p99_us"),
    Column("errors", value=lambda r: r[1]["errors"], width=7),
)


def format_table(data: dict[str, Any]) -> str:
    """Format one group's stats (as :func:`stats` returns them for a group) as a fixed-column table."""
    title = f"delaycomm group {data.get('group', '?')!r} rank {data.get('rank')}/{data.get('world_size')}"
    lines = [table.format_table(_COLUMNS, sorted(data.get("ops", {}).items()), header=[title], sep=" ")]
    lines.extend(_match_lines(data.get("ops", {})))
    sd = data.get("slowdown", {})
    if sd.get("calls"):
        lines.append(
            "# slowdown: blocked {n} times, {t:.1f} ms in all (p50 {p50:.2f} ms, max {mx:.2f} ms)".format(
                n=sd["calls"],
                t=sd["blocked"]["mean_ms"] * sd["blocked"]["count"],
                p50=sd["blocked"]["p50_ms"],
                mx=sd["blocked"]["max_ms"],
            )
        )
    st = data.get("staleness", {})
    if st.get("steps"):
        lines.append(
            "# staleness: steps {steps} fresh {fresh} stale {stale} dropped {dropped} stale:fresh {r:.3f} "
            "blocked {b:.1f} ms staleness p50 {p50:.1f} p99 {p99:.1f} max {mx:.0f}".format(
                steps=st["steps"],
                fresh=st["fresh"],
                stale=st["stale"],
                dropped=st["dropped"],
                r=st["stale_fresh_ratio"],
                b=st["blocked_ms"],
                p50=st["staleness"]["p50"],
                p99=st["staleness"]["p99"],
                mx=st["staleness"]["max"],
            )
        )
        lines.append("# staleness " + _step_text(st))
    return "\n".join(lines)


def _match_lines(ops: dict[str, Any]) -> list[str]:
    """delay_mode=match's exceptions per op and size class (docs/delay.md, "Match mode"): calls whose target was
    shorter than this machine's own latency (nothing added: the call took longer than its target), and calls
    carried before the own-latency estimate was calibrated (the target less a provisional own latency, or the
    whole target without one)."""
    lines = []
    for name, op in sorted(ops.items()):
        carried = op.get("match", {}).get("calls", 0)
        for c in op.get("by_size", []):
            m = c.get("match", {})
            short, uncal = m.get("nothing_added", 0), m.get("uncalibrated", 0)
            if short or uncal:
                lines.append(
                    f"# match: {name} {format_size(c['bytes'])}: target shorter than the own latency on {short} "
                    f"call(s) (nothing added), uncalibrated on {uncal} (provisional own latency), of {c['calls']} "
                    f"call(s) ({carried} carried by this rank for the op)"
                )
    return lines


def _step_text(st: dict[str, Any]) -> str:
    """Where the staleness engine's step time came from, for the report (docs/staleness.md, "Calibration")."""
    source = st.get("step_source")
    if source == "step_ms":
        return f"step: {st['step_ms']:.3f} ms (step_ms)"
    if source == "calibrated":
        return (
            f"step: {st['step_ms']:.3f} ms (step_ms=auto: median of {st['step_intervals']} intervals of "
            f"{st['step_key']} on rank 0, agreed at stale reduction #{st['step_call']})"
        )
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
