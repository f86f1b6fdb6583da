"""One rank of one config: DDP training of a small model on a shard of the data, measured step by step.

Runs in a process forked from the experiment's fork server (torch and delaycomm already imported there). Talks to
the parent only through a queue: ``("ready", rank)``, ``("progress", steps)`` from rank 0, then one
``("result", rank, dict)`` or ``("error", rank, kind, message)`` per rank. ``kind`` is ``"unavailable"`` for a
ValueError raised while the process group is created (an option this build does not accept) and ``"failed"`` for
anything else.
"""

from __future__ import annotations

import os
import time
import traceback
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import delaycomm
from delaycomm._tools.launch import RankError
from delaycomm.experiment.probe import UpdateProbe
from delaycomm.schedule import EpochWarmup

__all__ = ["MODELS", "build_model", "describe_model", "shard_indices", "steps_per_epoch", "run_rank"]


def _mlp(n_in: int, n_out: int, hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_out))


def _logreg(n_in: int, n_out: int, hidden: int) -> nn.Module:
    return nn.Linear(n_in, n_out)


# name -> (builder(n_features, n_outputs, hidden), description)
MODELS = {
    "mlp": (_mlp, "MLP (one hidden layer, ReLU)"),
    "logreg": (_logreg, "linear (logistic regression for a classification task)"),
}


def build_model(name: str, n_in: int, n_out: int, seed: int, hidden: int = 64) -> nn.Module:
    """The model ``name`` with its initial weights drawn from ``seed`` (identical on every rank and config)."""
    torch.manual_seed(seed)
    return MODELS[name][0](n_in, n_out, hidden)


def describe_model(name: str, n_in: int, n_out: int, hidden: int) -> str:
    """``MLP 64-64-10 (ReLU), 4810 parameters``: for headers."""
    n = sum(p.numel() for p in build_model(name, n_in, n_out, 0, hidden).parameters())
    shape = f"{n_in}-{hidden}-{n_out}" if name == "mlp" else f"{n_in}-{n_out}"
    return f"{'MLP' if name == 'mlp' else 'linear'} {shape}{' (ReLU)' if name == 'mlp' else ''}, {n} parameters"


def steps_per_epoch(n_train: int, world: int, batch_size: int) -> int:
    """Steps per epoch: every rank gets the same number of full batches (the remainder is left out)."""
    return (n_train // world) // batch_size


def shard_indices(n_train: int, world: int, rank: int, batch_size: int, seed: int, epoch: int) -> np.ndarray:
    """Rank ``rank``'s sample indices for ``epoch``: a permutation drawn from (seed, epoch), dealt round-robin.

    The same on every run and for every config; the shards of one epoch are disjoint.
    """
    perm = np.random.default_rng([seed, epoch]).permutation(n_train)
    per_rank = steps_per_epoch(n_train, world, batch_size) * batch_size
    return perm[rank::world][:per_rank]


def _loss_fn(regression: bool):
    if regression:
        return lambda out, y: F.mse_loss(out.squeeze(-1), y)
    return F.cross_entropy


def _evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, regression: bool) -> tuple[float, float]:
    """(loss, accuracy) for a classification task, (mean squared error, R²) for a regression task."""
    with torch.no_grad():
        out = model(x)
        if regression:
            mse = F.mse_loss(out.squeeze(-1), y).item()
            var = float(torch.var(y, unbiased=False).item())
            return mse, (1.0 - mse / var) if var > 0 else float("nan")
        loss = F.cross_entropy(out, y).item()
        acc = (out.argmax(dim=1) == y).float().mean().item()
    return loss, acc


