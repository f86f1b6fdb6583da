"""The delay tests' workers take a store address (``file://``): :func:`spawn` gives them one over the one harness's
real processes (:func:`tests.harness.run_procs`, forked from a fork server that imported torch once)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

from tests.harness import run_procs


def _with_store(rank: int, world_size: int, fn: Callable[..., Any], init_method: str, kwargs: dict) -> Any:
    return fn(rank, world_size, init_method, **kwargs)


def spawn(fn: Callable[..., Any], world_size: int = 2, timeout: float = 55.0, **kwargs: Any) -> list[Any]:
    """Runs ``fn(rank, world_size, init_method, **kwargs)`` in ``world_size`` processes; returns results by rank.

    Raises AssertionError with every rank's traceback when a rank fails, exits non-zero, or has not finished (or
    not exited after answering) within ``timeout`` seconds; leftover processes are killed.
    """
    with tempfile.TemporaryDirectory() as store_dir:
        return run_procs(_with_store, world_size, fn, f"file://{store_dir}/store", kwargs, timeout=timeout)
