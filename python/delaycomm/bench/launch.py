"""Where the ranks come from: spawned by the bench (``--nproc N``, through the tools' launcher) or started by
torchrun (one process per rank)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from delaycomm._tools.launch import run_ranks, torchrun_rank, under_torchrun
from delaycomm.bench.settings import Settings

__all__ = ["under_torchrun", "torchrun_rank", "spawn", "RunFailed"]


_PRELOAD = ("delaycomm.bench.engine",)


class RunFailed(RuntimeError):
    """A rank raised, died or ran past the deadline (the message holds the rank's traceback)."""


def _rank(rank: int, world_size: int, post, entry, settings: Settings, init_method: str, clock) -> Any:
    from delaycomm.bench import engine

    return (entry or engine.run_rank)(rank, world_size, settings, init_method, clock)


def spawn(
    nproc: int,
    settings: Settings,
    clock: Callable[[], int] | None = None,
    entry: Callable[..., Any] | None = None,
    deadline_s: float | None = None,
) -> dict[str, Any]:
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
    tmp = tempfile.mkdtemp(prefix="delaycomm-bench-")
    init_method = f"file://{os.path.join(tmp, 'store')}"
    # Like torchrun: one intra-op thread per rank unless the user chose otherwise (ranks share the cores).
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    # NOTE: on CPU the ranks fork from a fork server that imported torch once (seconds saved per rank and per
    # confirmation run); CUDA ranks start as fresh interpreters, the way torchrun starts them.
    fork = settings.device == "cpu"
    try:
        out = run_ranks(
            _rank,
            nproc,
            (entry, settings, init_method, clock),
            env=env,
            deadline_s=deadline_s,
            start_method="forkserver" if fork else "spawn",
            preload=_PRELOAD if fork else (),
            name="bench-rank",
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if out.errors:
        rank = next(iter(out.errors))  # the first to fail: the others may have failed waiting for it
        raise RunFailed(f"rank {rank} failed:\n{out.errors[rank]}")
    if out.timed_out:
        raise RunFailed(
            f"ranks {sorted(set(range(nproc)) - set(out.results))} still running at the deadline: stopped them"
        )
    return out.results[0]