def _distribute(model: nn.Module, parallel: str, stale: bool) -> nn.Module:
    """The model as the config distributes it (ExperimentConfig.parallel); what the training loop calls."""
    if parallel == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        # Every Linear layer its own parameter group, the root the rest; FSDP2's reduction scopes key the streams
        # (docs/staleness.md), so no hook is needed. NOTE: evaluation then all-gathers: every rank evaluates.
        for layer in model.modules():
            if isinstance(layer, nn.Linear) and layer is not model:
                fully_shard(layer)
        return fully_shard(model)
    ddp = DistributedDataParallel(model)
    if stale:
        # The staleness engine needs a stable key per DDP bucket: delaycomm's hook keys by bucket.index().
        ddp.register_comm_hook(state=None, hook=delaycomm.ddp_hook)
    return ddp


class _Loop:
    """The training loop's state, shared by its steps and the final result."""

    def __init__(self, rank: int, world: int, job: dict[str, Any], data: dict[str, np.ndarray], post) -> None:
        self.rank, self.world, self.job, self.post = rank, world, job, post
        self.x_train = torch.from_numpy(data["x_train"])
        self.y_train = torch.from_numpy(data["y_train"])
        self.x_test = torch.from_numpy(data["x_test"])
        self.y_test = torch.from_numpy(data["y_test"])
        n_classes = int(data["n_classes"])
        self.regression = n_classes == 0
        self.loss_fn = _loss_fn(self.regression)
        self.model = build_model(
            job["model"], self.x_train.shape[1], n_classes or 1, job["seed"], job.get("hidden", 64)
        )
        self.initial_train_loss, _ = self.evaluate(self.x_train, self.y_train)
        self.stale = job["options"].get("staleness", "bsp") not in ("bsp", "ssp:0")
        self.net = _distribute(self.model, job.get("parallel", "ddp"), self.stale)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=job["lr"], momentum=job["momentum"])
        self.spe = steps_per_epoch(len(self.x_train), world, job["batch_size"])
        warmup = job.get("warmup_steps") or 0
        self.sched = EpochWarmup(self.opt, warmup, steps_per_epoch=self.spe) if warmup > 1 else None
        self.probe = (
            UpdateProbe(self.model, self.loss_fn, self.x_train, self.y_train, job.get("measure_every", 1))
            if (job.get("measure") and rank == 0)
            else None
        )
        self.losses: list[float] = []
        self.step_s: list[float] = []
        self.end_s: list[float] = []
        self.epochs: list[dict[str, float]] = []
        self.unreported = 0

    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        return _evaluate(self.model, x, y, self.regression)

    def step(self, batch: torch.Tensor, global_batch, t0: float) -> float:
        start = time.perf_counter()
        loss = self.loss_fn(self.net(self.x_train[batch]), self.y_train[batch])
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.probe is not None:
            self.probe.record(global_batch())
        self.opt.step()
        if self.sched is not None:
            self.sched.step()
        end = time.perf_counter()
        self.losses.append(loss.item())
        self.step_s.append(end - start)
        self.end_s.append(end - t0)
        self.unreported += 1
        if self.rank == 0 and self.unreported >= self.job["progress_every"]:
            self.post("progress", self.unreported)
            self.unreported = 0
        return end


