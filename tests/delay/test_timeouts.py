"""Every wait that delaycomm adds ends by the group's timeout, in one clear timeout error; destroy never waits out a
delay (csrc/delay/DelayTimeout.hpp, docs/delay.md). Real processes, real Gloo; a 3 s group timeout.

Each test fails on the code before the fix: there the host delay and the slowdown blocked 30-50 s without an
error, the future of a held-back op (what DDP waits on) waited out the whole delay, and a call blocked in a host
delay went on sleeping through destroy_process_group.
"""

from __future__ import annotations

import pytest

from . import _timeout_workers as w
from ._mp import spawn

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(150)]

TIMEOUT_S = 3.0
# The error comes at the timeout, not before, and within 2 s after it (a loaded 2-core machine adds its latency).
LATE_S = 2.0
DELAYCOMM_TIMEOUT = "timed out after 3000 ms (the group's timeout)"
SUFFIX = "a delay longer than the timeout is a timeout"


def _assert_delaycomm_timeout(r: dict, *fragments: str) -> None:
    assert r["kind"] == "DistBackendError", r
    assert DELAYCOMM_TIMEOUT in r["msg"] and r["msg"].endswith(SUFFIX), r["msg"]
    for f in fragments:
        assert f in r["msg"], (f, r["msg"])
    assert TIMEOUT_S - 0.1 <= r["elapsed"] <= TIMEOUT_S + LATE_S, r


def _assert_peer_timed_out(r: dict) -> None:
    """The peer waits in its inner Gloo op for the call that never comes: Gloo's own timeout, in time."""
    assert r["kind"] != "ok", r
    assert "Timed out" in r["msg"] or "timed out" in r["msg"], r
    assert r["elapsed"] <= TIMEOUT_S + LATE_S, r


def test_host_delay_longer_than_the_timeout_fails_every_waiting_rank_in_time():
    r0, r1 = spawn(w.host_delay_timeout, 2, timeout=100, timeout_s=TIMEOUT_S)
    _assert_delaycomm_timeout(
        r0,
        "allreduce (sequence number 1): the call ",
        "held back on the calling thread by an injected delay of 30000 ms (delay_where=host)",
    )
    _assert_peer_timed_out(r1)


def test_slowdown_longer_than_the_timeout_fails_every_waiting_rank_in_time():
    r0, r1 = spawn(w.slowdown_timeout, 2, timeout=100, timeout_s=TIMEOUT_S)
    _assert_delaycomm_timeout(
        r0, "allreduce (sequence number 2): the call ", "held back by the compute slowdown of 1000x"
    )
    assert r0["slowdown_calls"] == 0  # the cut-short sleep is an error, not a slowdown sample
    _assert_peer_timed_out(r1)


def test_future_of_a_held_back_op_fails_at_the_timeout():
    r0, r1 = spawn(w.future_timeout, 2, timeout=100, timeout_s=TIMEOUT_S)
    _assert_delaycomm_timeout(
        r0, "allreduce (sequence number 1): the op ", "held back by an injected delay of 30000 ms"
    )
    assert r0["completed"]  # the work reports the failure too
    _assert_peer_timed_out(r1)


def test_unmodified_ddp_step_under_a_delay_longer_than_the_timeout_fails_in_time():
    r0, r1 = spawn(w.ddp_timeout, 2, timeout=100, timeout_s=TIMEOUT_S)
    # DDP waits on the bucket's future: rank 0 gets delaycomm's timeout error (DDP may wrap it in its own).
    assert r0["kind"] != "ok" and DELAYCOMM_TIMEOUT in r0["msg"], r0
    assert r0["elapsed"] <= TIMEOUT_S + LATE_S, r0
    _assert_peer_timed_out(r1)


def test_destroy_with_held_ops_is_fast_issues_them_and_fails_blocked_calls_clearly():
    r0, r1 = spawn(w.destroy_with_held_ops, 2, timeout=100)
    for r in (r0, r1):
        assert r["pending_before"] == 8, r
        assert r["destroy_s"] < 2.0, r  # the delays are 30 s: nothing was waited out
        assert r["outcomes"] == ["ok"] * 8, r  # issued at destroy, in order, on every rank: nothing lost
        assert r["threads_before"] and r["threads_after"] == [], r  # the issuer thread was joined
    # Rank 0's other thread was asleep in a 30 s host delay: destroy woke it, its call failed at once, clearly.
    assert not r0["blocked_thread_alive"], r0
    b = r0["blocked"]
    assert b["kind"] == "DistBackendError", b
    assert b["msg"] == (
        "delaycomm: allreduce (sequence number 1): the group was shut down (destroy_process_group "
        "or abort) while this call was held back on the calling thread by an injected delay of "
        "30000 ms (delay_where=host); the op was not issued"
    ), b
    assert b["elapsed"] < 5.0, b
