"""The table: a ``#`` header with versions and settings, then fixed columns generated from one schema.

One row per size; the backends side by side (a group of columns each), then the ratio of each delaycomm backend
to the raw one. Header, units and cells all come from :data:`COMMON` and :func:`backend_columns`, so labels
and formats cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from delaycomm.bench import collectives
from delaycomm.bench.results import RowStats, raw_label, row_stats
from delaycomm.bench.units import format_size

__all__ = ["format_table", "stability_warnings", "Column"]

# A row's spread of per-repeat p50s above this is reported with advice (pyperf-style stability warning).
SPREAD_WARN = 0.10


@dataclasses.dataclass(frozen=True)
class Column:
    """One column: header, unit, width and how to get its cell from a RowStats."""

    name: str
    unit: str
    width: int
    cell: Callable[[RowStats], Any]
    fmt: str = "{}"

    def render(self, row: RowStats | None) -> str:
        if row is None:
            return f"{'-':>{self.width}}"
        v = self.cell(row)
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            text = "N/A" if v is None else "inf"
        else:
            text = self.fmt.format(v)
        return f"{text:>{self.width}}"


COMMON = (
    Column("size", "(B)", 12, lambda r: r.size_bytes),
    Column("count", "(elements)", 12, lambda r: r.count),
    Column("type", "", 9, lambda r: r.dtype),
    Column("redop", "", 6, lambda r: r.redop),
)


def backend_columns() -> tuple[Column, ...]:
    """The columns of one backend's group."""
    return (
        Column("p50", "(us)", 10, lambda r: r.p50_us, "{:.1f}"),
        Column("p99", "(us)", 10, lambda r: r.p99_us, "{:.1f}"),
        Column("algbw", "(GB/s)", 8, lambda r: r.algbw_GBps, "{:.3f}"),
        Column("busbw", "(GB/s)", 8, lambda r: r.busbw_GBps, "{:.3f}"),
        Column("#wrong", "", 7, lambda r: r.wrong),
    )


RATIO = Column("ratio", "(x raw)", 8, lambda r: r.ratio, "{:.3f}")


def header_lines(record: dict[str, Any]) -> list[str]:
    """The ``#`` lines that say what was measured where, with which versions and settings."""
    s = record["settings"]
    env = record.get("environment", {})
    m = env.get("machine", {})
    n = record["world_size"]
    raw = raw_label(record)
    lines = [
        f"# delaycomm bench: {n} ranks on {s.get('device', '?')}, {s.get('dtype')} {s.get('redop')}, "
        f"-n {s.get('iters')} -w {s.get('warmup')}, {s.get('repeats')} repeats interleaved by "
        f"{s.get('interleave', 'block')}, "
        f"check {'on' if s.get('check') else 'off'}",
        f"# torch {env.get('torch', '?')}, delaycomm {env.get('delaycomm', '?')}"
        + (f" ({env['delaycomm_commit']})" if env.get("delaycomm_commit") else "")
        + f", NCCL {env.get('nccl') or '-'}; {m.get('hostname', '?')}: {m.get('cpu', '?')}, "
        f"{m.get('cpu_affinity') or m.get('cpu_count', '?')} cores" + (f", {m['gpu']}" if m.get("gpu") else ""),
    ]
    for b in record.get("backends", s["backends"]):
        if b["name"] == "delaycomm":
            cfg = b.get("config", b.get("options", {}))
            keys = ("delay", "delay_fraction", "delay_where", "nccl_algo", "nccl_buffsize")
            lines.append(f"# {b['label']}: " + ", ".join(f"{k}={cfg[k]}" for k in keys if k in cfg))
    for d in record.get("injected_delay", []):
        lines.append(f"# {d['backend']} injected delay on {d['collective']} (rank 0, delaycomm telemetry): "
                     f"{d['delayed_calls']} of {d['calls']} calls delayed, p50 {d['p50_us']:.0f} us, "
                     f"p99 {d['p99_us']:.0f} us, max {d['max_us']:.0f} us")
    lines.append("# p50/p99: percentiles of per-call time, a call's time being the max over ranks; "
                 "algbw = size / p50; busbw = algbw x bus factor (docs/bench.md)")
    if raw:
        lines.append(f"# ratio: median over repeats of p50(backend) / p50({raw}), measured interleaved in this run")
    return lines


