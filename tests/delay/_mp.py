"""Spawns real ranks (processes) that run one worker function each, with a store in a temporary directory."""

from __future__ import annotations

import os
import queue
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp


def _entry(fn: Callable[..., Any], rank: int, world_size: int, store_dir: str, q, kwargs: dict) -> None:
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    try:
        result = fn(rank, world_size, f"file://{store_dir}/store", **kwargs)
        q.put((rank, "ok", result))
    except BaseException:  # noqa: BLE001 - reported to the parent
        q.put((rank, "error", traceback.format_exc()))


def spawn(fn: Callable[..., Any], world_size: int = 2, timeout: float = 55.0, **kwargs: Any) -> list[Any]:
    """Runs ``fn(rank, world_size, init_method, **kwargs)`` in ``world_size`` processes; returns results by rank.

    Raises AssertionError with the rank's traceback when a rank fails, or when a rank has not answered (or
    exited non-zero) within ``timeout`` seconds; leftover processes are killed.
    """
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as store_dir:
        procs = [ctx.Process(target=_entry, args=(fn, r, world_size, store_dir, q, kwargs), daemon=True)
                 for r in range(world_size)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        results: dict[int, tuple[str, Any]] = {}
        try:
            while len(results) < world_size:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"ranks {sorted(set(range(world_size)) - set(results))} did not answer "
                                         f"within {timeout} s (a hang)")
                try:
                    rank, status, value = q.get(timeout=min(left, 1.0))
                except queue.Empty:
                    dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in results]
                    if dead:
                        raise AssertionError(f"ranks {dead} died with exit codes "
                                             f"{[procs[r].exitcode for r in dead]}") from None
                    continue
                results[rank] = (status, value)
            for p in procs:
                p.join(timeout=max(1.0, deadline - time.monotonic()))
            hung = [r for r, p in enumerate(procs) if p.is_alive()]
            assert not hung, f"ranks {hung} answered but did not exit (threads not joined?)"
            codes = [p.exitcode for p in procs]
            assert codes == [0] * world_size, f"exit codes {codes}"
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join(5)
    errors = {r: v for r, (s, v) in results.items() if s == "error"}
    assert not errors, "\n".join(f"--- rank {r}:\n{tb}" for r, tb in sorted(errors.items()))
    return [results[r][1] for r in range(world_size)]
