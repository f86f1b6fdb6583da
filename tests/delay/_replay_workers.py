"""Rank functions of tests/delay/test_replay.py (real processes, real Gloo; docs/profile.md "Replay"). Each returns
plain data."""

from __future__ import annotations

import time
import warnings

import torch
import torch.distributed as dist

import delaycomm

from ._workers import _init


def carrier_after_send(rank, world_size, init_method, n=24, delay_ms=100):
    """A send from rank 0 to rank 1, then all-reduces under const:DELAY at fraction 1 in match mode: every call
    must take the delay (the ranks agree on its carrier although rank 2 made one call fewer)."""
    t_start = time.perf_counter()
    _init(rank, world_size, init_method, delay=f"const:{delay_ms}ms", delay_fraction=1.0, delay_mode="match")
    t_init = time.perf_counter()
    buf = torch.zeros(4)
    if rank == 0:
        dist.send(buf, dst=1)
    elif rank == 1:
        dist.recv(buf, src=0)
    t_p2p = time.perf_counter()
    t = torch.ones(256)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        dist.all_reduce(t, async_op=True).wait()
        times.append(time.perf_counter() - t0)
    carried = delaycomm.stats()["groups"]
    t_loop = time.perf_counter()
    dist.destroy_process_group()
    phases = [t_init - t_start, t_p2p - t_init, t_loop - t_p2p, time.perf_counter() - t_loop]
    return {"times": times, "carried": [g["ops"]["allreduce"]["match"]["calls"] for g in carried.values()],
            "phases": phases}  # fmt: skip


def queued_behind_held_back(rank, world_size, init_method, profile, rounds=6):
    """Rank 0 holds a 1 KiB all-reduce back ~150 ms and a 64 KiB one ~15 ms (a hand-made profile, add mode, rank 0
    only), both issued async back to back: the 64 KiB call waits behind the 1 KiB one on rank 0's issuer. Returns
    the per-size latency recorded (stats) and the script's own clock of the 64 KiB calls."""
    _init(rank, world_size, init_method, delay=f"profile:{profile}", delay_ranks="0", delay_mode="add")
    small, big = torch.ones(256), torch.ones(16384)
    own = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        w1 = dist.all_reduce(small, async_op=True)
        w2 = dist.all_reduce(big, async_op=True)
        w2.wait()
        own.append(time.perf_counter() - t0)
        w1.wait()
    ops = delaycomm.stats()["groups"]
    dist.destroy_process_group()
    (g,) = ops.values()
    return {"by_size": {c["bytes"]: c["latency"] for c in g["ops"]["allreduce"]["by_size"]}, "clock": own}


def target_below_own_latency(rank, world_size, init_method, profile, n=60):
    """A profile whose 4 MiB all-reduce takes 1 us, replayed with nothing but delay=profile:FILE: this machine
    takes longer, so (once calibrated) nothing is added; counted per size class and warned once."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.init_process_group("delaycomm", init_method=init_method, rank=rank, world_size=world_size,
                                pg_options=delaycomm.DelayConfig(delay=f"profile:{profile}"))  # fmt: skip
        t = torch.ones(1 << 20)
        for _ in range(n):
            dist.all_reduce(t, async_op=True).wait()
    g = delaycomm.stats(dist.group.WORLD)
    text = delaycomm.report(dist.group.WORLD)
    dist.destroy_process_group()
    return {
        "warnings": [str(m.message) for m in caught],
        "by_size": [(c["bytes"], c["match"]) for c in g["ops"]["allreduce"]["by_size"]],
        "match": g["ops"]["allreduce"]["match"],
        "report": text,
    }


def op_the_profile_lacks(rank, world_size, init_method, profile, n=4):
    """A profile of all-reduces only, replayed into calls of reduce and broadcast: each draws from what the profile
    has of its kind, and says so once."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.init_process_group("delaycomm", init_method=init_method, rank=rank, world_size=world_size,
                                pg_options=delaycomm.DelayConfig(delay=f"profile:{profile}"))  # fmt: skip
        t = torch.ones(256)
        for _ in range(n):
            dist.reduce(t, 0)
            dist.broadcast(t, 0)
    dist.destroy_process_group()
    return [str(m.message) for m in caught]
