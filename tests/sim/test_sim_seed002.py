"""Seed 002's published table, reproduced within seed-to-seed noise."""

from __future__ import annotations

import pytest

from delaycomm.sim.experiments import (
    PUBLISHED,
    check_published,
    run_configs,
    seed002_config,
    seed002_rows,
    staleness_sweep_rows,
)
from delaycomm.sim.report import Row

SEEDS = range(8)


@pytest.fixture(scope="module")
def rows():
    specs = seed002_rows(SEEDS)
    sweep = staleness_sweep_rows(SEEDS, [2, 8, None])
    results = run_configs([c for _, cfgs, _ in specs + sweep for c in cfgs])
    table, k = [], 0
    for name, cfgs, published in specs:
        table.append(Row(name, results[k : k + len(cfgs)], published))
        k += len(cfgs)
    sweep_rows = []
    for name, cfgs, published in sweep:
        sweep_rows.append(Row(name, results[k : k + len(cfgs)], {"max_staleness": published}))
        k += len(cfgs)
    return table, sweep_rows


def test_every_published_number_is_within_noise(rows):
    table, sweep_rows = rows
    checks = check_published(table) + check_published(sweep_rows)
    assert len(checks) == 3 * 5 + 3
    misses = [c for c in checks if not c.ok]
    assert not misses, misses


def test_staleness_structure(rows):
    (bsp, ssp, asp), _ = rows
    assert all(r.max_staleness == 0 for r in bsp.runs)
    # The straggler's update after the others ran s steps ahead: s (N - 1) = 14 in every run.
    assert all(r.max_staleness == 2 * 7 for r in ssp.runs)
    assert all(r.max_staleness <= r.bound == 21 for r in ssp.runs)
    assert all(r.mean_staleness == pytest.approx(7, rel=0.01) for r in asp.runs)


def test_check_published_can_fail(rows):
    (bsp, _, _), _ = rows
    wrong = Row("bsp", bsp.runs, {**PUBLISHED["bsp"], "updates": 120, "final_loss": 0.2650})
    bad = {c.column for c in check_published([wrong]) if not c.ok}
    assert bad == {"updates", "final_loss"}


def test_check_published_needs_two_seeds():
    from delaycomm.sim.engine import simulate

    row = Row("bsp", [simulate(seed002_config("bsp", budget=20.0))], PUBLISHED["bsp"])
    with pytest.raises(ValueError, match=r"check_published: needs at least 2 seeds per row"):
        check_published([row])


def test_winners_reports_ties_within_noise():
    import dataclasses

    from delaycomm.sim.engine import simulate
    from delaycomm.sim.experiments import winners

    base = simulate(seed002_config("asp", budget=5.0))

    def row(name, losses):
        return Row(name, [dataclasses.replace(base, final_loss=x) for x in losses])

    # se = sd / sqrt(2) = 0.005 for each row: a tie needs |diff| <= 2 sqrt(2) 0.005 = 0.01414.
    rows = [row("a", [0.300, 0.310]), row("b", [0.314, 0.324]), row("c", [0.315, 0.325])]
    (verdict,) = winners(rows, [5.0])
    assert (verdict.best, verdict.ties) == ("a", ("b",))
    assert verdict.loss == pytest.approx(0.305)  # c is 0.015 above: distinguishable


def test_loss_at_and_peak_loss_read_the_curve():
    import dataclasses

    import numpy as np

    from delaycomm.sim.engine import simulate
    from delaycomm.sim.experiments import loss_at, peak_loss

    base = simulate(seed002_config("asp", budget=8.0))
    r = dataclasses.replace(
        base, curve_time=np.array([0.0, 2.0, 4.0, 6.0]), curve_loss=np.array([0.7, 0.5, 0.9, 0.4]), final_loss=0.45
    )
    assert loss_at(r, 3.0) == pytest.approx(0.7)  # halfway between 0.5 and 0.9
    assert loss_at(r, 8.0) == 0.45  # at the budget: the final loss
    assert peak_loss(r, 3.0) == 0.9
    assert peak_loss(r, 5.0) == 0.45  # the final loss counts when it is the worst
