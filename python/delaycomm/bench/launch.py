"""Where the ranks come from: spawned by the bench (``--nproc N``) or started by torchrun (one process per rank)."""

from __future__ import annotations

import os
import queue as queue_mod
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

from delaycomm.bench.settings import Settings

__all__ = ["under_torchrun", "torchrun_rank", "spawn", "RunFailed"]


class RunFailed(RuntimeError):
    """A rank raised, died or ran past the deadline (the message holds the rank's traceback)."""


def under_torchrun() -> bool:
    """True when this process is one rank of a torchrun (or any env:// launcher) job."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def torchrun_rank() -> tuple[int, int]:
    """(rank, world size) from the launcher's environment."""
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def _child(entry, rank: int, world_size: int, settings: Settings, init_method: str, clock, results, env) -> None:
    os.environ.update(env)
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size)})
    try:
        from delaycomm.bench import engine

        record = (entry or engine.run_rank)(rank, world_size, settings, init_method, clock)
        results.put(("ok", rank, record))
    except BaseException:  # noqa: BLE001 - every failure goes to the parent, with its traceback
        results.put(("err", rank, traceback.format_exc()))


def spawn(nproc: int, settings: Settings, clock: Callable[[], int] | None = None,
          entry: Callable[..., Any] | None = None, deadline_s: float | None = None) -> dict[str, Any]:
    """Run ``nproc`` ranks in fresh processes and return rank 0's record.

    Args:
        nproc: number of ranks.
        settings: the run's parameters.
        clock: a picklable nanosecond clock for the ranks (tests); default ``time.perf_counter_ns``.
        entry: the function each rank runs (default :func:`delaycomm.bench.engine.run_rank`, same signature).
        deadline_s: kill every rank and fail after this many seconds (default: no deadline: a long sweep may take
            long; a hung collective fails by the process-group timeout, a dead rank is noticed at once).

    Raises:
        RunFailed: a rank raised or died (the others are stopped at once), or the deadline passed.
    """
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    tmp = tempfile.mkdtemp(prefix="delaycomm-bench-")
    init_method = f"file://{os.path.join(tmp, 'store')}"
    # Like torchrun: one intra-op thread per rank unless the user chose otherwise (ranks share the cores).
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    procs = [ctx.Process(target=_child, args=(entry, r, nproc, settings, init_method, clock, results, env),
                         daemon=True) for r in range(nproc)]
    deadline = time.monotonic() + deadline_s if deadline_s is not None else None
    try:
        for p in procs:
            p.start()
        record, waiting = None, set(range(nproc))
        while waiting:
            msg = _poll(results)
            if msg is not None:
                status, rank, payload = msg
                if status == "err":
                    raise RunFailed(f"rank {rank} failed:\n{payload}")
                waiting.discard(rank)
                if rank == 0:
                    record = payload
                continue
            dead = [r for r in waiting if procs[r].exitcode is not None]
            if dead:
                time.sleep(0.2)  # a rank that reported just before exiting: read its message first
                if results.empty():
                    raise RunFailed(f"rank {dead[0]} died with exit code {procs[dead[0]].exitcode} without reporting")
            if deadline is not None and time.monotonic() > deadline:
                raise RunFailed(f"ranks {sorted(waiting)} still running at the deadline: stopped them")
        for p in procs:
            p.join(timeout=30)
        return record
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


def _poll(results) -> Any:
    if not results.empty():
        try:
            return results.get()
        except (EOFError, queue_mod.Empty):
            return None
    time.sleep(0.05)
    return None
