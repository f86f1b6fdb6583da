"""Correlated delay (delay_burst, docs/delay.md "Bursts"): the two-state chain's fraction and burst lengths, its
equality wherever it is computed, and delay_mode=match's view of a call (DelaySchedule.latest)."""

from __future__ import annotations

import numpy as np
import pytest

from delaycomm import _C
from delaycomm._config import DelayConfig, resolve


def _runs(flags: np.ndarray, value: bool) -> np.ndarray:
    """Lengths of the maximal runs of `value` in `flags` (the first and last run cut by the window dropped)."""
    x = np.concatenate(([not value], flags, [not value])).astype(np.int8)
    edges = np.flatnonzero(np.diff(x))
    starts, ends = edges[0::2], edges[1::2]
    if flags[0] == value:
        starts, ends = starts[1:], ends[1:]
    if flags[-1] == value:
        starts, ends = starts[:-1], ends[:-1]
    return ends - starts


@pytest.mark.parametrize("fraction,burst", [(0.3, 20.0), (0.5, 8.0), (0.1, 3.0)])
def test_fraction_and_burst_lengths_follow_the_chain(fraction, burst):
    n = 400_000
    s = _C.DelaySchedule("const:1ms", fraction, 7, [], burst)
    flags = s.delayed_many(0, 0, 1, n)
    assert flags.mean() == pytest.approx(fraction, abs=0.02)
    runs = _runs(flags, True)
    gaps = _runs(flags, False)
    # Runs of delayed calls are geometric with mean `burst`: P(len >= k) = (1 - 1/burst)^(k - 1).
    assert runs.mean() == pytest.approx(burst, rel=0.08)
    for k in (1, 2, int(burst), int(2 * burst)):
        assert (runs >= k).mean() == pytest.approx((1 - 1 / burst) ** (k - 1), abs=0.03)
    # Quiet runs then have mean burst (1 - f) / f, so that the stationary fraction is f.
    assert gaps.mean() == pytest.approx(burst * (1 - fraction) / fraction, rel=0.08)


def test_shortest_burst_is_independent_draws():
    fraction = 0.4
    shortest = _C.DelaySchedule.min_burst(fraction)
    assert shortest == pytest.approx(1 / (1 - fraction))
    flags = _C.DelaySchedule("const:1ms", fraction, 3, [], shortest).delayed_many(0, 0, 1, 200_000).astype(float)
    assert flags.mean() == pytest.approx(fraction, abs=0.01)
    assert abs(np.corrcoef(flags[:-1], flags[1:])[0, 1]) < 0.02
    bursty = _C.DelaySchedule("const:1ms", fraction, 3, [], 30.0).delayed_many(0, 0, 1, 200_000).astype(float)
    # Lag-1 correlation of the chain: 1 - lambda = 1 - 1 / (burst (1 - f)) = 0.944.
    assert np.corrcoef(bursty[:-1], bursty[1:])[0, 1] == pytest.approx(1 - 1 / (30.0 * (1 - fraction)), abs=0.02)


def test_chain_is_a_pure_function_shared_by_op_kinds_and_independent_across_ranks():
    s = _C.DelaySchedule("exp:mean=2ms", 0.3, 11, [], 25.0)
    n = 5_000
    forward = s.delayed_many(1, 0, 1, n)
    # Any order of evaluation, and a second schedule object (another process computes the same: it is the same
    # function of the seed), gives the same states.
    other = _C.DelaySchedule("exp:mean=2ms", 0.3, 11, [], 25.0)
    backward = np.array([other.delayed(1, 0, t) for t in range(n, 0, -1)])[::-1]
    assert (forward == backward).all()
    # Every op kind of a group reads one chain per rank: a slow rank is slow for all its ops.
    assert (s.delayed_many(1, 3, 1, n) == forward).all()
    # The delay of a delayed call is still drawn per call (and per op kind).
    d0, d3 = s.delays_ns(1, 0, 1, n), s.delays_ns(1, 3, 1, n)
    assert ((d0 > 0) == forward).all() and (d0 != d3)[forward].mean() > 0.99
    # Ranks have independent chains.
    other_rank = s.delayed_many(0, 0, 1, n).astype(float)
    assert abs(np.corrcoef(forward.astype(float), other_rank)[0, 1]) < 0.1
    # Staleness keys share one chain over the steps: a late rank's buckets of a step are late together.
    k1, k2 = _C.DelaySchedule.key_stream(5), _C.DelaySchedule.key_stream(900)
    assert (s.delayed_many(1, k1, 0, n) == s.delayed_many(1, k2, 0, n)).all()


