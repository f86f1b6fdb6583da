"""Match mode's estimate of this machine's own latency (csrc/delay/LocalLatency.hpp): it answers after 16
observations, it follows a machine whose latency changes (each observation weighs half as much 512 observations
later), and forgetting keeps the tail's proportion (a halving that rounded whole counts down would erase it)."""

from __future__ import annotations

import numpy as np
import pytest

from delaycomm import _C

MS = 1_000_000


def _est(values_ns) -> _C._LatencyEstimate:
    e = _C._LatencyEstimate()
    e.record_many([int(v) for v in values_ns])
    return e


def test_no_answer_before_the_minimum_then_the_quantiles_of_what_was_recorded():
    e = _est([MS] * (_C._LatencyEstimate.min_samples - 1))
    assert e.quantile_ns(0.5) == -1
    e.record(MS)
    assert e.quantile_ns(0.5) == pytest.approx(MS, rel=0.04)  # within its bucket (ratio 1.04)
    rng = np.random.default_rng(1)
    values = rng.lognormal(np.log(2 * MS), 0.5, 400)  # fewer than one halving: all of them weigh alike
    e = _est(values)
    for q in (0.1, 0.5, 0.9, 0.99):
        assert e.quantile_ns(q) == pytest.approx(np.quantile(values, q), rel=0.06), q
    assert e.count == 400


def test_before_calibration_the_smallest_observation_is_the_provisional_estimate():
    e = _C._LatencyEstimate()
    assert e.smallest_ns() == -1  # nothing observed: the whole target is added
    e.record_many([20 * MS, MS, 3 * MS])  # a first call slowed by set-up must not cancel the next calls' delays
    assert e.mean_ns() == -1 and e.smallest_ns() == pytest.approx(MS, rel=0.04)


def test_a_machine_that_gets_slower_is_followed_within_a_few_halvings():
    every = _C._LatencyEstimate.halving_every
    e = _est([MS] * (20 * every))  # a long quiet start
    assert e.quantile_ns(0.5) == pytest.approx(MS, rel=0.04)
    e.record_many([10 * MS] * (2 * every))  # then ten times slower
    # A cumulative estimate would still answer 1 ms (20 old observations for each 2 new). This one weighs the new
    # ones 3 to 1 after two halvings (old 512 -> 256 -> 128, new 256 -> 384): a quarter of the weight is 1 ms.
    assert e.quantile_ns(0.5) == pytest.approx(10 * MS, rel=0.04)
    assert e.quantile_ns(0.3) == pytest.approx(10 * MS, rel=0.04)
    assert e.quantile_ns(0.2) == pytest.approx(MS, rel=0.04)
    assert e.count == 22 * every


def test_forgetting_keeps_a_sparse_tail():
    # 1% of the calls at 50 ms, spread over many buckets, the rest at about 1 ms, for many halvings: each tail
    # bucket holds about one observation between halvings, which whole-count halving would round to nothing.
    rng = np.random.default_rng(2)
    n = 40 * _C._LatencyEstimate.halving_every
    body = rng.uniform(0.9 * MS, 1.1 * MS, n)
    tail = rng.uniform(30 * MS, 80 * MS, n)
    values = np.where(rng.random(n) < 0.01, tail, body)
    e = _est(values)
    assert e.quantile_ns(0.5) == pytest.approx(MS, rel=0.1)
    assert 25 * MS < e.quantile_ns(0.995) < 85 * MS
    assert e.quantile_ns(0.98) < 1.2 * MS
