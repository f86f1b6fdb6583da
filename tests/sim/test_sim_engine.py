"""Event-engine schedules traced by hand, and invariants that hold for any seed."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delaycomm.sim import ProblemConfig, SimConfig, parse_model, simulate, staleness_bound
from delaycomm.sim.engine import SIM_DELAY_STREAM

from ._fakes import FakeSampler, small

# Two workers, no jitter: worker 1 takes 1 s per gradient, worker 0 (the straggler) 2.5 s.
TRACE = dict(workers=2, base_time=1.0, straggler=2.5, jitter="none", budget=4.6)


def test_asp_schedule_by_hand():
    r = simulate(small(model="asp", **TRACE))
    # t=1 w1 (read v0 at 0); t=2 w1 (read v1); t=2.5 w0 (read v0, v=2); t=3 w1 (read v2, v=3); t=4 w1 (read v4)
    assert r.arrival_time.tolist() == [1.0, 2.0, 2.5, 3.0, 4.0]
    assert r.arrival_worker.tolist() == [1, 1, 0, 1, 1]
    assert r.staleness.tolist() == [0, 0, 2, 1, 0]
    assert (r.updates, r.dropped) == (5, 0)
    assert r.blocked_seconds == [0.0, 0.0]


def test_lead1_schedule_by_hand():
    r = simulate(small(model="lead:1", **TRACE))
    # s=1 is lock-step: w1 waits 1 -> 2.5 for w0, then 3.5 -> end of budget.
    assert r.arrival_time.tolist() == [1.0, 2.5, 3.5]
    assert r.arrival_worker.tolist() == [1, 0, 1]
    assert r.staleness.tolist() == [0, 1, 0]
    assert r.blocked_seconds == pytest.approx([0.0, 1.5 + 1.1])


def test_bsp_schedule_by_hand():
    r = simulate(small(model="bsp", **{**TRACE, "budget": 10.9}))
    # Rounds end when the straggler is done: 2.5, 5, 7.5, 10.
    assert r.updates == 4
    assert r.arrival_time.tolist() == [1.0, 2.5, 3.5, 5.0, 6.0, 7.5, 8.5, 10.0]
    assert r.staleness.tolist() == [0] * 8
    assert r.blocked_seconds == pytest.approx([0.0, 4 * 1.5])  # w1 waits 1.5 s for w0 every round


def test_network_delay_schedule_by_hand():
    # One worker, 1 s per gradient, every update 0.5 s in flight; the worker goes on meanwhile.
    r = simulate(small(model="asp", workers=1, stragglers=0, jitter="none", budget=4.6), [FakeSampler("const:0.5")])
    assert r.arrival_time.tolist() == [1.5, 2.5, 3.5, 4.5]
    assert r.staleness.tolist() == [0, 1, 1, 1]  # its own previous update lands while it computes


def test_host_delay_schedule_by_hand():
    # delay_where=host: the worker waits for its update, so every step costs 1.5 s and nothing is stale.
    cfg = small(model="asp", workers=1, stragglers=0, jitter="none", budget=4.6, delay_where="host")
    r = simulate(cfg, [FakeSampler("const:0.5")])
    assert r.arrival_time.tolist() == [1.5, 3.0, 4.5]
    assert r.staleness.tolist() == [0, 0, 0]
    assert r.blocked_seconds == pytest.approx([1.5])


def test_updates_of_one_worker_arrive_in_order():
    # Delays 2.0, 0.1, 2.0, 0.1, ...: update 2 would overtake update 1; per-worker FIFO keeps the order.
    sampler = FakeSampler([2.0, 0.1])
    r = simulate(small(model="asp", workers=1, stragglers=0, jitter="none", budget=5.5), [sampler])
    assert r.arrival_step.tolist() == [1, 2, 3, 4]
    assert r.arrival_time.tolist() == [3.0, 3.0, 5.0, 5.0]
    assert r.staleness.tolist() == [0, 1, 2, 1]
    assert sampler.calls == [(256, SIM_DELAY_STREAM, 0)]


def test_delay_fraction_zero_means_no_delay():
    base = small(model="asp", jitter="none")
    r0 = simulate(base)
    r1 = simulate(
        dataclasses.replace(base, delay="const:3", delay_fraction=0.0),
        [FakeSampler("const:3") for _ in range(base.workers)],
    )
    assert r1.arrival_time.tolist() == r0.arrival_time.tolist()


@pytest.mark.parametrize(
    ("workers", "straggler", "jitter", "budget", "seed"),
    [
        (2, 1.0, "none", 1500.0, 0),
        (4, 3.0, "lognormal:0.3", 800.0, 1),
        (8, 4.0, "exp:1.0", 400.0, 2),
        (6, 1.5, "uniform:0.5", 500.0, 3),
        (3, 6.0, "lognormal:0.8", 1200.0, 4),
    ],
)
def test_asp_mean_staleness_tends_to_n_minus_1(workers, straggler, jitter, budget, seed):
    # Every worker always busy, no network delay: by Little's law the mean over updates is exactly N - 1 in steady
    # state.
    r = simulate(small(model="asp", workers=workers, straggler=straggler, jitter=jitter, budget=budget, seed=seed))
    assert r.updates > 2500
    assert r.mean_staleness == pytest.approx(workers - 1, rel=0.02)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workers=st.integers(2, 6),
    s=st.integers(1, 4),
    straggler=st.sampled_from([1.0, 2.0, 5.0]),
    jitter=st.sampled_from(["exp:1.0", "lognormal:0.6", "none"]),
    delay=st.sampled_from(["none", "network", "host"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_ssp_max_staleness_never_exceeds_bound(workers, s, straggler, jitter, delay, seed):
    cfg = small(
        model=f"lead:{s}",
        workers=workers,
        straggler=straggler,
        jitter=jitter,
        budget=40.0,
        seed=seed,
        delay="none" if delay == "none" else "exp:mean=0.7",
        delay_where="host" if delay == "host" else "network",
    )
    samplers = None if delay == "none" else [FakeSampler("exp:mean=0.7", seed, i) for i in range(workers)]
    r = simulate(cfg, samplers)
    bound = (workers - 1) * (2 * s - 1) + ((s - 1) if delay == "network" else 0)
    assert r.bound == bound == staleness_bound(parse_model(cfg.model), workers, delay == "network")
    assert r.staleness.size > 0
    assert r.max_staleness <= bound


@settings(max_examples=10, deadline=None)
@given(workers=st.integers(1, 6), seed=st.integers(0, 2**31 - 1), delay=st.booleans())
def test_bsp_staleness_is_zero(workers, seed, delay):
    cfg = small(model="bsp", workers=workers, stragglers=min(1, workers), budget=30.0, seed=seed)
    r = simulate(cfg, [FakeSampler("exp:mean=0.5", seed, i) for i in range(workers)] if delay else None)
    assert r.updates > 0
    assert r.max_staleness == 0
    assert r.staleness.size == len(r.arrival_time)


def test_fixed_seed_reproduces_bit_for_bit_and_seeds_differ():
    cfg = small(model="lead:2", policy="ema", delay="exp:mean=0.3")
    samplers = lambda seed: [FakeSampler("exp:mean=0.3", seed, i) for i in range(cfg.workers)]  # noqa: E731
    a, b = simulate(cfg, samplers(0)), simulate(cfg, samplers(0))
    for field in ("staleness", "arrival_time", "arrival_worker", "curve_loss"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
    assert a.final_loss == b.final_loss
    c = simulate(dataclasses.replace(cfg, seed=1), samplers(1))
    assert not np.array_equal(a.arrival_time, c.arrival_time)


@pytest.mark.parametrize("model", ["asp", "lead:2"])
def test_drop_discards_exactly_the_stale_arrivals(model):
    r = simulate(small(model=model, policy="drop", stale_after=2, budget=80.0))
    assert r.dropped == int(np.sum(r.staleness > 2)) > 0
    assert r.updates + r.dropped == r.staleness.size


def test_network_delay_adds_staleness_as_predicted():
    # Constant in-flight time d: an update of worker i now waits c_i + d, during which the others apply
    # (lam - lam_i)(c_i + d) updates and its own previous update (pushed when it read) lands too. Averaged over
    # updates: E[tau] = (N - 1) + d (lam - sum lam_i^2 / lam) + 1.
    d = 0.5
    cfg = small(model="asp", workers=4, budget=300.0, delay=f"const:{d}")
    r = simulate(cfg, [FakeSampler(f"const:{d}") for _ in range(4)])
    lam_i = np.array(r.worker_updates) / cfg.budget
    lam = lam_i.sum()
    predicted = (cfg.workers - 1) + d * (lam - np.sum(lam_i**2) / lam) + 1
    assert r.mean_staleness == pytest.approx(predicted, rel=0.03)
    assert r.mean_staleness > simulate(dataclasses.replace(cfg, delay="none")).mean_staleness + 1.5


@pytest.mark.parametrize("rule", ["const", "staleness", "adadelay", "dcasgd", "dcasgd-a", "anytime"])
@pytest.mark.parametrize("policy", ["apply", "drop", "ema"])
def test_every_rule_and_policy_trains(rule, policy):
    cfg = small(model="asp", policy=policy, step=dataclasses.replace(small().step, rule=rule), budget=100.0)
    r = simulate(cfg)
    assert np.isfinite(r.final_loss)
    assert r.final_loss < r.curve_loss[0] - 0.05  # started at ln 2


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"model": "bogus"}, r"unknown consistency model 'bogus'"),
        ({"budget": -1.0}, r"SimConfig: budget must be a finite number > 0, got -1.0"),
        ({"budget": float("nan")}, r"SimConfig: budget must be a finite number > 0, got nan"),
        ({"workers": 0}, r"SimConfig: workers must be an integer >= 1, got 0"),
        ({"stragglers": 9}, r"SimConfig: stragglers must be in \[0, workers=4\], got 9"),
        ({"delay_fraction": 1.5}, r"SimConfig: delay_fraction must be in \[0, 1\], got 1.5"),
        ({"delay_where": "disk"}, r"SimConfig: delay_where must be 'network' or 'host', got 'disk'"),
        ({"policy": "mean"}, r"SimConfig: policy must be one of apply, drop, ema, got 'mean'"),
        ({"alpha": 0.0}, r"SimConfig: alpha must be in \(0, 1\], got 0.0"),
        ({"jitter": "gamma:2"}, r"parse_jitter: bad jitter 'gamma:2': expected 'none', 'lognormal:SIGMA'"),
        ({"jitter": "exp:2"}, r"parse_jitter: bad jitter 'exp:2'"),
        ({"problem": ProblemConfig(batch=0)}, r"ProblemConfig: batch must be >= 1, got 0"),
    ],
)
def test_config_rejects(kw, message):
    with pytest.raises(ValueError, match=message):
        simulate(small(**kw))


class _Bad:
    def __init__(self, out):
        self.out = out

    def sample_many(self, n, stream=0, start=0):
        return self.out


@pytest.mark.parametrize("out", [np.full(256, -1.0), np.full(256, np.nan), np.zeros(3)])
def test_misbehaving_sampler_is_rejected(out):
    cfg = small(workers=1, stragglers=0)
    with pytest.raises(
        ValueError, match=r"simulate: delay sampler's sample_many\(256\) must return 256 finite delays >= 0"
    ):
        simulate(cfg, [_Bad(out)])


def test_sampler_count_must_match_workers():
    with pytest.raises(ValueError, match=r"simulate: need one delay sampler per worker \(4\), got 1"):
        simulate(small(), [FakeSampler("const:0.1")])


def test_simconfig_default_is_valid():
    assert SimConfig().validate().kind == "asp"
