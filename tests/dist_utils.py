"""Real multi-process harness for tests: spawns N ranks that run one function, with a hard timeout.

Each rank gets MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE in its environment (as under torchrun) and runs
``fn(rank, world_size, *args)``; its return value (picklable) comes back. A rank that raises fails the test with
its traceback; ranks still running at the deadline are killed and the test fails with a TimeoutError naming
them, so a hang costs at most ``timeout`` seconds.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn, rank, world_size, port, queue, env, args):
    os.environ.update({
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "OMP_NUM_THREADS": "1",
    })
    os.environ.update(env or {})
    if "TORCH_DISTRIBUTED_DEBUG" in (env or {}):
        import torch.distributed as dist

        dist.set_debug_level_from_env()  # torch read the variable at import, before this function ran
    try:
        result = fn(rank, world_size, *args)
        queue.put(("ok", rank, result))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        queue.put(("err", rank, traceback.format_exc()))
    finally:
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 60.0,
              env: dict[str, str] | None = None, expect_exit: set[int] | None = None) -> dict[int, Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes; return {rank: result}.

    Args:
        fn: a module-level function (it is pickled by reference).
        world_size: number of ranks.
        *args: extra picklable arguments.
        timeout: seconds before every remaining rank is killed and the test fails.
        env: extra environment variables for the ranks.
        expect_exit: ranks that are expected to die without reporting (fault tests).
    """
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(fn, r, world_size, port, queue, env, args), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    expect_exit = expect_exit or set()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    waiting = set(range(world_size)) - expect_exit
    try:
        while waiting and time.monotonic() < deadline:
            if queue.empty():
                dead = [r for r in waiting if not procs[r].is_alive() and procs[r].exitcode not in (0, None)]
                if dead and queue.empty():
                    for r in dead:
                        errors[r] = f"rank {r} died with exit code {procs[r].exitcode} and no report"
                        waiting.discard(r)
                time.sleep(0.02)
                continue
            status, rank, value = queue.get()
            if rank in expect_exit:
                continue
            waiting.discard(rank)
            if status == "ok":
                results[rank] = value
            else:
                errors[rank] = value
    finally:
        for p in procs:
            p.join(timeout=max(0.1, min(10.0, deadline - time.monotonic())))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        msg = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(errors.items()))
        raise AssertionError(f"{len(errors)} rank(s) failed:\n{msg}")
    if waiting:
        raise TimeoutError(f"ranks {sorted(waiting)} did not finish within {timeout:.0f} s (killed)")
    return results
