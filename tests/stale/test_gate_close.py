"""The SSP gate ends at once when the group is destroyed (docs/staleness.md, "The SSP gate"; real ranks)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from tests.harness import run_procs

pytestmark = [pytest.mark.multiproc]


def _seed() -> int:
    """A seed under which rank 1's first all-reduce is not delayed (a stream's first step defers nothing and pays its
    delay as under bsp: docs/staleness.md) and its contribution at the stream's second step is 20 s late."""
    from delaycomm import _C, _ops

    op = int(_ops.BY_NAME["allreduce"].kind)
    for seed in range(1000):
        s = _C.DelaySchedule("const:20s", 0.5, seed, [1])
        if all(s.delay_ns(1, op, q) == 0 for q in range(4)) and s.delay_ns(1, s.key_stream(0), 1) > 0:
            return seed
    raise AssertionError("no seed found")


def _gate_close_ranks(rank, world, seed):
    import torch
    import torch.distributed as dist

    import delaycomm

    # Rank 1 is late by 20 s at the stream's second step; under ssp:1 with a 10 ms step it waits ~20 s at the gate.
    # The group's timeout (30 s) does not end that wait.
    cfg = delaycomm.DelayConfig(
        delay="const:20s",
        delay_fraction=0.5,
        seed=seed,
        delay_ranks=[1],
        staleness="ssp:1",
        stale_policy="apply",
        step_ms=10.0,
    )
    dist.init_process_group("delaycomm", timeout=timedelta(seconds=30), pg_options=cfg)
    g = torch.ones(4)
    delaycomm.stale_allreduce(g, key=0)  # step 0: nothing is late yet
    outcome = {}

    def reduce():
        start = time.monotonic()
        try:
            delaycomm.stale_allreduce(g, key=0)
            outcome["error"] = None
        except Exception as e:  # noqa: BLE001 - the type is part of what is checked
            outcome["error"] = (type(e).__name__, str(e).split("Exception raised from")[0])
        outcome["ended"] = time.monotonic()
        outcome["started"] = start

    waiter = threading.Thread(target=reduce)
    waiter.start()
    time.sleep(1.5)  # rank 1's waiter is at the gate by now; rank 0's waits in Gloo for rank 1
    destroyed = time.monotonic()
    dist.destroy_process_group()
    waiter.join(20)
    return {
        "alive": waiter.is_alive(),
        "error": outcome.get("error"),
        "after_destroy_s": outcome["ended"] - destroyed if "ended" in outcome else None,
    }


@pytest.mark.timeout(90)
def test_destroy_wakes_a_thread_waiting_at_the_ssp_gate():
    results = run_procs(_gate_close_ranks, 2, _seed(), timeout=80)
    late = results[1]
    assert not late["alive"], late
    assert late["after_destroy_s"] is not None and late["after_destroy_s"] < 1.0, late
    kind, msg = late["error"]
    assert kind == "DistBackendError", late
    for part in (
        "the group was shut down (destroy_process_group or abort) while this call waited at the ssp:1 gate",
        "the reduction was not issued",
    ):
        assert part in msg, msg
    # Rank 0 issued its reduction and waited in Gloo for rank 1's: destroy ends that too.
    assert not results[0]["alive"] and results[0]["error"] is not None, results[0]
