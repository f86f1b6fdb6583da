"""A call's place in the step under a profile replay (delay_place=step; docs/delay.md, "Replay into another job"):
the run arithmetic of delay/Schedule.hpp's StepPlace through its binding, and, with 2 real ranks over Gloo, that a
call issued behind others experiences its own target, not the largest of its step's targets (what each call's own
draw gave before: bench/results/2026-12-07-vm2core-replay-queue/)."""

from __future__ import annotations

import json
import math

import pytest

import delaycomm
from delaycomm import _C, _ops

from ._mp import spawn

BASE = 1.02
AR = int(_ops.BY_NAME["allreduce"].kind)
MS = 1_000_000


def test_a_call_with_no_target_running_opens_a_run_with_its_own_draw_and_later_calls_join_it():
    s = _C.DelaySchedule("exp:mean=10ms", 1.0)
    p = _C._StepPlace()
    assert not p.running(0)
    u, ns, joined, behind = p.place(1_000, 0.3, s)
    assert (u, joined, behind) == (0.3, False, 0)
    assert abs(ns - -math.log(1 - 0.3) * 10 * MS) <= 2  # its own draw's target
    end = 1_000 + ns
    assert p.end_ns == end and p.running(end - 1) and not p.running(end)
    # Issued while that call is held back: the run's draw, whatever its own; the same target, 1 us later, is
    # released after the first one's, so the first holds it back for nothing.
    assert p.place(2_000, 0.99, s) == (0.3, ns, True, 0)
    # A longer target of the run (another class: here the same draw of a longer spec) extends its end ...
    longer = _C.DelaySchedule("exp:mean=40ms", 1.0)
    u2, ns2, joined2, _ = p.place(3_000, 0.01, longer)
    assert (u2, joined2) == (0.3, True) and abs(ns2 - -math.log(1 - 0.3) * 40 * MS) <= 2
    assert p.end_ns == 3_000 + ns2
    # ... a shorter one does not shorten it, and is held back past its own release until the run's end.
    short = p.place(4_000, 0.5, _C.DelaySchedule("const:1ms", 1.0))
    assert short[2:] == (True, 3_000 + ns2 - (4_000 + MS)) and p.end_ns == 3_000 + ns2
    # At the run's end the next call opens a run of its own, with its own draw.
    u3, ns3, joined3, _ = p.place(3_000 + ns2, 0.8, s)
    assert (u3, joined3) == (0.8, False) and abs(ns3 - -math.log(1 - 0.8) * 10 * MS) <= 2


def test_a_run_lasts_until_its_calls_release_not_until_their_targets_end():
    """The carrier holds a call back T - L (L: this machine's own latency, which match mode does not inject); once
    the caller saw the call complete (about T after the call) the next call must not join: its draw is its own."""
    s = _C.DelaySchedule("const:30ms", 1.0)
    p = _C._StepPlace()
    _, ns, _, _ = p.place(0, 0.9, s, own_ns=2 * MS)
    assert ns == 30 * MS and p.end_ns == 28 * MS
    assert p.running(28 * MS - 1) and not p.running(28 * MS)  # held back until its release
    # A call of no delay of its own issued before that target ends waits for it (it does not measure the machine).
    assert p.behind_ns(29 * MS) == MS and p.behind_ns(30 * MS) == 0
    # A synchronous call opens a run of its own, even while one holds calls back; later calls join its run.
    sync = _C._StepPlace()
    sync.place(0, 0.9, s, own_ns=2 * MS)
    assert sync.place(MS, 0.1, s, own_ns=2 * MS, may_join=False)[:3] == (0.1, 30 * MS, False)
    assert sync.place(2 * MS, 0.5, s, own_ns=2 * MS)[:3] == (0.1, 30 * MS, True)
    assert p.place(30 * MS, 0.1, s, own_ns=2 * MS) == (0.1, 30 * MS, False, 0)  # after it completed: its own
    # An own latency above the target holds nothing back: no run to join.
    q = _C._StepPlace()
    q.place(0, 0.5, s, own_ns=40 * MS)
    assert q.end_ns == 0 and not q.place(0, 0.2, s)[2]


def test_a_run_end_saturates_and_a_call_of_zero_target_opens_no_run_to_join():
    p = _C._StepPlace()
    late = 2**63 - 1000
    _, ns, _, _ = p.place(late, 0.5, _C.DelaySchedule("const:1ms", 1.0))
    assert ns == MS and p.end_ns == 2**63 - 1  # "never", not an overflow into the past
    assert p.running(2**63 - 2) and p.place(2**63 - 2, 0.1, _C.DelaySchedule("const:1ms", 1.0))[2]
    zero = _C.DelaySchedule("const:0ms", 1.0)
    q = _C._StepPlace()
    assert q.place(5, 0.5, zero)[1:] == (0, False, 0)
    assert not q.running(5) and not q.place(5, 0.7, zero)[2]


