"""delay_mode=match across real processes and real Gloo (docs/delay.md, "Match mode"), with a parametric family:
the latency each call experiences, timed by the script's own clock, follows the target where delay_mode=add counts
this machine's own latency twice; the counters say who carried which call. The same job checks that a bursty
schedule (delay_burst) is the same on every rank. The issue's tolerances are held by the round trip
(test_roundtrip.py, bench/roundtrip.py)."""

from __future__ import annotations

import numpy as np
import pytest

from delaycomm import _C

from . import _workers as w
from ._mp import spawn

pytestmark = [pytest.mark.multiproc]

TARGET = _C.DelaySampler("lognormal:p50=3ms,p99=30ms")


@pytest.mark.timeout(120)
def test_match_mode_follows_the_target_where_add_mode_counts_the_machine_twice():
    n = 80
    results = spawn(w.match_mode, 2, timeout=110, n=n)
    targets = results[0]["targets"]  # each call's target, drawn from the schedule (rank 0 is the only late rank)
    for size, t in targets.items():
        assert len(t) == n and np.quantile(t, 0.5) == pytest.approx(TARGET.quantile(0.5), rel=0.35), size
    for rank, r in enumerate(results):
        for size in ("1KiB", "4MiB"):
            own = np.array(r["times"]["none"][size])
            for q in (0.5, 0.75):  # (the tail of 80 calls is at the mercy of the machine's load spikes)
                # The coupled target: the targets' quantile (the same draws, so their sampling noise cancels), or
                # this machine's own latency where that is already longer.
                want = max(np.quantile(targets[size], q), np.quantile(own, q))
                match = np.quantile(r["times"]["match"][size], q) / want - 1
                add = np.quantile(r["times"]["add"][size], q) / want - 1
                # Loose: the spread of this machine's own latency adds to match mode's error (docs/delay.md, "Why
                # the coupling"), up to ~35% at p50 under a load of 8 on 2 cores. On a machine loaded harder, a
                # sleeping issuer wakes late by as much as the target itself; add mode, measured in the same job,
                # is late by the same, so match mode is held to within 50% or no further off than add mode (at
                # 1 KiB the two should agree: this machine's own latency is a small part of the target).
                assert abs(match) < 0.5 or abs(match) <= abs(add) + 0.25, (rank, size, q, match, add)
                if size == "4MiB":  # the machine's own latency is milliseconds: add mode counts it twice
                    assert abs(match) < abs(add), (rank, size, q, match, add)
    r0, r1 = results
    # Rank 0 carries every call (the only delayed rank); rank 1 injects nothing and waits for it.
    assert r0["match"]["calls"] == 2 * n and r1["match"]["calls"] == 0
    assert r0["delayed"] == {"none": 0, "match": 2 * n, "add": 2 * n}
    assert r1["delayed"]["match"] == 0
    # Below ~p40 the target is shorter than a 4 MiB all-reduce here: nothing added, and counted.
    assert 0 < r0["match"]["nothing_added"] < 2 * n
    # Each size's estimate needs 16 observations before it answers.
    assert 32 <= r0["match"]["uncalibrated"] <= 40
    # Bursts: every rank computes every rank's schedule alike, and each rank's delays are its schedule's.
    assert r0["burst"]["everyones"] == r1["burst"]["everyones"]
    for rank, r in enumerate(results):
        assert r["burst"]["mine"] == r["burst"]["everyones"][rank]
        assert r["burst"]["delayed"] == sum(d > 0 for d in r["burst"]["mine"]) > 0
