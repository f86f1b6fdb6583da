"""From records to statistics, tables and plots (synthetic records, exact expected values; no processes)."""

from __future__ import annotations

import pytest

from delaycomm.experiment import stats as st
from delaycomm.experiment.analysis import analyze, format_delaycomm, format_errors, format_stats, plot_study


def _rec(config, seed, loss, acc, status="ok", ratio=None, curve=None):
    return {
        "config": config,
        "seed": seed,
        "status": status,
        "message": "" if status == "ok" else "exit code 1: rank 0: ValueError: x",
        "metrics": {"loss": loss, "acc": acc} if status == "ok" else {},
        "curves": {"loss": curve or [[1, loss + 1.0], [2, loss]]} if status == "ok" else {},
        "delaycomm": {"delayed_calls": 10, "staleness": {"stale_fresh_ratio": ratio}} if ratio is not None else None,
    }


RECORDS = [
    _rec("gloo", 0, 1.0, 0.90),
    _rec("gloo", 1, 1.2, 0.92),
    _rec("gloo", 2, 1.1, 0.91),
    _rec("stale", 0, 1.3, 0.90, ratio=0.4),
    _rec("stale", 1, 1.5, 0.92, ratio=0.5),
    _rec("stale", 2, 1.45, 0.91, ratio=0.45),
    _rec("broken", 0, 0, 0, status="failed"),
    _rec("broken", 1, 2.0, 0.5),
]


def test_analyze_pairs_by_seed_and_decides_from_the_interval():
    doc = analyze(RECORDS, ["gloo", "stale", "broken"], "gloo")
    assert doc["metrics"] == {"loss": st.LOWER, "acc": st.HIGHER}
    gloo, stale, broken = doc["configs"]
    assert gloo["metrics"]["loss"]["mean"] == pytest.approx(1.1) and gloo["vs_baseline"] == {}
    p = stale["vs_baseline"]["loss"]
    assert p["seeds"] == [0, 1, 2] and p["mean"] == pytest.approx(0.3166666666)
    assert p["verdict"] == "worse"
    assert stale["vs_baseline"]["acc"]["identical"] and stale["vs_baseline"]["acc"]["verdict"] == "no difference shown"
    assert stale["delaycomm"]["stale_fresh_ratio"]["mean"] == pytest.approx(0.45)
    assert broken["runs"] == 2 and broken["ok"] == 1
    assert broken["errors"] == [{"seed": 0, "status": "failed", "message": "exit code 1: rank 0: ValueError: x"}]
    assert broken["vs_baseline"]["loss"]["verdict"] == "not enough seeds"
    band = stale["curves"]["loss"]
    assert band["step"] == [1, 2] and band["mean"] == pytest.approx([2.4166666, 1.4166666]) and band["n"] == 3


def test_tables_and_error_lines():
    doc = analyze(RECORDS, ["gloo", "stale", "broken"], "gloo")
    table = format_stats(doc, ["header"]).splitlines()
    assert table[0] == "# header"
    rows = {tuple(line.split()[:2]): line.split() for line in table[2:]}
    assert rows[("gloo", "loss")][-1] == "(baseline)"
    assert rows[("stale", "loss")][2:5] == ["lower", "3", "1.417"] and rows[("stale", "loss")][-1] == "worse"
    assert " ".join(rows[("stale", "acc")][-3:]) == "no difference shown"
    assert " ".join(rows[("broken", "loss")][-3:]) == "not enough seeds"
    tel = format_delaycomm(doc).splitlines()
    assert tel[-2].split()[:5] == ["stale", "3/3", "10", "-", "0.45"]
    assert format_errors(RECORDS) == ["# broken seed 0: failed: exit code 1: rank 0: ValueError: x"]


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "s.png"
    plot_study(analyze(RECORDS, ["gloo", "stale", "broken"], "gloo"), str(path), "title")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