def test_delay_place_is_an_option_every_rank_must_match_and_defaults_to_step():
    cfg = delaycomm.resolve(delaycomm.DelayConfig(delay="const:1ms"), env={})
    assert cfg.delay_place == "step"
    assert delaycomm.resolve(env={"DELAYCOMM_DELAY_PLACE": "call"}).delay_place == "call"
    with pytest.raises(ValueError, match=r"option 'delay_place' .* expected one of 'step', 'call'"):
        delaycomm.DelayConfig(delay_place="bucket")
    from delaycomm._config import _BY_NAME

    assert _BY_NAME["delay_place"].must_match


# --- 2 ranks: the step's calls issued back to back -------------------------------------------------------------

FAST_MS, SLOW_MS = 10.0, 120.0  # the profile: 80% of the calls near FAST, 20% near SLOW
SMALL, BIG = 256, 16384  # float32 elements: 1 KiB and 64 KiB, both classes with the same bimodal latency


def _bimodal_profile(path) -> str:
    def cls(nbytes: int) -> dict:
        buckets: dict[int, int] = {}
        for ms, n in ((FAST_MS, 80), (SLOW_MS, 20)):
            for i in range(n):
                b = math.floor(math.log(ms * MS * (1 + 0.1 * i / n)) / math.log(BASE))
                buckets[b] = buckets.get(b, 0) + 1
        return {"bytes": nbytes, "count": 100, "zeros": 0, "min_ns": FAST_MS * MS, "max_ns": SLOW_MS * 1.1 * MS,
                "buckets": sorted([b, c] for b, c in buckets.items())}  # fmt: skip

    doc = {"format": "delaycomm-profile", "version": 1, "histogram": {"base": BASE, "unit": "ns"},
           "metadata": {"world_size": 2}, "ops": {"allreduce": [cls(SMALL * 4), cls(BIG * 4)]}}  # fmt: skip
    path.write_text(json.dumps(doc))
    return str(path)


def _steps_behind(rank, world_size, init_method, profile, place, steps):
    """Each step: three 1 KiB all-reduces and a 64 KiB one issued at once (async, as DDP issues its buckets), then
    waited for; a pause between steps (so that each step opens a run). Returns each step's (seq of its first call,
    the 64 KiB call's experienced latency in ms)."""
    import time

    import torch
    import torch.distributed as dist

    from ._workers import _init

    # delay_place=step is the default: that variant sets nothing but the profile, as a user does.
    _init(
        rank, world_size, init_method, delay=f"profile:{profile}", **({} if place == "step" else {"delay_place": place})
    )
    small, big = torch.ones(SMALL), torch.ones(BIG)
    seq, out = 0, []
    for _ in range(steps):
        first = seq + 1
        works = []
        for t in (small, small, small, big):
            seq += 1
            works.append(dist.all_reduce(t, async_op=True))
        t0 = time.perf_counter()
        works[-1].wait()
        out.append((first, (time.perf_counter() - t0) * 1e3))
        for w in works:
            w.wait()
        time.sleep(0.01)
    dist.destroy_process_group()
    return out


@pytest.mark.parametrize("place", ["step", "call"])
def test_a_call_behind_others_experiences_its_own_target_not_the_largest_of_its_steps(tmp_path, place):
    """The draws are a pure function of the seed: the steps where the 64 KiB call's own target (its run's draw,
    delay_place=step) is fast while an earlier call of its step drew slow are known before the run. In those steps
    it takes about FAST ms under delay_place=step and at least about SLOW ms (it waits behind the slow call) with a
    draw of its own per call (delay_place=call). Judged on most such steps and with a margin of SLOW / 2 - FAST:
    a loaded runner slows both alike, and cannot turn 120 ms into 10."""
    profile = _bimodal_profile(tmp_path / "p.json")
    steps = 20
    r0, r1 = spawn(_steps_behind, 2, timeout=55, profile=profile, place=place, steps=steps)
    sched = _C.DelaySchedule(f"profile:{profile}", 1.0, carrier_size=2)

    def target_ms(seq: int, nbytes: int) -> float:
        return sched.delay_ns(sched.carrier(AR, seq), AR, seq, "allreduce", nbytes) / MS

    decisive, largest = [], []
    for (first, got0), (_, got1) in zip(r0, r1):
        own = target_ms(first, BIG * 4)  # step: the 64 KiB call draws at its run's opener's draw
        every = [target_ms(first + k, (SMALL if k < 3 else BIG) * 4) for k in range(4)]  # call: each its own
        if own < SLOW_MS / 2 and max(every) > SLOW_MS / 2:
            decisive.append(max(got0, got1))
            largest.append(max(every))
    assert len(decisive) >= 3, f"the seed gives too few decisive steps ({len(decisive)}): pick more steps"
    fast = sum(ms < SLOW_MS / 2 for ms in decisive)
    if place == "step":
        assert fast >= 0.75 * len(decisive), (decisive, largest)
    else:  # the old placement: each waits behind its step's slow draw
        assert fast <= 0.25 * len(decisive), (decisive, largest)
