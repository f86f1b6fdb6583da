"""Statistics, bandwidths and the table, computed by hand on records with known times."""

import json
import math

import pytest

from delaycomm.bench import results
from delaycomm.bench.report import format_table
from delaycomm.bench.results import BenchFileError, bandwidths, percentile, row_stats

from .helpers import make_record


@pytest.mark.parametrize(
    "values, q, expected",
    [
        ([5.0], 50, 5.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
        ([1.5, 2.0, 3.0, 10.0], 99, 3.0 + 0.97 * 7.0),
        ([3.0, 1.0, 2.0], 0, 1.0),
        ([3.0, 1.0, 2.0], 100, 3.0),
        (list(range(101)), 99, 99.0),
    ],
)
def test_percentile_is_linear_interpolation(values, q, expected):
    assert percentile([float(v) for v in values], q) == pytest.approx(expected)


def test_percentile_of_nothing_raises():
    with pytest.raises(ValueError, match="percentile of no values"):
        percentile([], 50)


@pytest.mark.parametrize(
    "collective, n, factor",
    [
        ("all_reduce", 2, 1.0),
        ("all_reduce", 4, 1.5),
        ("all_reduce", 8, 1.75),
        ("all_gather", 4, 0.75),
        ("reduce_scatter", 2, 0.5),
        ("broadcast", 8, 1.0),
        ("all_to_all", 4, 0.75),
        ("all_reduce", 1, 0.0),
    ],
)
def test_busbw_factor_per_collective(collective, n, factor):
    algbw, busbw = bandwidths(1_000_000, 1000.0, collective, n)  # 1 MB in 1 ms
    assert algbw == pytest.approx(1.0)  # GB/s
    assert busbw == pytest.approx(factor)


def test_row_stats_pool_repeats_and_take_median_ratio():
    # 2 repeats x 4 calls. delaycomm's per-repeat p50: 2.5, 5.0; gloo's: 2.0, 2.0 -> ratios 1.25, 2.5.
    rec = make_record(
        {
            ("all_reduce", 4096, "delaycomm"): [[1.0, 2.0, 3.0, 4.0], [4.0, 5.0, 5.0, 6.0]],
            ("all_reduce", 4096, "gloo"): [[1.0, 2.0, 2.0, 3.0], [2.0, 2.0, 2.0, 2.0]],
        },
        world_size=4,
    )
    dc, gloo = row_stats(rec)
    assert dc.p50_us == pytest.approx(4.0)  # pooled: 1 2 3 4 4 5 5 6
    assert dc.p99_us == pytest.approx(5.0 + 0.93 * 1.0)  # h = 7 * 0.99 = 6.93
    assert dc.repeat_p50_us == (2.5, 5.0)
    assert dc.repeat_ratios == pytest.approx((1.25, 2.5))
    assert dc.ratio == pytest.approx(1.875)
    assert gloo.ratio is None
    assert dc.algbw_GBps == pytest.approx(4096 / 4e-6 / 1e9)
    assert dc.busbw_GBps == pytest.approx(dc.algbw_GBps * 1.5)  # 2(n-1)/n at n = 4
    assert dc.spread == pytest.approx(2.5 / 3.75)


def test_table_has_every_column_and_the_numbers():
    rec = make_record(
        {
            ("all_reduce", 8, "delaycomm"): [[10.0, 12.0, 14.0]],
            ("all_reduce", 8, "gloo"): [[10.0, 10.0, 10.0]],
        }
    )
    text = format_table(rec)
    for word in (
        "size",
        "count",
        "type",
        "redop",
        "p50",
        "p99",
        "algbw",
        "busbw",
        "#wrong",
        "ratio",
        "(us)",
        "(GB/s)",
        "delaycomm",
        "gloo",
    ):
        assert word in text
    row = next(line for line in text.splitlines() if line.strip().startswith("8 "))
    cells = row.split()
    assert cells[:4] == ["8", "2", "float32", "sum"]
    assert cells[4] == "12.0" and cells[5] == f"{12.0 + 0.98 * 2.0:.1f}"  # delaycomm p50, p99
    assert cells[-1] == "1.200"  # ratio


def test_save_then_load_round_trips_and_adds_derived_fields(tmp_path):
    rec = make_record({("broadcast", 64, "delaycomm"): [[1.0, 3.0]], ("broadcast", 64, "gloo"): [[1.0, 1.0]]})
    path = tmp_path / "run.json"
    results.save(rec, str(path))
    data = json.loads(path.read_text())
    dc = next(r for r in data["rows"] if r["backend"] == "delaycomm")
    assert dc["p50_us"] == 2.0 and dc["ratio"] == 2.0 and dc["busbw_GBps"] == pytest.approx(64 / 2e-6 / 1e9)
    assert row_stats(results.load(str(path))) == row_stats(rec)


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"format": "something-else"}', "'format' is 'something-else'"),
        ("", "not valid JSON"),
    ],
)
def test_load_rejects_corrupt_files(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(BenchFileError, match=f"bad.json: .*{message}"):
        results.load(str(path))


def test_load_rejects_bad_rows(tmp_path):
    rec = make_record({("all_reduce", 8, "delaycomm"): [[1.0]], ("all_reduce", 8, "gloo"): [[1.0]]})
    rec["rows"][0]["times_us"] = [[1.0, math.nan]]
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(rec))  # json writes NaN, which Python's json reads back
    with pytest.raises(BenchFileError, match=r"rows\[0\]: 'times_us' must be"):
        results.load(str(path))
    rec["rows"][0]["times_us"] = [[1.0]]
    rec["rows"][0]["collective"] = "all_reduce_typo"
    path.write_text(json.dumps(rec))
    with pytest.raises(BenchFileError, match=r"unknown collective 'all_reduce_typo'"):
        results.load(str(path))


def test_load_missing_file(tmp_path):
    with pytest.raises(BenchFileError, match="no such file"):
        results.load(str(tmp_path / "nope.json"))
