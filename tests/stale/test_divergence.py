"""The ranks' agreement at flush (docs/staleness.md, "Divergence"): ranks whose stale bookkeeping differs raise the
same error on every rank, a rank that does not call flush leaves the others a timeout error, never a collective
paired with another; DDP's join() with uneven inputs (real ranks, real Gloo)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from tests.harness import run_procs

pytestmark = [pytest.mark.multiproc]

TIMEOUT_S = 4.0


def _first_line(e: BaseException) -> str:
    return str(e).split("Exception raised from")[0].strip()


def _divergence_ranks(rank, world):
    import torch
    import torch.distributed as dist

    import delaycomm

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    cfg = delaycomm.DelayConfig(
        delay="exp:p99=30ms", delay_fraction=0.5, seed=4, staleness="ssp:2", stale_policy="apply", step_ms=10.0
    )
    out = {}

    # 1. The same streams on every rank, then one stream that only rank 1 reduces under a key of its own (the
    # collectives still pair: same op, same size). The engine cannot see it at the step; flush does, on every rank.
    group = dist.new_group(backend="delaycomm", pg_options=cfg, timeout=timedelta(seconds=TIMEOUT_S))
    g = torch.zeros(8, dtype=torch.float64)
    for t in range(40):
        g.fill_(float(t + rank))
        delaycomm.stale_allreduce(g, key=0 if t != 20 else 5 + rank, group=group)
    backend = group._get_backend(torch.device("cpu"))
    before = backend.stale_pending()
    start = time.monotonic()
    try:
        delaycomm.flush(group)
        out["diverged"] = None
    except RuntimeError as e:
        out["diverged"] = (type(e).__name__, _first_line(e), time.monotonic() - start)
    out["pending_kept"] = backend.stale_pending() == before and before[1] > 0

    # 2. Rank 1 does not call flush: rank 0's flush raises at the timeout, having issued nothing, so the next
    # collective of the two ranks pairs as it should.
    group2 = dist.new_group(backend="delaycomm", pg_options=cfg, timeout=timedelta(seconds=TIMEOUT_S))
    for _ in range(30):
        g.fill_(1.0)
        delaycomm.stale_allreduce(g, key=1, group=group2)
    if rank == 0:
        start = time.monotonic()
        try:
            delaycomm.flush(group2)
            out["missing"] = None
        except RuntimeError as e:
            out["missing"] = (type(e).__name__, _first_line(e), time.monotonic() - start)
    else:
        time.sleep(TIMEOUT_S + 1.0)
    x = torch.tensor([float(rank + 1)], dtype=torch.float64)
    dist.all_reduce(x, group=group2)  # 1 + 2 when rank 0's pairs with rank 1's
    out["after"] = x.item()
    return out


@pytest.mark.timeout(120)
def test_flush_detects_divergence_on_every_rank_and_never_pairs_with_another_collective():
    results = run_procs(_divergence_ranks, 2, timeout=110)
    kinds = {r["diverged"][0] for r in results}
    messages = {r["diverged"][1] for r in results}
    assert kinds == {"RuntimeError"} and len(messages) == 1, results  # the same error on every rank
    msg = messages.pop()
    for part in (
        "flush on group",
        "the ranks' stale bookkeeping differs",
        "their sequences of stale reductions differ (rank 0: 40 stale reductions; rank 1: 40 stale reductions)",
        "the first 16 are the same streams on every rank, the first 32 are not",
        "Every rank raises this error; nothing was flushed",
    ):
        assert part in msg, msg
    for r in results:
        assert r["diverged"][2] < TIMEOUT_S / 2, r  # at once, not at the timeout
        assert r["pending_kept"], r

    kind, msg, elapsed = results[0]["missing"]
    assert kind == "DistBackendError", results[0]
    assert "timed out after 4000 ms (the group's timeout): rank(s) 1 did not call flush" in msg, msg
    assert TIMEOUT_S - 0.5 <= elapsed <= TIMEOUT_S + 2.0, elapsed
    # flush issued no collective: the next all-reduce pairs rank 0's with rank 1's.
    assert [r["after"] for r in results] == [3.0, 3.0], results


def _join_ranks(rank, world, steps_of_rank):
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    import delaycomm

    cfg = delaycomm.DelayConfig(
        delay="exp:p99=30ms", delay_fraction=0.4, seed=2, staleness="ssp:2", stale_policy="apply"
    )
    dist.init_process_group("delaycomm", timeout=timedelta(seconds=30), pg_options=cfg)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()
    ddp = DDP(model, bucket_cap_mb=0.0005)
    ddp.register_comm_hook(None, delaycomm.ddp_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    with Join([ddp]):
        for _ in range(steps_of_rank[rank]):
            x = torch.randn(16, 8, generator=gen, dtype=torch.float64)
            loss = ddp(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    start = time.monotonic()
    flushed = delaycomm.flush()
    st = delaycomm.stats(dist.group.WORLD)["staleness"]
    return {
        "flushed": {k: v.tolist() for k, v in flushed.items()},
        "flush_s": time.monotonic() - start,
        "stale": st["stale"],
        "params": [p.detach().clone().tolist() for p in model.parameters()],
    }


@pytest.mark.timeout(150)
def test_ddp_join_with_uneven_inputs_flushes_the_same_on_every_rank():
    # Rank 1 runs out of data after 20 steps; rank 0 goes on for 40 (DDP's join() shadows its all-reduces).
    results = run_procs(_join_ranks, 2, [40, 20], timeout=140)
    r0, r1 = results
    assert r0["stale"] > 0, r0  # staleness engaged
    assert r0["flushed"] == r1["flushed"], results  # the same streams and sums on every rank
    assert r0["flush_s"] < 5.0 and r1["flush_s"] < 5.0, results  # no wait for a timeout
    assert r0["params"] == r1["params"]  # DDP's join syncs the final model
