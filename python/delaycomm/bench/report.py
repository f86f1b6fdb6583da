"""The table: a ``#`` header with versions and settings, then fixed columns generated from one schema.

One row per size; the backends side by side (a group of columns each), then the ratio of each delaycomm backend
to the raw one. Header, units and cells all come from :data:`COMMON`, :func:`backend_columns` and :func:`ratio_column`
(rendered by :mod:`delaycomm._tools.table`), so labels and formats cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from delaycomm._tools.table import Column, format_rows
from delaycomm.bench import collectives
from delaycomm.bench.results import RowStats, raw_label, row_stats
from delaycomm.bench.units import format_size

__all__ = ["format_table", "stability_warnings", "COMMON", "backend_columns", "ratio_column"]

# A row's spread of per-repeat p50s above this is reported with advice (pyperf-style stability warning).
SPREAD_WARN = 0.10


COMMON = (
    Column("size", "B", lambda r: r.size_bytes, width=12),
    Column("count", "elements", lambda r: r.count, width=12),
    Column("type", "", lambda r: r.dtype, width=9),
    Column("redop", "", lambda r: r.redop, width=6),
)


def backend_columns(label: str = "") -> tuple[Column, ...]:
    """The columns of one backend's group (under a ``--- label ---`` bar)."""
    return (
        Column("p50", "us", lambda r: r.p50_us, "{:.1f}", 10, group=label, missing="N/A"),
        Column("p99", "us", lambda r: r.p99_us, "{:.1f}", 10, group=label, missing="N/A"),
        Column("algbw", "GB/s", lambda r: r.algbw_GBps, "{:.3f}", 8, group=label, missing="N/A"),
        Column("busbw", "GB/s", lambda r: r.busbw_GBps, "{:.3f}", 8, group=label, missing="N/A"),
        Column("#wrong", "", lambda r: r.wrong, width=7, group=label, missing="N/A"),
    )


def target_columns(record: dict[str, Any], label: str) -> tuple[Column, ...]:
    """The profile's p50 and p99 per size for backend ``label`` when it replays a profile (docs/profile.md), each
    with the error of the backend's measured one (measured / profile - 1, in %), under a ``--- label: profile ---``
    bar; none otherwise."""
    targets = {
        (t["collective"], t["size_bytes"]): t for t in record.get("profile_targets", []) if t["backend"] == label
    }
    if not targets:
        return ()

    def get(key: str):
        return lambda r: targets[(r.collective, r.size_bytes)][key] if (r.collective, r.size_bytes) in targets else None

    def err(key: str):
        def cell(r):
            target, got = get(f"{key}_us")(r), getattr(r, f"{key}_us")
            return None if not target or got is None else 100.0 * (got / target - 1.0)

        return cell

    group = f"{label}: profile"
    return (
        Column("p50", "us", get("p50_us"), "{:.1f}", 10, group=group, missing="N/A"),
        Column("err p50", "%", err("p50"), "{:+.0f}", 8, group=group, missing="N/A"),
        Column("p99", "us", get("p99_us"), "{:.1f}", 10, group=group, missing="N/A"),
        Column("err p99", "%", err("p99"), "{:+.0f}", 8, group=group, missing="N/A"),
    )


def ratio_column(label: str, raw: str) -> Column:
    """The ratio of backend ``label`` to the raw one (under a ``/raw`` bar)."""
    return Column(label, "x raw", lambda r: r.ratio, "{:.3f}", 8, group=f"/{raw}", missing="N/A")


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
            keys = (
                "delay",
                "delay_fraction",
                "delay_mode",
                "delay_carrier",
                "delay_where",
                "nccl_algo",
                "nccl_buffsize",
            )
            lines.append(f"# {b['label']}: " + ", ".join(f"{k}={cfg[k]}" for k in keys if k in cfg))
    for d in record.get("injected_delay", []):
        lines.append(
            f"# {d['backend']} injected delay on {d['collective']} (rank 0, delaycomm telemetry): "
            f"{d['delayed_calls']} of {d['calls']} calls delayed, p50 {d['p50_us']:.0f} us, "
            f"p99 {d['p99_us']:.0f} us, max {d['max_us']:.0f} us"
        )
    lines.append(
        "# p50/p99: percentiles of per-call time, a call's time being the max over ranks; "
        "algbw = size / p50; busbw = algbw x bus factor (docs/benchmark.md)"
    )
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
        # (column, the backend whose row it reads; None: any row of the size)
        schema: list[tuple[Column, str | None]] = [(c, None) for c in COMMON]
        for label in labels:
            schema += [(c, label) for c in backend_columns(label)]
        for label in labels:
            schema += [(c, label) for c in target_columns(record, label)]
        for label in labels:
            if raw and label != raw:
                schema.append((ratio_column(label, raw), label))
        cells = []
        for size in dict.fromkeys(r.size_bytes for r in rows):
            first = next(r for r in rows if r.size_bytes == size)
            row = []
            for c, label in schema:
                r = first if label is None else by.get((size, label))
                row.append("-" if r is None else c.text(r))
            cells.append(row)
        out.append("#")
        out.append(
            format_rows(
                [c for c, _ in schema],
                cells,
                sep=" ",
                header=[f"{coll}: busbw factor {spec.factor_text}, n = {record['world_size']}"],
            )
        )
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
    shaky = sorted(
        (r for r in stats if len(r.repeat_p50_us) > 1 and r.spread > SPREAD_WARN), key=lambda r: r.spread, reverse=True
    )
    if not shaky:
        return []
    lines = [
        f"# warning: {len(shaky)} of {len(stats)} rows vary by more than {SPREAD_WARN:.0%} between repeats "
        "(p50 max-min over median); the numbers are unstable: rerun on an idle machine, or with a larger "
        "-n or --repeats"
    ]
    for r in shaky[:limit]:
        lines.append(
            f"#   {r.collective} {format_size(r.size_bytes)} {r.backend}: {r.spread:.0%} "
            f"(p50 per repeat: {', '.join(f'{x:.1f}' for x in r.repeat_p50_us)} us)"
        )
    return lines
