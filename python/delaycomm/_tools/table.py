"""Fixed-column text tables generated from one schema, in the layout every delaycomm tool prints.

A table is a list of :class:`Column` and a list of rows. The column names, the units row and every cell come from
the schema, so labels and formats cannot drift apart (STYLE.md, "Benchmarks follow nccl-tests"). The layout::

    # <optional group bar>
    # name1   name2  ...
    # (unit)  (unit) ...
      cell    cell   ...

Header lines start with ``#`` so that the rows are the only lines a script has to parse; rows are indented by two
spaces so that their columns line up under the header's. A column is as wide as its ``width`` or its widest
cell, whichever is larger.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Column", "format_rows", "format_table", "cell_text"]

PREFIX_HEADER = "# "
PREFIX_ROW = "  "


def cell_text(value: Any, fmt: str = "{}", missing: str = "-") -> str:
    """One cell: ``missing`` for None, ``inf``/``nan`` for a non-finite float, else ``fmt.format(value)``."""
    if value is None:
        return missing
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return fmt.format(value)


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of a table.

    Attributes:
        name: the header.
        unit: the unit, shown in parentheses under the header ("" for none).
        value: how to get the cell's value from a row (None: the row is a mapping and ``key`` is looked up).
        fmt: format string of a present, finite value.
        width: the least width (the column widens to its widest cell).
        align: ``>`` right (numbers) or ``<`` left (names).
        key: the row's key when ``value`` is None (default: ``name``).
        group: a label over a run of adjacent columns with the same group (a ``--- label ---`` bar), or "".
        missing: the text of a value that is None.
    """

    name: str
    unit: str = ""
    value: Callable[[Any], Any] | None = None
    fmt: str = "{}"
    width: int = 0
    align: str = ">"
    key: str | None = None
    group: str = ""
    missing: str = "-"

    def __post_init__(self) -> None:
        if self.align not in ("<", ">"):
            raise ValueError(f"Column {self.name!r}: align must be '<' or '>', got {self.align!r}")

    def text(self, row: Any) -> str:
        """The cell of ``row`` in this column."""
        v = self.value(row) if self.value is not None else row.get(self.key or self.name)
        return cell_text(v, self.fmt, self.missing)


def format_rows(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], header: Sequence[str] = (), sep: str = "  "
) -> str:
    """A table of cells already formatted (one list of strings per row, one string per column).

    Args:
        columns: the schema (names, units, widths, alignment, groups).
        rows: the cells, ``len(columns)`` strings per row.
        header: lines printed first, each prefixed by ``# ``.
        sep: between columns.

    Returns:
        The table, lines joined by newlines, no trailing newline.

    Raises:
        ValueError: a row with the wrong number of cells.
    """
    for i, r in enumerate(rows):
        if len(r) != len(columns):
            raise ValueError(f"format_rows: row {i} has {len(r)} cells, expected {len(columns)} (one per column)")
    units = [f"({c.unit})" if c.unit else "" for c in columns]
    widths = [
        max([c.width, len(c.name), len(u)] + [len(r[i]) for r in rows]) for i, (c, u) in enumerate(zip(columns, units))
    ]

    def line(cells: Sequence[str]) -> str:
        return sep.join(f"{t:{c.align}{w}}" for t, c, w in zip(cells, columns, widths)).rstrip()

    out = [PREFIX_HEADER + h for h in header]
    if any(c.group for c in columns):
        out.append(PREFIX_HEADER + _group_bar(columns, widths, sep).rstrip())
    out.append(PREFIX_HEADER + line([c.name for c in columns]))
    if any(units):
        out.append(PREFIX_HEADER + line(units))
    out.extend(PREFIX_ROW + line(r) for r in rows)
    return "\n".join(out)


def format_table(columns: Sequence[Column], rows: Sequence[Any], header: Sequence[str] = (), sep: str = "  ") -> str:
    """A table of ``rows`` (any objects; each column's ``value`` or ``key`` reads its cell).

    Args:
        columns: the schema.
        rows: the rows.
        header: lines printed first, each prefixed by ``# ``.
        sep: between columns.

    Returns:
        The table, lines joined by newlines, no trailing newline.
    """
    return format_rows(columns, [[c.text(r) for c in columns] for r in rows], header, sep)


def _group_bar(columns: Sequence[Column], widths: Sequence[int], sep: str) -> str:
    """``--- label ---`` over each run of adjacent columns of one group; blanks over the others."""
    parts: list[str] = []
    i = 0
    while i < len(columns):
        j = i
        while j + 1 < len(columns) and columns[j + 1].group == columns[i].group:
            j += 1
        span = sum(widths[i : j + 1]) + len(sep) * (j - i)
        label = columns[i].group
        parts.append(f" {label} ".center(span, "-") if label else " " * span)
        i = j + 1
    return sep.join(parts)