def format_table(record: dict[str, Any]) -> str:
    """The whole report of a run record: header, one table per collective, skipped sizes, stability warnings."""
    stats = row_stats(record)
    labels = [b["label"] for b in record["settings"]["backends"]]
    raw = raw_label(record)
    out = header_lines(record)
    for coll in dict.fromkeys(r.collective for r in stats):
        spec = collectives.get(coll)
        rows = [r for r in stats if r.collective == coll]
        by = {(r.size_bytes, r.backend): r for r in rows}
        groups = [(label, backend_columns()) for label in labels]
        ratios = [label for label in labels if raw and label != raw]
        out.append("#")
        out.append(f"# {coll}: busbw factor {spec.factor_text}, n = {record['world_size']}")
        ratio_cols = [dataclasses.replace(RATIO, width=max(RATIO.width, len(label) + 1)) for label in ratios]
        bar = " " * sum(c.width + 1 for c in COMMON)
        for label, cols in groups:
            w = sum(c.width + 1 for c in cols) - 1
            bar += " " + f" {label} ".center(w, "-")
        names = [c.name for c in COMMON]
        units = [c.unit for c in COMMON]
        widths = [c.width for c in COMMON]
        for _, cols in groups:
            names += [c.name for c in cols]
            units += [c.unit for c in cols]
            widths += [c.width for c in cols]
        if ratios:
            bar += " " + " ".join(f"{'/' + raw:>{c.width}}" for c in ratio_cols)
            names += [label for label in ratios]
            units += [RATIO.unit for _ in ratios]
            widths += [c.width for c in ratio_cols]
        out.append("#" + bar[1:])
        out.append("#" + " ".join(f"{n:>{w}}" for n, w in zip(names, widths))[1:])
        out.append("#" + " ".join(f"{u:>{w}}" for u, w in zip(units, widths))[1:])
        for size in dict.fromkeys(r.size_bytes for r in rows):
            first = next(r for r in rows if r.size_bytes == size)
            cells = [c.render(first) for c in COMMON]
            for label, cols in groups:
                cells += [c.render(by.get((size, label))) for c in cols]
            cells += [c.render(by.get((size, label))) for c, label in zip(ratio_cols, ratios)]
            out.append(" ".join(cells))
    for sk in record.get("skipped", []):
        out.append(f"# skipped {sk['collective']} {format_size(sk['size_bytes'])}: {sk['reason']}")
    wrong = sum(r.wrong or 0 for r in stats)
    if any(r.wrong is not None for r in stats):
        out.append(f"# #wrong in total: {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    out.extend(stability_warnings(stats))
    if "elapsed_s" in record:
        out.append(f"# measured in {record['elapsed_s']:.1f} s")
    return "\n".join(out)


def stability_warnings(stats: list[RowStats], limit: int = 5) -> list[str]:
    """Rows whose repeats disagree by more than 10%, worst first, with what to do about it."""
    shaky = sorted((r for r in stats if len(r.repeat_p50_us) > 1 and r.spread > SPREAD_WARN),
                   key=lambda r: r.spread, reverse=True)
    if not shaky:
        return []
    lines = [f"# warning: {len(shaky)} of {len(stats)} rows vary by more than {SPREAD_WARN:.0%} between repeats "
             "(p50 max-min over median); the numbers are unstable: rerun on an idle machine, or with a larger "
             "-n or --repeats"]
    for r in shaky[:limit]:
        lines.append(f"#   {r.collective} {format_size(r.size_bytes)} {r.backend}: {r.spread:.0%} "
                     f"(p50 per repeat: {', '.join(f'{x:.1f}' for x in r.repeat_p50_us)} us)")
    return lines
