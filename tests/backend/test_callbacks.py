"""A future's callbacks are user code and never run on a thread of delaycomm's that releases held-back ops (the
issuer thread): a callback that issues a collective and waits for it (torch's PowerSGD DDP hook) would otherwise
wait for the very thread it blocks (docs/core.md "Threads").

Real processes, real Gloo, the environment a user sets; every op delayed (fraction 1), so each nested all-reduce
is held back and released by the issuer thread. A short group timeout turns a deadlock into a fast failure, and
torch's inter-op pool has one thread (where delaycomm hands completions over). Each design is also run on a plain
Gloo group in the same processes: what Gloo itself cannot do (two outstanding futures whose callbacks block on
nested all-reduces occupy both of its worker threads) is not asked here.
"""

from __future__ import annotations

import math
import os
import threading
import warnings
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import delaycomm
from tests.harness import run_procs

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(120)]

TIMEOUT_S = 15
# Every op delayed: the nested all-reduces of the callbacks are held back too.
ENV = {"DELAYCOMM_DELAY": "const:5ms", "DELAYCOMM_DELAY_FRACTION": "1"}
ISSUER_PREFIX = "dc-issue"
# DDP steps; PowerSGD compresses from the third (start_powerSGD_iter=2), nesting two all-reduces in its callbacks.
STEPS, PLAIN_STEPS = 4, 2
# All-reduces per group: the chain's four, then PowerSGD's one per plain step and three per compressed step.
CALLED = 4 + PLAIN_STEPS + 3 * (STEPS - PLAIN_STEPS)


def _thread_name() -> str:
    """The OS name of the calling thread (delaycomm's issuer threads are named dc-issue-<group>)."""
    with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
        return f.read().strip()


def _issuer_threads() -> list[str]:
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            continue
    return [n for n in names if n.startswith(ISSUER_PREFIX)]


def _chain(group, rank: int, world_size: int, threads: list[str]) -> list[float]:
    """An all-reduce, then three ``then`` callbacks, each issuing an all-reduce and waiting for it (by its future,
    by its work, by a blocking call). Returns the four sums."""
    first = torch.full((4,), float(rank + 1))
    sums = []

    def stage(k: int, how: str):
        def cb(fut: torch.futures.Future) -> torch.Tensor:
            threads.append(_thread_name())
            sums.append(fut.value()[0][0].item())
            t = torch.full((4,), float((rank + 1) * 10**k))
            if how == "future":
                out = dist.all_reduce(t, group=group, async_op=True).get_future().wait()[0]
            elif how == "work":
                dist.all_reduce(t, group=group, async_op=True).wait()
                out = t
            else:
                dist.all_reduce(t, group=group)
                out = t
            return [out]

        return cb

    fut = dist.all_reduce(first, group=group, async_op=True).get_future()
    last = fut.then(stage(1, "future")).then(stage(2, "work")).then(stage(3, "blocking"))
    sums.append(last.wait()[0][0].item())
    return sums