def _train(rank: int, world: int, job: dict[str, Any], data: dict[str, np.ndarray], post) -> dict[str, Any]:
    lp = _Loop(rank, world, job, data, post)
    stop_group = dist.new_group(backend="gloo") if job["budget_s"] is not None else None
    dist.barrier()
    if job["backend"] == "delaycomm":
        delaycomm.reset_stats(dist.group.WORLD)  # count the training steps only, not the setup
    bs, n_train = job["batch_size"], len(lp.x_train)
    stop = False
    t0 = time.perf_counter()
    for epoch in range(job["epochs"]):
        shards = [torch.from_numpy(shard_indices(n_train, world, r, bs, job["seed"], epoch)) for r in range(world)]
        for s in range(lp.spe):
            end = lp.step(
                shards[rank][s * bs : (s + 1) * bs],
                lambda s=s, shards=shards: torch.cat([sh[s * bs : (s + 1) * bs] for sh in shards]),
                t0,
            )
            if stop_group is not None:
                flag = torch.tensor([1 if end - t0 >= job["budget_s"] else 0])
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=stop_group)
                if flag.item():
                    stop = True
                    break
        test_loss, test_score = lp.evaluate(lp.x_test, lp.y_test)
        lp.epochs.append(
            {
                "epoch": epoch + 1,
                "step": len(lp.losses),
                "t_s": time.perf_counter() - t0,
                "test_loss": test_loss,
                ("test_r2" if lp.regression else "test_accuracy"): test_score,
            }
        )
        if stop:
            break
    wall_s = time.perf_counter() - t0
    # The telemetry of the training steps, read before flush() adds a collective of its own.
    stats = delaycomm.stats(dist.group.WORLD) if job["backend"] == "delaycomm" else None
    # Contributions still deferred at the last step: delivered (so the group ends clean) but not applied to the
    # model, as no step follows. Counted so that the report can say how many there were.
    pending_at_end = len(delaycomm.flush(dist.group.WORLD)) if lp.stale else 0
    if rank == 0 and lp.unreported:
        post("progress", lp.unreported)
    final_train_loss, train_score = lp.evaluate(lp.x_train, lp.y_train)
    test_loss, test_score = lp.evaluate(lp.x_test, lp.y_test)
    score = "r2" if lp.regression else "accuracy"
    return {
        "rank": rank,
        "pid": os.getpid(),
        "cpu_s": time.process_time(),  # this process's CPU time since it was forked
        "task_kind": "regression" if lp.regression else "classification",
        "wall_s": wall_s,
        "steps": len(lp.losses),
        "steps_per_epoch": lp.spe,
        "losses": lp.losses,
        "step_s": lp.step_s,
        "end_s": lp.end_s,
        "epochs": lp.epochs,
        "initial_train_loss": lp.initial_train_loss,
        "final_train_loss": final_train_loss,
        f"train_{score}": train_score,
        "test_loss": test_loss,
        f"test_{score}": test_score,
        "stopped_by_budget": stop,
        "pending_keys_at_end": pending_at_end,
        "probe": lp.probe.result() if lp.probe is not None else None,
        "stats": stats,
    }


def run_rank(
    rank: int, world: int, post, port: int, prefix: str, job: dict[str, Any], data: dict[str, np.ndarray]
) -> dict[str, Any]:
    """Entry point of one rank (a target of :func:`delaycomm._tools.launch.run_ranks`): posts "ready" and
    "progress", returns the rank's measurements, raises :class:`RankError` with ``(kind, message)``, kind
    "unavailable" (the config's options are refused by this build) or "failed"."""
    # NOTE: one intra-op thread per rank: the ranks share the machine's cores, and the comparison must not
    # depend on how many threads each config happened to get.
    torch.set_num_threads(1)
    # Each config sets its options as keywords; DELAYCOMM_* variables would fill in the rest differently per
    # config's gaps, so the experiment ignores them (the parent says so in its header).
    for name in [k for k in os.environ if k.startswith("DELAYCOMM_") and k != "DELAYCOMM_LOG_LEVEL"]:
        del os.environ[name]
    phase = "init"
    try:
        store = dist.TCPStore("127.0.0.1", port, None, is_master=False, timeout=timedelta(seconds=job["timeout_s"]))
        store = dist.PrefixStore(prefix, store)
        pg_options = delaycomm.DelayConfig(**job["options"]) if job["backend"] == "delaycomm" else None
        dist.init_process_group(
            job["backend"],
            store=store,
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=job["timeout_s"]),
            pg_options=pg_options,
        )
        phase = "train"
        post("ready")
        result = _train(rank, world, job, data, post)
        dist.destroy_process_group()
        return result
    except ValueError as e:
        kind = "unavailable" if phase == "init" else "failed"
        raise RankError((kind, str(e) if kind == "unavailable" else _describe(e))) from None
    except Exception as e:  # noqa: BLE001 - reported to the parent, which decides
        raise RankError(("failed", _describe(e))) from None


def _describe(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = f" (at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno})" if tb else ""
    return f"{type(e).__name__}: {e}{where}"
