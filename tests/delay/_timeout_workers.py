"""Rank functions for the timeout and destroy tests (real processes, real Gloo). Each returns plain data."""

from __future__ import annotations

import os
import threading
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

import delaycomm
from delaycomm._registry import backend_of


def _init(rank: int, world_size: int, init_method: str, timeout_s: float, **options) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "P99.99 > timeout" is the point here
        dist.init_process_group(
            "delaycomm",
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
            pg_options=delaycomm.DelayConfig(**options),
        )


def _outcome(fn) -> dict:
    """Runs fn(); how it ended, and when."""
    t0 = time.monotonic()
    try:
        fn()
        kind, msg = "ok", ""
    except Exception as e:  # noqa: BLE001 - reported
        kind, msg = type(e).__name__, str(e)
    return {"kind": kind, "msg": msg, "elapsed": time.monotonic() - t0}


def _issuer_threads() -> list[str]:
    """Names of this process's delaycomm issuer threads (they are named dc-issue-<group>)."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if name.startswith("dc-issue"):
            names.append(name)
    return names


def _outlive_the_peers_timeout(timeout_s: float) -> None:
    """Rank 0 stays until its peer, blocked in Gloo for the same timeout, has surely timed out: exit destroys the
    group, which issues any held op (it could still complete the peer's op just in time) and closes Gloo's
    connections (the peer would read "Connection closed by peer" instead of its timeout)."""
    time.sleep(timeout_s + 1.0)


def host_delay_timeout(rank, world_size, init_method, timeout_s=3.0):
    """delay_where=host, 30 s on rank 0, a 3 s timeout: rank 0's call and rank 1's wait both end in a timeout."""
    _init(
        rank,
        world_size,
        init_method,
        timeout_s,
        delay="const:30s",
        delay_fraction=1.0,
        delay_ranks="0",
        delay_ops="allreduce",
        delay_where="host",
    )
    out = _outcome(lambda: dist.all_reduce(torch.ones(4)))
    _outlive_the_peers_timeout(timeout_s)
    return out


def slowdown_timeout(rank, world_size, init_method, timeout_s=3.0, compute_s=0.05):
    """slowdown=0:1000x after 50 ms of "compute": rank 0 would block 50 s; the timeout is 3 s."""
    _init(rank, world_size, init_method, timeout_s, slowdown="0:1000x")
    dist.all_reduce(torch.ones(4))  # the first op: nothing measured yet, no slowdown
    time.sleep(compute_s)
    out = _outcome(lambda: dist.all_reduce(torch.ones(4)))
    out["slowdown_calls"] = delaycomm.stats(dist.group.WORLD)["slowdown"]["calls"]
    _outlive_the_peers_timeout(timeout_s)
    return out


def future_timeout(rank, world_size, init_method, timeout_s=3.0):
    """Network delay of 30 s on rank 0, a 3 s timeout, and the caller waits on the work's future (as DDP does)."""
    _init(
        rank,
        world_size,
        init_method,
        timeout_s,
        delay="const:30s",
        delay_fraction=1.0,
        delay_ranks="0",
        delay_ops="allreduce",
    )
    work = dist.all_reduce(torch.ones(4), async_op=True)
    out = _outcome(lambda: work.get_future().wait())
    out["completed"] = work.is_completed()
    _outlive_the_peers_timeout(timeout_s)
    return out


def ddp_timeout(rank, world_size, init_method, timeout_s=3.0):
    """An unmodified DDP step under a network delay of 30 s on rank 0 and a 3 s timeout: the step fails."""
    _init(
        rank,
        world_size,
        init_method,
        timeout_s,
        delay="const:30s",
        delay_fraction=1.0,
        delay_ranks="0",
        delay_ops="allreduce",
    )
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))

    def step():
        ddp(torch.randn(4, 8)).sum().backward()

    out = _outcome(step)
    # destroy issues rank 0's held op: wait until rank 1 has surely timed out, or that op could still complete
    # rank 1's all-reduce just in time.
    time.sleep(timeout_s + 1.0)
    dist.destroy_process_group()
    return out


def destroy_with_held_ops(rank, world_size, init_method, n=8):
    """destroy_process_group() with ops held back for 30 s on every rank, and on rank 0 a second thread blocked
    in a host-delayed call (30 s) of another group: destroy is fast, the held ops are issued (their results are
    right), the blocked call fails at once with a clear error, and no issuer thread is left."""
    _init(rank, world_size, init_method, 60.0, delay="const:30s", delay_fraction=1.0, delay_ops="allreduce")
    host = dist.new_group(
        backend="delaycomm",
        pg_options=delaycomm.DelayConfig(
            delay="const:30s", delay_fraction=1.0, delay_ranks="0", delay_ops="allreduce", delay_where="host"
        ),
    )
    backend = backend_of(dist.group.WORLD)
    tensors = [torch.full((8,), float(rank + 1)) for _ in range(n)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    blocked: dict = {}
    thread = None
    if rank == 0:
        thread = threading.Thread(
            target=lambda: blocked.update(_outcome(lambda: dist.all_reduce(torch.ones(4), group=host)))
        )
        thread.start()
    time.sleep(0.5)  # rank 0's thread enters its 30 s host delay (rank 1 pairs nothing with it)
    pending_before = backend.pending_delayed_ops()
    threads_before = _issuer_threads()
    t0 = time.monotonic()
    dist.destroy_process_group()
    destroy_s = time.monotonic() - t0
    if thread is not None:
        thread.join(timeout=10.0)
    outcomes = []
    for w, t in zip(works, tensors):
        r = _outcome(w.wait)
        outcomes.append(
            "ok"
            if r["kind"] == "ok" and torch.all(t == sum(range(1, world_size + 1)))
            else f"{r['kind']}: {r['msg'][:200]}"
        )
    return {
        "pending_before": pending_before,
        "destroy_s": destroy_s,
        "outcomes": outcomes,
        "blocked": blocked,
        "blocked_thread_alive": thread.is_alive() if thread else False,
        "threads_before": threads_before,
        "threads_after": _issuer_threads(),
    }