def _powersgd(group, rank: int, steps: int, threads: list[str]) -> list[float]:
    """DDP with torch's PowerSGD hook; returns each step's loss."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)), process_group=group
    )
    state = powersgd.PowerSGDState(process_group=group, matrix_approximation_rank=1, start_powerSGD_iter=PLAIN_STEPS)

    def hook(state, bucket):
        # The end of PowerSGD's chain of callbacks, and where each of its nested all-reduces was called from.
        return powersgd.powerSGD_hook(state, bucket).then(lambda f: threads.append(_thread_name()) or f.value())

    model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(p).all() for p in model.parameters())
    return losses


def callbacks_worker(rank: int, world_size: int) -> dict:
    # torch's inter-op pool with one thread (a user may set it so): a callback blocked there must not keep the
    # completion it waits for from running.
    torch.set_num_interop_threads(1)
    dist.init_process_group("delaycomm", timeout=timedelta(seconds=TIMEOUT_S))
    gloo = dist.new_group(backend="gloo", timeout=timedelta(seconds=TIMEOUT_S))

    # The thread of every all-reduce called through torch.distributed: the first of each chain, and those that the
    # callbacks nest.
    called: list[str] = []
    all_reduce = dist.all_reduce

    def recording_all_reduce(*args, **kwargs):
        called.append(_thread_name())
        return all_reduce(*args, **kwargs)

    dist.all_reduce = recording_all_reduce
    out: dict = {}
    try:
        for name, group in (("gloo", gloo), ("delaycomm", None)):
            threads: list[str] = []
            called.clear()
            out[f"{name}_chain"] = _chain(group, rank, world_size, threads)
            out[f"{name}_chain_threads"] = list(threads)
            threads.clear()
            out[f"{name}_losses"] = _powersgd(group, rank, STEPS, threads)
            out[f"{name}_powersgd_threads"] = list(threads)
            out[f"{name}_called_threads"] = list(called)
    finally:
        dist.all_reduce = all_reduce

    # A group of one rank: its inner Gloo op completes at once, often before the issuer thread has attached it, so
    # that a future completed from the issuer thread is common here (rare on two ranks, where the op waits for the
    # peer).
    solo = [dist.new_group([r]) for r in range(world_size)][rank]
    threads = []
    out["solo_chain"] = _chain(solo, rank, 1, threads)
    futures = []
    for i in range(40):
        fut = dist.all_reduce(torch.full((4,), float(i)), group=solo, async_op=True).get_future()
        futures.append(fut.then(lambda f: threads.append(_thread_name()) or f.value()))
    out["solo_burst"] = [f.wait()[0][0].item() for f in futures]
    out["solo_threads"] = threads

    # An op held back past its group's timeout fails from the issuer thread, every time; the callback that sees
    # the failure issues a collective (on the group of one) and waits for it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the delay is longer than the timeout: the point here
        late = [
            dist.new_group([r], timeout=timedelta(seconds=1), pg_options=delaycomm.DelayConfig(delay="const:30s"))
            for r in range(world_size)
        ][rank]
    seen: dict = {}

    def on_failure(fut: torch.futures.Future) -> None:
        seen["thread"] = _thread_name()
        try:
            fut.value()
            seen["error"] = ""
        except Exception as e:  # noqa: BLE001 - what the callback sees is the point
            seen["error"] = str(e)
        t = torch.ones(4)
        dist.all_reduce(t, group=solo)
        seen["nested"] = t[0].item()

    dist.all_reduce(torch.ones(4), group=late, async_op=True).get_future().then(on_failure).wait()
    out["expired"] = seen
    out["issuers"] = _issuer_threads()
    st = delaycomm.stats(dist.group.WORLD)["ops"]["allreduce"]
    out["allreduce_calls"], out["allreduce_delayed"] = st["calls"], st["delayed_calls"]
    return out


def test_callbacks_issuing_collectives_never_run_on_the_issuer_thread():
    world_size = 2
    results = run_procs(callbacks_worker, world_size, timeout=100, env=ENV)
    ranks = range(1, world_size + 1)
    expected_chain = [float(sum(ranks) * 10**k) for k in range(4)]
    for rank, r in enumerate(results):
        for name in ("gloo", "delaycomm"):
            assert r[f"{name}_chain"] == expected_chain, (rank, name, r)
            assert len(r[f"{name}_chain_threads"]) == 3, (rank, name, r)
            losses = r[f"{name}_losses"]
            assert len(losses) == STEPS and all(math.isfinite(x) for x in losses), (rank, name, losses)
            # PowerSGD's chain ended once per step; from the third step on, its callbacks nested two all-reduces.
            assert len(r[f"{name}_powersgd_threads"]) == STEPS, (rank, name, r)
            assert len(r[f"{name}_called_threads"]) == CALLED, (rank, name, r)
            for t in r[f"{name}_chain_threads"] + r[f"{name}_powersgd_threads"] + r[f"{name}_called_threads"]:
                assert not t.startswith(ISSUER_PREFIX), (rank, name, t, r)
        # Every all-reduce of the delaycomm group was held back: the nested ones were released by the issuer.
        assert r["allreduce_calls"] == CALLED, (rank, r)
        assert r["allreduce_delayed"] == r["allreduce_calls"], (rank, r)
        # The group of one rank: the chain's sums, the burst's values, every callback off the issuer threads.
        assert r["solo_chain"] == [float((rank + 1) * 10**k) for k in range(4)], (rank, r)
        assert r["solo_burst"] == [float(i) for i in range(40)], (rank, r)
        assert len(r["solo_threads"]) == 3 + 40, (rank, r)
        assert not [t for t in r["solo_threads"] if t.startswith(ISSUER_PREFIX)], (rank, r["solo_threads"])
        assert len(r["issuers"]) == 3, (rank, r)  # the world's and this rank's two groups of one
        assert not r["expired"]["thread"].startswith(ISSUER_PREFIX), (rank, r["expired"])
        assert "timed out after 1000 ms (the group's timeout)" in r["expired"]["error"], (rank, r["expired"])
        assert r["expired"]["nested"] == 1.0, (rank, r["expired"])
        # The same training on both groups: the same losses.
        assert r["delaycomm_losses"] == pytest.approx(r["gloo_losses"], rel=1e-5), (rank, r)
