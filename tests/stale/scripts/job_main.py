"""The ``main()`` of the stale job scripts (owners_job.py, paths_job.py, consume_job.py): each trains its paths one
after another on the default group, as a user's script does under torchrun, and saves each path's result per rank.
Imported as a sibling module: ``python script.py`` and the harness (tests/harness/user_job.py) both put the script's
folder first on ``sys.path``."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch
import torch.distributed as dist


def run_paths(doc: str, default_steps: int, train: Callable[[str, int, int, int], dict]) -> None:
    """Parse ``--paths/--steps/--out``, then for each path ``train(path, rank, world, steps)`` and save its result
    (with ``world``) to ``OUT/<path>.rank<r>.pt``; rank 0 prints each path's seconds."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paths", required=True, help="comma-separated paths (see above)")
    parser.add_argument("--steps", type=int, default=default_steps)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    dist.init_process_group(backend="delaycomm")
    rank, world = dist.get_rank(), dist.get_world_size()
    os.makedirs(args.out, exist_ok=True)
    for path in args.paths.split(","):
        t0 = time.perf_counter()
        result = train(path, rank, world, args.steps)
        result["world"] = world
        torch.save(result, os.path.join(args.out, f"{path}.rank{rank}.pt"))
        if rank == 0:
            print(f"path {path}: {time.perf_counter() - t0:.1f} s", flush=True)
    dist.destroy_process_group()
