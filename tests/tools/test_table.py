"""The tools' table: header, units and cells from one schema; columns line up whatever the cells."""

from __future__ import annotations

import math

import pytest

from delaycomm._tools.table import Column, cell_text, format_rows, format_table

COLUMNS = (
    Column("name", align="<", key="name"),
    Column("p50", "us", key="p50", fmt="{:.1f}", width=8),
    Column("calls", key="calls", group="counts"),
    Column("errors", key="errors", group="counts"),
)


def test_header_units_and_rows_line_up():
    rows = [
        {"name": "allreduce", "p50": 12.345, "calls": 10, "errors": 0},
        {"name": "broadcast_with_a_long_name", "p50": None, "calls": 123456789, "errors": 2},
    ]
    lines = format_table(COLUMNS, rows, header=["title line"]).splitlines()
    assert lines[0] == "# title line"
    bar, names, units, r0, r1 = lines[1:]
    assert names.split() == ["#", "name", "p50", "calls", "errors"]
    assert units.split() == ["#", "(us)"]
    assert r0.split() == ["allreduce", "12.3", "10", "0"] and r1.split() == [
        "broadcast_with_a_long_name",
        "-",
        "123456789",
        "2",
    ]
    # every right-aligned column ends at the same place in the header and the rows; the name column widened
    for word in ("p50", "calls", "errors"):
        end = names.index(word) + len(word)
        assert r0[end - 1] != " " and r1[end - 1] != " " and (len(r0) == end or r0[end] == " ")
    assert r1.startswith("  broadcast_with_a_long_name  ")
    assert bar.startswith("# ") and "counts" in bar and bar.index("counts") > names.index("p50")
    assert len(names) == len(r0) == len(r1)


def test_the_least_width_holds_when_cells_are_narrow():
    text = format_rows([Column("x", width=6)], [["1"]])
    assert text.splitlines() == ["#      x", "       1"]


def test_a_row_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="row 0 has 1 cells, expected 2"):
        format_rows([Column("a"), Column("b")], [["1"]])


def test_bad_alignment_is_refused():
    with pytest.raises(ValueError, match=r"^Column 'a': align must be '<' or '>', got '\^'$"):
        Column("a", align="^")


@pytest.mark.parametrize(
    "value, text", [(None, "-"), (math.inf, "inf"), (-math.inf, "-inf"), (math.nan, "nan"), (1.25, "1.2"), (3, "3.0")]
)
def test_cell_text(value, text):
    assert cell_text(value, "{:.1f}") == text
