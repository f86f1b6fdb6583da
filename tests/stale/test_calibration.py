"""step_ms=auto and keys (docs/staleness.md): calibration on the first stream that recurs, the same on every rank,
and the steps at which no contribution is fresh (n_fresh = 0), per policy, found by computing the schedule.

These run with step_ms=auto (the default), so they exercise the calibration a user gets.
"""

from __future__ import annotations

import warnings
from datetime import timedelta

import numpy as np
import pytest

from tests.harness import run_procs
from tests.stale.test_engine import reference

pytestmark = [pytest.mark.multiproc]

KEY = 3
STEPS = 30
# step_ms=auto: the first key called CALIBRATION + 1 times is measured; its step CALIBRATION is the first deferred.
CALIBRATION = 5
DELAY = "const:1ms"
FRACTION = 0.5


def _schedule(seed: int, world: int):
    from delaycomm import _C

    sched = _C.DelaySchedule(DELAY, FRACTION, seed, [])
    stream = (1 << 32) | KEY
    # Nothing is deferred before calibration: the model sees no delay there.
    return [[sched.delay_ns(r, stream, t) if t >= CALIBRATION else 0 for r in range(world)] for t in range(STEPS)]


def _nfresh_zero_steps(delays, world):
    """Steps with every rank late, split by whether a stale contribution is due then (ssp:1: lateness is 1)."""
    with_due, without_due = [], []
    for t in range(CALIBRATION, STEPS):
        if all(delays[t][r] > 0 for r in range(world)):
            (with_due if any(d > 0 for d in delays[t - 1]) else without_due).append(t)
    return with_due, without_due


def _choose_seed(world: int) -> int:
    """The first seed whose schedule has n_fresh = 0 both with and without due stale contributions."""
    for seed in range(1000):
        with_due, without_due = _nfresh_zero_steps(_schedule(seed, world), world)
        if with_due and without_due:
            return seed
    raise AssertionError("no seed in [0, 1000) gives n_fresh = 0 steps")


def _grad(t, r):
    return np.random.default_rng(1000 * t + r).standard_normal(19)


def _policy_ranks(rank, world, policy, seed):
    import torch
    import torch.distributed as dist

    import delaycomm

    cfg = delaycomm.DelayConfig(delay=DELAY, delay_fraction=FRACTION, seed=seed, staleness="ssp:1", stale_policy=policy)
    dist.init_process_group("delaycomm", timeout=timedelta(seconds=60), pg_options=cfg)
    metric = torch.tensor([1.0])
    dist.all_reduce(metric)  # a metric all_reduce before the stream: kept fresh, not an engine call
    outs = []
    for t in range(STEPS):
        g = torch.from_numpy(_grad(t, rank))
        delaycomm.stale_allreduce(g, key=KEY)
        outs.append(g.numpy().copy())
    st = delaycomm.stats(dist.group.WORLD)["staleness"]
    delaycomm.flush()
    return {"outs": outs, "stats": st, "metric": metric.item()}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("policy", ["apply", "drop", "ema"])
def test_nfresh_zero_occurs_and_each_policy_gives_its_result(policy):
    world = 2
    seed = _choose_seed(world)
    delays = _schedule(seed, world)
    with_due, without_due = _nfresh_zero_steps(delays, world)
    results = run_procs(_policy_ranks, world, policy, seed, timeout=110)
    grads = [[_grad(t, r) for r in range(world)] for t in range(STEPS)]
    # ssp:1: every late contribution is exactly one step late, whatever step was calibrated.
    ref, _ = reference(world, grads, delays, policy, "ssp", 1, 0.1, False)
    for rank, out in enumerate(results):
        assert out["metric"] == 2.0
        for t in range(STEPS):
            np.testing.assert_allclose(
                out["outs"][t], ref[t], rtol=1e-12, atol=1e-12, err_msg=f"rank {rank} step {t} {policy}"
            )
        # n_fresh = 0 with a stale contribution due (it arrives from step t - 1) ...
        for t in with_due:
            due = [grads[t - 1][r] for r in range(world) if delays[t - 1][r] > 0]
            expected = {"apply": sum(due), "drop": np.zeros(19), "ema": world * sum(due) / len(due)}[policy]
            np.testing.assert_allclose(out["outs"][t], expected, rtol=1e-12, atol=1e-12, err_msg=f"step {t}")
        # ... and with none due: nothing to apply under every policy.
        for t in without_due:
            np.testing.assert_array_equal(out["outs"][t], np.zeros(19), err_msg=f"step {t}")
        st = out["stats"]
        assert st["step_source"] == "calibrated" and st["step_key"] == f"key {KEY}", st
        assert st["step_call"] == CALIBRATION + 1, st  # key 3's sixth call (the metric is kept fresh)


def _interleaved_ranks(rank, world):
    import torch
    import torch.distributed as dist

    import delaycomm

    cfg = delaycomm.DelayConfig(delay="exp:p99=5ms", delay_fraction=0.3, seed=1, staleness="ssp:2")
    dist.init_process_group("delaycomm", timeout=timedelta(seconds=60), pg_options=cfg)
    a, b = torch.zeros(16), torch.zeros(32)
    recurring_twice = torch.zeros(4)
    delaycomm.stale_allreduce(recurring_twice, key=5)
    delaycomm.stale_allreduce(recurring_twice, key=5)  # called twice, then never again: it must not hold it back
    for t in range(12):
        delaycomm.stale_allreduce(torch.full((8,), float(t)), key=100 + t)  # a new stream every step
        dist.all_reduce(torch.ones(2))  # a metric: kept fresh, never an engine call (docs/staleness.md)
        delaycomm.stale_allreduce(a, key=1)
        delaycomm.stale_allreduce(b, key=7)
    st = delaycomm.stats(dist.group.WORLD)["staleness"]
    return {k: st.get(k) for k in ("stale", "step_source", "step_ms", "step_key", "step_call", "step_intervals")}


