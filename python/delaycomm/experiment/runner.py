"""Runs each config in fresh rank processes (the tools' launcher, :mod:`delaycomm._tools.launch`) and collects
what they measured.

The ranks of every config are new processes forked from one fork server that imported torch and delaycomm once
(importing torch takes seconds per process on a small machine; paying that once keeps ``--quick`` short while
every config still gets processes of its own). Rendezvous goes through one TCPStore that the parent hosts on a
port the OS picks, with a key prefix per config, so there is no free-port race.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from delaycomm._tools.launch import run_ranks
from delaycomm.experiment.configs import ExperimentConfig, resolved_options
from delaycomm.experiment.tasks import TASKS, load_digits_split

__all__ = ["Hyper", "load_digits_split", "Runner"]

# After one rank reports an error, how long the others get to report theirs before they are stopped.
_GRACE_S = 10.0
# NOTE: DistributedDataParallel imports torch._dynamo and friends the first time one is built (seconds of imports);
# the fork server imports them once per experiment instead of once per rank per config. Importing them starts no
# thread, so forking stays safe. (Not imported by worker.py itself: the command line imports worker.py for its
# model table and must not pay for them.)
_PRELOAD = (
    "delaycomm.experiment.worker",
    "torch._dynamo",
    "torch.distributed._functional_collectives",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
)


@dataclasses.dataclass(frozen=True)
class Hyper:
    """Everything that is identical across configs (the seed: across the configs of one seed)."""

    model: str
    epochs: int
    batch_size: int
    lr: float
    momentum: float
    seed: int
    nproc: int
    delay: str
    budget_s: float | None
    timeout_s: float
    step_ms: float | None = None
    test_fraction: float = 0.2
    task: str = "digits"
    fraction: float | None = None
    ema_alpha: float | None = None
    warmup_steps: int = 0
    measure: bool = False
    measure_every: int = 1
    oscillation_steps: int = 200

    @property
    def hidden(self) -> int:
        return TASKS[self.task].hidden


class Runner:
    """Owns the rendezvous store and the fork server for one experiment."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self._store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
        self.port = self._store.port
        self._runs = 0

    def run(
        self, config: ExperimentConfig, hp: Hyper, data: dict[str, np.ndarray], progress: Callable[[int], None]
    ) -> dict[str, Any]:
        """Train ``config`` on ``hp.nproc`` fresh processes.

        Returns:
            ``{"status": "ok" | "unavailable" | "failed" | "timeout", "message": str, "options": dict,
            "ranks": [per-rank result dicts, by rank], "startup_s": float}``.
        """
        from delaycomm.experiment.worker import run_rank

        self._runs += 1
        options = resolved_options(config, hp.delay, hp.seed, hp.step_ms, hp.fraction, hp.ema_alpha)
        job = {
            "backend": config.backend,
            "options": options,
            "model": hp.model,
            "epochs": hp.epochs,
            "batch_size": hp.batch_size,
            "lr": hp.lr,
            "momentum": hp.momentum,
            "seed": hp.seed,
            "budget_s": hp.budget_s,
            "timeout_s": hp.timeout_s,
            "progress_every": 5,
            "parallel": config.parallel,
            "hidden": hp.hidden,
            "warmup_steps": hp.warmup_steps if config.warmup_steps is None else config.warmup_steps,
            "measure": hp.measure,
            "measure_every": hp.measure_every,
        }
        prefix = f"delaycomm-experiment/{self._runs}-{config.name}/"
        started = time.monotonic()
        ready: set[int] = set()
        startup_s = None

        def on_message(kind: str, rank: int, payload: Any) -> None:
            nonlocal startup_s
            if kind == "progress":
                progress(payload)
            elif kind == "ready":
                ready.add(rank)
                if len(ready) == hp.nproc:
                    startup_s = time.monotonic() - started

        outcome = run_ranks(
            run_rank,
            hp.nproc,
            (self.port, prefix, job, data),
            start_method="forkserver",
            preload=_PRELOAD,
            deadline_s=hp.timeout_s,
            grace_s=_GRACE_S,
            on_message=on_message,
            name=f"experiment-{config.name}-rank",
        )
        results = outcome.results
        # A rank's error is (kind, message) from the worker, or a description of how its process ended.
        errors = {r: e if isinstance(e, tuple) else ("failed", e) for r, e in outcome.errors.items()}
        timed_out = outcome.timed_out

        out: dict[str, Any] = {"options": options, "startup_s": startup_s, "ranks": [], "message": ""}
        if timed_out and not errors:
            out["status"] = "timeout"
            out["message"] = f"timed out after {hp.timeout_s:g} s (--timeout) with {len(results)}/{hp.nproc} ranks done"
        elif errors:
            kinds = {k for k, _ in errors.values()}
            out["status"] = "unavailable" if kinds == {"unavailable"} else "failed"
            if out["status"] == "unavailable":
                out["message"] = "not available in this build: " + errors[min(errors)][1]
            else:
                out["message"] = "; ".join(f"rank {r}: {m}" for r, (k, m) in sorted(errors.items()) if k == "failed")
        else:
            out["status"] = "ok"
            out["ranks"] = [results[r] for r in range(hp.nproc)]
        return out
