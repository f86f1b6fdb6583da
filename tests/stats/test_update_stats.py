"""The staleness engine's opt-in update statistics (update_stats, docs/telemetry.md "Update statistics"): exact
sums on a schedule where every contribution is late by the same number of steps, and off by default."""

from __future__ import annotations

import pytest
import torch

import delaycomm
from tests.harness import run_threads

STEPS = 8


# Every contribution is delayed 5 ms = 3 steps of 2 ms (ssp:4: no gate wait). Step 0 of a key defers nothing, so
# it sends its fresh gradient; steps 1, 2 and 3 send nothing (their own is stashed, nothing is due yet); from step 4
# on each rank sends its stash of 3 steps before, which is its fresh gradient again (the same values every step).
LATE = dict(delay="const:5ms", delay_fraction=1.0, staleness="ssp:4", stale_policy="apply", step_ms=2.0)


@pytest.mark.parametrize(
    "average,dtype", [(False, torch.float32), (True, torch.float32), (True, torch.bfloat16), (False, torch.float64)]
)
def test_sums_when_every_contribution_is_three_steps_late(average, dtype):
    outs = run_threads(lambda ctx: _job_avg(ctx, average, dtype), 2, timeout=60)
    for rank, u in enumerate(outs):
        scale = 0.5 if average else 1.0
        sq = 64 * ((rank + 1) * scale) ** 2  # ||b||^2 of one step
        assert u["enabled"] is True and u["steps"] == STEPS
        assert u["fresh_sq"] == pytest.approx(STEPS * sq)
        assert u["sent_sq"] == pytest.approx((STEPS - 3) * sq)
        assert u["deviation_sq"] == pytest.approx(3 * sq)
        assert u["deviation"] == pytest.approx(3 / STEPS)
        assert u["scale"] == pytest.approx((STEPS - 3) / STEPS)


def _job_avg(ctx, average, dtype):
    g = ctx.group(update_stats=True, **LATE)
    grad = torch.full((64,), float(ctx.rank + 1), dtype=dtype)
    for _ in range(STEPS):
        delaycomm.stale_allreduce(grad.clone(), key=7, group=g, average=average)
    update = delaycomm.stats(g)["staleness"]["update"]
    delaycomm.flush(g)
    return update


def test_sums_when_the_gradient_changes_every_step():
    # The gradient of step k is (k + 1) * (rank + 1): from step 4 on the rank sends its gradient of step k - 3, so
    # c - b = -3 * (rank + 1) per element there (hand-computed below), and ||c|| / ||b|| = (k - 2) / (k + 1).
    outs = run_threads(_job_ramp, 2, timeout=60)
    for rank, u in enumerate(outs):
        unit = 64 * (rank + 1) ** 2
        assert u["steps"] == STEPS
        assert u["fresh_sq"] == pytest.approx(unit * sum((k + 1) ** 2 for k in range(STEPS)))  # 204 units
        assert u["sent_sq"] == pytest.approx(unit * (1 + 2**2 + 3**2 + 4**2 + 5**2))  # steps 0 and 4..7
        assert u["deviation_sq"] == pytest.approx(unit * (2**2 + 3**2 + 4**2 + 4 * 3**2))  # steps 1..3, 4..7
        assert u["deviation"] == pytest.approx(65 / 204)
        assert u["scale"] == pytest.approx((1 + 2 / 5 + 3 / 6 + 4 / 7 + 5 / 8) / STEPS)


def _job_ramp(ctx):
    g = ctx.group(update_stats=True, **LATE)
    for k in range(STEPS):
        delaycomm.stale_allreduce(torch.full((64,), float((k + 1) * (ctx.rank + 1))), key=9, group=g)
    update = delaycomm.stats(g)["staleness"]["update"]
    delaycomm.flush(g)
    return update


def test_off_by_default():
    outs = run_threads(lambda ctx: _job_default(ctx), 2, timeout=60)
    assert outs[0] == {
        "enabled": False,
        "steps": 0,
        "fresh_sq": 0.0,
        "sent_sq": 0.0,
        "deviation_sq": 0.0,
        "deviation": None,
        "scale": None,
    }


def _job_default(ctx):
    g = ctx.group(**LATE)
    for _ in range(3):
        delaycomm.stale_allreduce(torch.ones(8), key=1, group=g)
    out = delaycomm.stats(g)["staleness"]["update"]
    delaycomm.flush(g)
    return out


def test_reset_stats_zeroes_it():
    outs = run_threads(_job_reset, 2, timeout=60)
    assert outs[0] == (4, 0, 2)


def _job_reset(ctx):
    g = ctx.group(update_stats=True, **LATE)
    for _ in range(4):
        delaycomm.stale_allreduce(torch.ones(8), key=3, group=g)
    before = delaycomm.stats(g)["staleness"]["update"]["steps"]
    delaycomm.reset_stats(g)
    zeroed = delaycomm.stats(g)["staleness"]["update"]
    assert zeroed["fresh_sq"] == 0.0 and zeroed["deviation"] is None and zeroed["enabled"] is True
    for _ in range(2):
        delaycomm.stale_allreduce(torch.ones(8), key=3, group=g)
    after = delaycomm.stats(g)["staleness"]["update"]["steps"]
    delaycomm.flush(g)
    return before, zeroed["steps"], after


def test_under_bsp_it_warns_that_there_is_nothing_to_measure():
    with pytest.warns(RuntimeWarning, match=r"update_stats=1 measures the steps of the staleness engine, and "):
        out = run_threads(lambda ctx: delaycomm.stats(ctx.group(update_stats=True))["staleness"]["update"], 1)
    assert out[0]["enabled"] is False


def test_the_option_is_checked():
    with pytest.raises(ValueError, match=r"invalid value 'maybe' for option 'update_stats'"):
        delaycomm.resolve(delaycomm.DelayConfig(update_stats="maybe"))
    assert delaycomm.resolve(env={"DELAYCOMM_UPDATE_STATS": "on"}).update_stats is True
