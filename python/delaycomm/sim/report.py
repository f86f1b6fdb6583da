"""Reporting: one column schema drives the text table, the JSON and the checks.

Measuring lives in :mod:`.engine`; this module only reads :class:`RunResult`
objects. Plots import matplotlib lazily (Agg backend) so the simulator itself
needs NumPy only.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from delaycomm._tools import output, table
from delaycomm._tools.machine import machine_info, versions

from .engine import RunResult

__all__ = [
    "COLUMNS",
    "Column",
    "Row",
    "format_table",
    "plot_loss",
    "plot_staleness",
    "result_record",
    "write_json",
]


@dataclasses.dataclass(frozen=True)
class Column:
    """One reported metric.

    Attributes:
        key: JSON field name (unit-suffixed where it has a unit).
        header: Table header.
        unit: Unit shown under the header (``-`` if none).
        value: Extracts the metric from a run.
        digits: Decimals in the table.
    """

    key: str
    header: str
    unit: str
    value: Callable[[RunResult], float]
    digits: int


COLUMNS: tuple[Column, ...] = (
    Column("updates", "updates", "count", lambda r: r.updates, 0),
    Column("updates_per_s", "updates/sec", "1/s", lambda r: r.updates_per_sec, 2),
    Column("mean_staleness", "mean stale", "updates", lambda r: r.mean_staleness, 2),
    Column("max_staleness", "max stale", "updates", lambda r: r.max_staleness, 0),
    Column("final_loss", "final loss", "log-loss", lambda r: r.final_loss, 4),
)


@dataclasses.dataclass
class Row:
    """One table row: a configuration run with one or more seeds.

    Attributes:
        name: Row label.
        runs: One result per seed.
        published: Published values by column key, if any (a reference row).
        extra: Additional columns (key -> (header, unit, values per seed, digits)).
    """

    name: str
    runs: list[RunResult]
    published: dict[str, float] | None = None
    extra: dict[str, tuple[str, str, list[float], int]] = dataclasses.field(default_factory=dict)

    def values(self, column: Column) -> np.ndarray:
        """The column's value for every seed."""
        return np.array([column.value(r) for r in self.runs], dtype=np.float64)


def _cell(values: np.ndarray, digits: int) -> str:
    mean = float(values.mean())
    if values.size == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ±{float(values.std(ddof=1)):.{max(digits, 1)}f}"


def format_table(rows: Sequence[Row], columns: Sequence[Column] = COLUMNS, title: str = "") -> str:
    """Render rows as a fixed-width text table with a units line (the tools' layout, :mod:`delaycomm._tools.table`).

    With several seeds a cell is ``mean ±sd`` (sample standard deviation);
    a row with ``published`` values is followed by a ``  published`` line.

    Args:
        rows: The rows.
        columns: The columns, in order.
        title: Optional first column header.

    Returns:
        The table, lines joined with newlines, no trailing newline.
    """
    extra_keys: list[str] = []
    for row in rows:
        extra_keys += [k for k in row.extra if k not in extra_keys]
    schema = [table.Column(title, align="<")] + [table.Column(c.header, c.unit) for c in columns]
    for key in extra_keys:
        header, unit = next((r.extra[key][0], r.extra[key][1]) for r in rows if key in r.extra)
        schema.append(table.Column(header, unit))
    body: list[list[str]] = []
    for row in rows:
        cells = [row.name] + [_cell(row.values(c), c.digits) for c in columns]
        for key in extra_keys:
            if key in row.extra:
                _, _, vals, digits = row.extra[key]
                cells.append(_cell(np.asarray(vals, dtype=np.float64), digits))
            else:
                cells.append("")
        body.append(cells)
        if row.published is not None:
            pub = ["  published (seed 002)"]
            for c in columns:
                v = row.published.get(c.key)
                pub.append("" if v is None else f"{v:.{c.digits}f}")
            pub += [""] * len(extra_keys)
            body.append(pub)
    return table.format_rows(schema, body)


def result_record(result: RunResult) -> dict[str, Any]:
    """A JSON-ready record of one run: metrics, settings and the curve."""
    record: dict[str, Any] = {c.key: _jsonable(c.value(result)) for c in COLUMNS}
    cfg = dataclasses.asdict(result.config)
    record.update(
        model=result.label,
        dropped=result.dropped,
        staleness_bound=None if math.isinf(result.bound) else result.bound,
        worker_updates=result.worker_updates,
        blocked_s=[round(b, 6) for b in result.blocked_seconds],
        staleness_histogram=np.bincount(result.staleness).tolist() if result.staleness.size else [],
        curve_time_s=result.curve_time.tolist(),
        curve_loss=result.curve_loss.tolist(),
        config=cfg,
    )
    return record


def _jsonable(value: float) -> float | int:
    if isinstance(value, (int, np.integer)):
        return int(value)
    return float(value)


def write_json(path: str, payload: dict[str, Any]) -> None:
    """Write ``payload`` with argv and versions to ``path`` atomically (``-`` for stdout).

    Args:
        path: Destination file, or ``-``.
        payload: The measurements.
    """
    output.write_json(path, {"argv": sys.argv, "versions": versions(("numpy",)), "machine": machine_info(), **payload})


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_loss(
    series: Sequence[tuple[str, Sequence[RunResult]]], path: str, title: str, optimum: float | None = None
) -> str:
    """Plot loss against simulated wall clock, one line per series.

    The line is the first seed's run; with several seeds a band shows the
    min-max range over seeds.

    Args:
        series: ``(label, runs)`` pairs.
        path: PNG file to write (parent directories are created).
        title: Figure title.
        optimum: Optimal loss, drawn as a dotted line when given.

    Returns:
        ``path``.
    """
    plt = _pyplot()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for label, runs in series:
        t = runs[0].curve_time
        (line,) = ax.plot(t, runs[0].curve_loss, label=label, lw=1.3)
        if len(runs) > 1:
            stack = np.stack([r.curve_loss for r in runs])
            ax.fill_between(t, stack.min(0), stack.max(0), color=line.get_color(), alpha=0.15, lw=0)
    if optimum is not None:
        ax.axhline(optimum, color="k", ls=":", lw=1, label=f"optimum {optimum:.4f}")
    ax.set_xlabel("simulated wall clock (s)")
    ax.set_ylabel("training log-loss")
    ax.set_title(title)
    lows = [float(np.min(r.curve_loss)) for _, runs in series for r in runs]
    if lows:
        floor = min(lows + ([optimum] if optimum is not None else []))
        ax.set_ylim(floor - 0.005, floor + 0.12)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_staleness(series: Sequence[tuple[str, Sequence[RunResult]]], path: str, title: str) -> str:
    """Plot the staleness histogram of each series (all seeds pooled).

    Args:
        series: ``(label, runs)`` pairs.
        path: PNG file to write.
        title: Figure title.

    Returns:
        ``path``.
    """
    plt = _pyplot()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig, axes = plt.subplots(1, len(series), figsize=(3.2 * len(series), 3.2), squeeze=False)
    for ax, (label, runs) in zip(axes[0], series):
        stale = np.concatenate([r.staleness for r in runs])
        hi = int(stale.max()) if stale.size else 0
        ax.hist(stale, bins=np.arange(-0.5, hi + 1.5, 1.0), color="tab:blue")
        ax.set_yscale("log")
        ax.set_xlim(-0.5, max(hi, 5) + 0.5)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_title(f"{label}\nmax {hi}", fontsize=9)
        ax.set_xlabel("staleness (updates)")
    axes[0][0].set_ylabel("arrivals")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
