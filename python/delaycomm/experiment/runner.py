"""Runs each config in fresh rank processes and collects what they measured.

The ranks of every config are new processes forked from one fork server that imported torch and delaycomm once
(importing torch takes seconds per process on a small machine; paying that once keeps ``--quick`` short while
every config still gets processes of its own). Rendezvous goes through one TCPStore that the parent hosts on a
port the OS picks, with a key prefix per config, so there is no free-port race.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import queue as queue_module
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from delaycomm.experiment.configs import ExperimentConfig, resolved_options

__all__ = ["Hyper", "load_digits_split", "Runner"]

# After one rank reports an error, how long the others get to report theirs before they are stopped.
_GRACE_S = 10.0


@dataclasses.dataclass(frozen=True)
class Hyper:
    """Everything that is identical across configs."""

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


def load_digits_split(seed: int, test_fraction: float) -> dict[str, np.ndarray]:
    """scikit-learn's digits (1797 8x8 images, 10 classes; ships with the package), split stratified by ``seed``.

    Pixels are scaled from [0, 16] to [0, 1].
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y)
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test,
            "n_classes": np.int64(10)}


class Runner:
    """Owns the rendezvous store and the fork server for one experiment."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self._store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
        self.port = self._store.port
        self._ctx = multiprocessing.get_context("forkserver")
        # NOTE: DistributedDataParallel imports torch._dynamo and friends the first time one is built (seconds of
        # imports); the fork server imports them once per experiment instead of once per rank per config.
        # Importing them starts no thread, so forking stays safe. (Not imported by worker.py itself: the command
        # line imports worker.py for its model table and must not pay for them.)
        self._ctx.set_forkserver_preload(["delaycomm.experiment.worker", "torch._dynamo",
                                          "torch.distributed._functional_collectives", "torch.distributed.fsdp",
                                          "torch.distributed.tensor"])
        self._runs = 0

    def run(self, config: ExperimentConfig, hp: Hyper, data: dict[str, np.ndarray],
            progress: Callable[[int], None]) -> dict[str, Any]:
        """Train ``config`` on ``hp.nproc`` fresh processes.

        Returns:
            ``{"status": "ok" | "unavailable" | "failed" | "timeout", "message": str, "options": dict,
            "ranks": [per-rank result dicts, by rank], "startup_s": float}``.
        """
        from delaycomm.experiment.worker import run_rank

        self._runs += 1
        options = resolved_options(config, hp.delay, hp.seed, hp.step_ms)
        job = {
            "backend": config.backend, "options": options, "model": hp.model, "epochs": hp.epochs,
            "batch_size": hp.batch_size, "lr": hp.lr, "momentum": hp.momentum, "seed": hp.seed,
            "budget_s": hp.budget_s, "timeout_s": hp.timeout_s, "progress_every": 5, "parallel": config.parallel,
        }
        prefix = f"delaycomm-experiment/{self._runs}-{config.name}/"
        q = self._ctx.Queue()
        procs = [self._ctx.Process(target=run_rank, args=(r, hp.nproc, self.port, prefix, job, data, q),
                                   name=f"experiment-{config.name}-rank{r}", daemon=True)
                 for r in range(hp.nproc)]
        started = time.monotonic()
        for p in procs:
            p.start()
        deadline = started + hp.timeout_s
        results: dict[int, dict] = {}
        errors: dict[int, tuple[str, str]] = {}
        ready: set[int] = set()
        startup_s = None
        timed_out = False

        def handle(msg) -> None:
            nonlocal deadline, startup_s
            kind, rank = msg[0], msg[1]
            if kind == "progress":
                progress(msg[1])
            elif kind == "ready":
                ready.add(rank)
                if len(ready) == hp.nproc:
                    startup_s = time.monotonic() - started
            elif kind == "result":
                results[rank] = msg[2]
            elif kind == "error":
                errors[rank] = (msg[2], msg[3])
                deadline = min(deadline, time.monotonic() + _GRACE_S)

        while len(results) + len(errors) < hp.nproc:
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            try:
                handle(q.get(timeout=min(0.5, deadline - now)))
            except queue_module.Empty:
                self._check_dead(procs, results, errors, q, handle)
        self._stop(procs)
        q.close()

        out: dict[str, Any] = {"options": options, "startup_s": startup_s, "ranks": [], "message": ""}
        if timed_out and not errors:
            out["status"] = "timeout"
            out["message"] = (f"timed out after {hp.timeout_s:g} s (--timeout) with {len(results)}/{hp.nproc} "
                              f"ranks done")
        elif errors:
            kinds = {k for k, _ in errors.values()}
            out["status"] = "unavailable" if kinds == {"unavailable"} else "failed"
            if out["status"] == "unavailable":
                out["message"] = "not available in this build: " + errors[min(errors)][1]
            else:
                out["message"] = "; ".join(f"rank {r}: {m}" for r, (k, m) in sorted(errors.items())
                                           if k == "failed")
        else:
            out["status"] = "ok"
            out["ranks"] = [results[r] for r in range(hp.nproc)]
        return out

    @staticmethod
    def _check_dead(procs, results, errors, q, handle) -> None:
        """A rank that exited without a report (killed, crashed in native code) is an error of its own."""
        for rank, p in enumerate(procs):
            if p.exitcode is not None and rank not in results and rank not in errors:
                # Its last message may still be in the pipe: read what is there before judging.
                try:
                    while True:
                        handle(q.get(timeout=0.2))
                except queue_module.Empty:
                    pass
                if rank not in results and rank not in errors:
                    errors[rank] = ("failed", f"process exited with code {p.exitcode} without a report")

    @staticmethod
    def _stop(procs) -> None:
        for p in procs:
            p.join(timeout=5.0)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5.0)
            if p.is_alive():
                p.kill()
                p.join()
