"""Summaries, table and plot from synthetic rank results (exact expected values; no processes)."""

from __future__ import annotations

import pytest

from delaycomm.experiment.configs import CONFIGS
from delaycomm.experiment.summary import COLUMNS, format_table, plot, summarize

BY_NAME = {c.name: c for c in CONFIGS}


def _rank(rank, losses, step_s, end_s, ar_p50_us, ar_p99_us, delayed=0, staleness=None, final=0.5):
    return {
        "rank": rank,
        "pid": 100 + rank,
        "wall_s": end_s[-1],
        "steps": len(losses),
        "steps_per_epoch": 2,
        "losses": losses,
        "step_s": step_s,
        "end_s": end_s,
        "epochs": [
            {"epoch": 1, "step": 2, "t_s": end_s[1], "test_loss": 1.0, "test_accuracy": 0.5},
            {"epoch": 2, "step": 4, "t_s": end_s[3], "test_loss": 0.8, "test_accuracy": 0.75},
        ],
        "initial_train_loss": 2.0,
        "final_train_loss": final,
        "train_accuracy": 0.8,
        "test_loss": 0.8,
        "test_accuracy": 0.75,
        "stopped_by_budget": False,
        "stats": {
            "ops": {
                "allreduce": {
                    "calls": 4,
                    "delayed_calls": delayed,
                    "latency": {"p50_us": ar_p50_us, "p99_us": ar_p99_us},
                }
            },
            "staleness": staleness or {"steps": 0},
            "slowdown": {"calls": 2 * rank, "blocked": {"count": 2 * rank, "mean_ms": 3.0}},
        },
    }


def _stale(steps, fresh, stale, dropped, mean, count, mx, blocked):
    return {
        "steps": steps,
        "fresh": fresh,
        "stale": stale,
        "dropped": dropped,
        "blocked_ms": blocked,
        "stale_fresh_ratio": stale / fresh,
        "staleness": {"count": count, "mean": mean, "max": mx},
    }


def test_summarize_combines_ranks_as_documented():
    ranks = [
        _rank(
            0,
            [2.0, 1.0, 0.5, 0.25],
            [0.001, 0.004, 0.002, 0.010],
            [0.1, 0.2, 0.3, 0.4],
            100.0,
            900.0,
            delayed=1,
            staleness=_stale(4, 6, 3, 1, 1.5, 3, 2.0, 5.0),
        ),
        _rank(
            1,
            [2.2, 1.2, 0.7, 0.45],
            [0.003, 0.002, 0.002, 0.001],
            [0.1, 0.25, 0.3, 0.5],
            300.0,
            500.0,
            delayed=2,
            staleness=_stale(4, 6, 3, 1, 1.5, 3, 2.0, 7.5),
        ),
    ]
    run = {"status": "ok", "message": "", "options": {"staleness": "ssp:2"}, "startup_s": 0.2, "ranks": ranks}
    rec = summarize(BY_NAME["ssp2-ema"], run)
    m = rec["metrics"]
    assert rec["status"] == "ok"
    assert m["steps"] == 4 and m["epochs"] == 2
    assert m["wall_s"] == 0.5 and m["steps_per_s"] == 8.0
    assert m["initial_train_loss"] == 2.0 and m["final_train_loss"] == 0.5 and m["loss_fell"] is True
    # slowest rank per step: [3, 4, 2, 10] ms
    assert m["step_p50_ms"] == pytest.approx(3.5)
    assert m["step_p99_ms"] == pytest.approx(4.0 + 0.97 * (10.0 - 4.0))  # numpy's linear interpolation
    assert m["allreduce_p50_ms"] == pytest.approx(0.3) and m["allreduce_p99_ms"] == pytest.approx(0.9)
    assert m["allreduce_calls"] == 8 and m["delayed_calls"] == 3
    assert m["slowed_calls"] == 2 and m["slowdown_wait_s"] == pytest.approx(0.006)
    # the group's counts (equal on every rank), not a sum over ranks; blocked time: the largest rank's
    st = m["staleness"]
    assert (st["steps"], st["fresh"], st["stale"], st["dropped"]) == (4, 6, 3, 1)
    assert st["stale_fresh_ratio"] == 0.5
    assert st["staleness_mean_steps"] == 1.5 and st["staleness_max_steps"] == 2.0
    assert st["blocked_ms"] == 7.5
    assert rec["curves"]["loss"] == pytest.approx([2.1, 1.1, 0.6, 0.35])
    assert rec["curves"]["t_s"] == [0.1, 0.25, 0.3, 0.5]
    assert "losses" not in rec["ranks"][0]


def test_a_config_whose_option_left_no_trace_is_unavailable_and_shows_no_numbers():
    ranks = [_rank(r, [2.0, 1.0, 0.5, 0.25], [0.001] * 4, [0.1, 0.2, 0.3, 0.4], 100.0, 200.0) for r in (0, 1)]
    run = {
        "status": "ok",
        "message": "",
        "options": {"delay": "exp:p99=40ms", "seed": 0},
        "startup_s": 0.1,
        "ranks": ranks,
    }
    rec = summarize(BY_NAME["bsp-delay"], run)
    assert rec["status"] == "unavailable"
    assert rec["message"] == (
        "not in effect in this build: delay='exp:p99=40ms' was set but no rank recorded a delayed call"
    )
    table = format_table([rec])
    row = table.splitlines()[2]
    assert row.split()[:3] == ["bsp-delay", "unavailable", "-"]
    assert set(row.split()[2:]) == {"-"}
    assert table.splitlines()[-1] == "# bsp-delay: " + rec["message"]


def test_table_columns_line_up():
    ranks = [_rank(r, [2.0, 1.0, 0.5, 0.25], [0.001] * 4, [0.1, 0.2, 0.3, 0.4], 100.0, 200.0) for r in (0, 1)]
    ok = summarize(
        BY_NAME["bsp"], {"status": "ok", "message": "", "options": {"seed": 0}, "startup_s": 0.1, "ranks": ranks}
    )
    failed = summarize(
        BY_NAME["gloo"],
        {"status": "failed", "message": "rank 1: RuntimeError: boom", "options": {}, "startup_s": None, "ranks": []},
    )
    lines = format_table([ok, failed], ["first header"]).splitlines()
    assert lines[0] == "# first header"
    names, units, row_ok, row_failed = lines[1:5]
    assert lines[5] == "# gloo: rank 1: RuntimeError: boom"
    # every column's right edge is the same in the header, the units row and the rows
    width = sum(c.width for c in COLUMNS) + 2 * (len(COLUMNS) - 1) + 2
    assert len(names) == len(row_ok) == width
    assert row_ok.split()[:3] == ["bsp", "ok", "75.0"]
    assert row_failed.split() == ["gloo", "failed"] + ["-"] * (len(COLUMNS) - 2)
    assert units.split()[:2] == ["#", "(%)"]


def test_plot_writes_a_png(tmp_path):
    ranks = [_rank(r, [2.0, 1.0, 0.5, 0.25], [0.001] * 4, [0.1, 0.2, 0.3, 0.4], 100.0, 200.0) for r in (0, 1)]
    rec = summarize(
        BY_NAME["bsp"], {"status": "ok", "message": "", "options": {"seed": 0}, "startup_s": 0.1, "ranks": ranks}
    )
    path = tmp_path / "p.png"
    plot([rec], str(path), "title")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
