"""What DelayBackend forwards to its inner backends beyond the collectives, as c10d's ProcessGroupWrapper forwards
to the backend it wraps (csrc/backend/DelayBackend.hpp, docs/core.md "Forwarded to the inner backends").

Real processes, real Gloo; the environment a user sets. The NCCL-only forwards are checked in tests/gpu.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import delaycomm
from delaycomm._registry import backend_of
from tests.harness import run_procs

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(120)]

ENV = {"DELAYCOMM_DELAY": "const:5ms", "DELAYCOMM_DELAY_FRACTION": "1"}
SHORT_S = 2.0


def _outcome(fn) -> dict:
    t0 = time.monotonic()
    try:
        fn()
        kind, msg = "ok", ""
    except Exception as e:  # noqa: BLE001 - reported
        kind, msg = type(e).__name__, str(e)
    return {"kind": kind, "msg": msg, "elapsed": time.monotonic() - t0}


def forwarding_worker(rank: int, world_size: int) -> dict:
    dist.init_process_group("delaycomm", timeout=timedelta(seconds=60))
    world = dist.group.WORLD
    direct = dist.new_group(pg_options=delaycomm.DelayConfig(delay="none"))
    out: dict = {}

    # enableCollectivesTiming reaches Gloo (c10d's default raised "missing implementation" for delaycomm); a
    # work's duration is then its inner work's: a held-back op (the world: every op delayed), an op of the fast path
    # (a group without delay), and the same op on plain Gloo give the same answer.
    gloo = dist.new_group(backend="gloo")
    durations = []
    for group in (world, direct, gloo):
        group._enable_collectives_timing()
        work = dist.all_reduce(torch.ones(1024), group=group, async_op=True)
        work.wait()
        durations.append(_outcome(work._get_duration))
    out["durations"] = durations

    # What only NCCL implements fails in c10d's words naming delaycomm on a CPU group, or says "no".
    backend = world._get_backend(torch.device("cpu"))
    out["tensor_alloc"] = backend.supports_tensor_alloc(torch.device("cpu"))
    out["pending_works"] = _outcome(world._wait_for_pending_works)

    # setTimeout: the group's timeout, the inner Gloo's, and delaycomm's own wait for a held-back op. Rank 0's op is
    # held back 30 s (less than the 60 s the group was created with); the timeout set afterwards ends it in 2 s.
    held = dist.new_group(pg_options=delaycomm.DelayConfig(delay="const:30s", delay_ranks="0"))
    dist.barrier(direct)
    held.set_timeout(timedelta(seconds=SHORT_S))
    out["gloo_timeout_s"] = backend_of(held).inner("cpu").options._timeout.total_seconds()
    out["held"] = _outcome(lambda: dist.all_reduce(torch.ones(4), group=held))
    if rank == 0:
        # Stay until the peer, blocked in Gloo for the same timeout, has surely timed out: exit issues the held op.
        time.sleep(SHORT_S + 1.0)
    return out


def test_forwarded_to_the_inner_backends():
    results = run_procs(forwarding_worker, 2, timeout=100, env=ENV)
    for rank, r in enumerate(results):
        held, direct, gloo = r["durations"]
        assert held["msg"] == direct["msg"] == gloo["msg"] and held["kind"] == direct["kind"] == gloo["kind"], r
        assert r["tensor_alloc"] is False, (rank, r)
        assert "supports waitForPendingWorks, but got delaycomm backend" in r["pending_works"]["msg"], (rank, r)
        assert r["gloo_timeout_s"] == SHORT_S, (rank, r)
        # Both ranks fail at the new timeout, not the 30 s delay nor the 60 s the group was created with.
        assert r["held"]["kind"] != "ok" and r["held"]["elapsed"] < SHORT_S + 2.0, (rank, r)
    r0, r1 = results
    assert "timed out after 2000 ms (the group's timeout)" in r0["held"]["msg"], r0
    assert r0["held"]["elapsed"] >= SHORT_S - 0.1, r0
    assert "Timed out waiting 2000ms" in r1["held"]["msg"], r1