@pytest.mark.timeout(20)
def test_a_far_call_costs_no_walk_over_earlier_calls():
    s = _C.DelaySchedule("const:1ms", 0.2, 5, [], 1000.0)
    # Far apart positions (each O(1): a walk over earlier calls would never finish) are in the stationary
    # distribution, and neighbours inside a burst agree.
    far = np.array([s.delayed(0, 0, 10**15 + k * 10**9) for k in range(4000)])
    assert far.mean() == pytest.approx(0.2, abs=0.03)
    pairs = np.array([[s.delayed(0, 0, 10**15 + k * 10**9 + d) for d in (0, 1)] for k in range(2000)])
    assert (pairs[:, 0] == pairs[:, 1]).mean() > 0.99


def test_burst_options_are_checked():
    assert resolve(DelayConfig(delay="const:1ms", delay_fraction=0.5, delay_burst=2), env={}).delay_burst == 2.0
    assert resolve(DelayConfig(delay_mode="MATCH"), env={}).delay_mode == "match"
    assert resolve(env={}).delay_mode == "add" and resolve(env={}).delay_burst is None
    with pytest.raises(ValueError) as e:
        resolve(DelayConfig(delay="const:1ms", delay_fraction=0.5), env={"DELAYCOMM_DELAY_BURST": "1.5"})
    assert str(e.value) == (
        "delaycomm: invalid value '1.5' for option 'delay_burst' from the environment variable DELAYCOMM_DELAY_BURST: "
        "expected a mean burst length of at least 1 / (1 - delay_fraction) = 2 calls at delay_fraction=0.5 (that "
        "length is independent draws; bursts are longer), or 'none'"
    )
    with pytest.raises(ValueError, match=r"option 'delay_burst' .* expected 'none' .* in \[1, 1e\+12\]"):
        DelayConfig(delay_burst="0.5")
    with pytest.raises(ValueError, match=r"option 'delay_mode' .* expected one of 'add', 'match'"):
        DelayConfig(delay_mode="replace")
    with pytest.raises(ValueError, match="shorter than the mean run of independent draws"):
        _C.DelaySchedule("const:1ms", 0.5, 0, [], 1.5)


def test_latest_is_the_largest_delay_with_its_quantile_in_the_maximum():
    size, fraction = 4, 0.4
    s = _C.DelaySchedule("lognormal:p50=3ms,p99=30ms", fraction, 9, [0, 2, 3, 7])
    quantiles = []
    for t in range(1, 20_001):
        rank, ns, q = s.latest(1, t, size)
        delays = [s.delay_ns(r, 1, t) for r in range(size)]
        assert ns == max(delays)
        if rank < 0:
            assert max(delays) == 0
            continue
        assert delays[rank] == ns
        quantiles.append(q)
    # Three targeted ranks below the size: P(some rank delayed) = 1 - 0.6^3, and the quantile of the largest
    # delay in its own distribution is uniform on [0.6^3, 1).
    lo = (1 - fraction) ** 3
    q = np.array(quantiles)
    assert len(q) / 20_000 == pytest.approx(1 - lo, abs=0.015)
    assert q.min() >= lo
    hist, _ = np.histogram(q, bins=10, range=(lo, 1.0))
    assert (np.abs(hist / len(q) - 0.1) < 0.02).all()
    # Point-to-point: the rank's own delay alone.
    rank, ns, q = s.latest(1, 5, size, only_rank=2)
    assert ns == s.delay_ns(2, 1, 5) and (rank == 2) == (ns > 0)
