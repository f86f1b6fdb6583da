"""delaycomm.data.DelayedLoader: a deterministic fraction of batches arrives late, by the backend's samplers."""

from __future__ import annotations

import time

import pytest

from delaycomm import _C
from delaycomm.data import DelayedLoader


def test_batches_pass_through_in_order_and_the_schedule_is_the_backends():
    loader = DelayedLoader(list(range(40)), delay="const:1ms", fraction=0.5, seed=4, rank=1)
    assert len(loader) == 40
    assert list(loader) == list(range(40))
    sch = _C.DelaySchedule("const:1ms", 0.5, 4)
    expected = [sch.delay_ns(1, _C.DelaySchedule.LOADER_STREAM, i) for i in range(40)]
    assert [round(loader.delay_of(i) * 1e9) for i in range(40)] == expected
    s = loader.stats()
    assert s["batches"] == 40
    assert s["delayed"] == sum(d > 0 for d in expected) and 0 < s["delayed"] < 40
    assert s["total_delay_s"] == pytest.approx(s["delayed"] * 1e-3)


def test_epochs_continue_the_schedule_and_ranks_differ():
    a = DelayedLoader(range(10), delay="exp:p99=1ms", fraction=0.5, seed=1, rank=0)
    b = DelayedLoader(range(10), delay="exp:p99=1ms", fraction=0.5, seed=1, rank=0)
    c = DelayedLoader(range(10), delay="exp:p99=1ms", fraction=0.5, seed=1, rank=1)
    assert [a.delay_of(i) for i in range(50)] == [b.delay_of(i) for i in range(50)]
    assert [a.delay_of(i) for i in range(50)] != [c.delay_of(i) for i in range(50)]
    list(a)
    list(a)
    assert a.stats()["batches"] == 20


def test_delayed_batches_are_really_late():
    loader = DelayedLoader(range(5), delay="const:20ms", fraction=1.0)
    t0 = time.monotonic()
    assert list(loader) == list(range(5))
    assert time.monotonic() - t0 >= 0.1


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(delay="exp:p99=400"), r"DelayedLoader: invalid delay 'exp:p99=400': value of 'p99' '400' has no unit"),
        (dict(fraction=1.5), r"DelayedLoader: fraction must be a number in \[0, 1\], got 1.5"),
        (dict(fraction="0.3"), r"DelayedLoader: fraction must be a number in \[0, 1\], got '0.3'"),
        (dict(seed=-1), r"DelayedLoader: seed must be an integer >= 0, got -1"),
        (dict(rank=-2), r"DelayedLoader: rank must be an integer >= 0, got -2"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DelayedLoader(range(3), **kwargs)