@pytest.mark.timeout(120)
def test_interleaved_streams_calibrate_on_the_first_key_that_recurs_and_ranks_agree():
    results = run_procs(_interleaved_ranks, 2, timeout=110)
    r0, r1 = results[0], results[1]
    assert r0["stale"] > 0, f"staleness never engaged: {r0}"
    assert r0 == r1, results  # the same step, key and call on every rank
    assert r0["step_source"] == "calibrated" and r0["step_ms"] > 0 and r0["step_intervals"] == 5, r0
    # Engine calls per step: a new key, key 1, key 7 (the metric all_reduce is kept fresh). The first key called
    # six times is key 1.
    assert r0["step_key"] == "key 1", r0
    assert r0["step_call"] == 2 + 3 * 5 + 2, r0


def _mismatch_ranks(rank, world):
    import torch
    import torch.distributed as dist

    import delaycomm

    cfg = delaycomm.DelayConfig(delay="exp:p99=5ms", delay_fraction=0.3, seed=1, staleness="ssp:2")
    dist.init_process_group("delaycomm", timeout=timedelta(seconds=30), pg_options=cfg)
    g = torch.zeros(8)
    errors = []
    for _ in range(7):
        try:
            delaycomm.stale_allreduce(g, key=rank)  # each rank names its stream differently
        except RuntimeError as e:
            errors.append(str(e).split("Exception raised from")[0])
    return errors


@pytest.mark.timeout(120)
def test_ranks_that_calibrate_on_different_streams_all_fail_alike():
    results = run_procs(_mismatch_ranks, 2, timeout=110)
    assert results[0] and results[0] == results[1], results
    assert "calibrated step_ms=auto on different streams" in results[0][0], results[0]
    assert "rank 0: all-reduce #6, key 0; rank 1: all-reduce #6, key 1" in results[0][0], results[0]
    # Nothing was issued for the failed call, so the group is still in step; the next call tries again afresh.
    assert len(results[0]) == 2 and "rank 0: all-reduce #7, key 0" in results[0][1], results[0]


def _never_recurs_ranks(rank, world):
    import torch
    import torch.distributed as dist

    import delaycomm

    cfg = delaycomm.DelayConfig(delay="exp:p99=5ms", delay_fraction=0.3, seed=1, staleness="ssp:2")
    dist.init_process_group("delaycomm", timeout=timedelta(seconds=60), pg_options=cfg)
    g = torch.zeros(4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(4200):
            delaycomm.stale_allreduce(g, key=i // 3)  # each key called 3 times, then never again
    st = delaycomm.stats(dist.group.WORLD)["staleness"]
    texts = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    return {"warnings": texts, "source": st.get("step_source"), "stale": st["stale"], "keys": st.get("keys")}


@pytest.mark.timeout(240)
def test_no_stream_recurs_enough_to_calibrate_warns_once():
    results = run_procs(_never_recurs_ranks, 2, timeout=230)
    for out in results:
        assert len(out["warnings"]) == 1, out["warnings"]
        text = out["warnings"][0]
        for name in (
            "has not engaged after 4096 all-reduces",
            "kept_fresh_calls",
            "stale_allreduce(tensor, key=",
            "DELAYCOMM_STEP_MS",
        ):
            assert name in text, text
        assert out["source"] == "calibrating" and out["stale"] == 0, out
        assert out["keys"] <= 1024, out


def _persistent_metric_ranks(rank, world):
    import torch
    import torch.distributed as dist

    import delaycomm

    cfg = delaycomm.DelayConfig(delay="const:2ms", delay_fraction=0.5, seed=3, staleness="ssp:2")
    dist.init_process_group("delaycomm", timeout=timedelta(seconds=20), pg_options=cfg)
    x = torch.zeros(64, dtype=torch.float64)
    out = 0.0
    for t in range(20):
        x.fill_(float(t + 10 * rank))
        dist.all_reduce(x)  # a persistent tensor, SUM-all-reduced every step outside a backward pass: a metric
        out += x[0].item()
    st = delaycomm.stats(dist.group.WORLD)
    return {
        "out": out,
        "stale": st["staleness"]["stale"],
        "keys": st["staleness"]["keys"],
        "ar": st["ops"]["allreduce"],
    }


@pytest.mark.timeout(120)
def test_a_persistent_tensor_reduced_outside_backward_is_kept_fresh_with_its_delay():
    results = run_procs(_persistent_metric_ranks, 2, timeout=110)
    expected = sum(float(t) + float(t + 10) for t in range(20))
    for out in results:
        assert out["out"] == expected, results  # every step exact: nothing deferred
        assert out["stale"] == 0 and out["keys"] == 0, results
        ar = out["ar"]
        assert ar["kept_fresh_calls"] == 20 and ar["stale_calls"] == 0 and ar["delayed_calls"] > 0, ar
