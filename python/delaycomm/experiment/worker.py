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

__all__ = ["MODELS", "build_model", "shard_indices", "steps_per_epoch", "run_rank"]


def _mlp(n_in: int, n_out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(n_in, 64), nn.ReLU(), nn.Linear(64, n_out))


def _logreg(n_in: int, n_out: int) -> nn.Module:
    return nn.Linear(n_in, n_out)


# name -> (builder(n_features, n_classes), description)
MODELS = {
    "mlp": (_mlp, "MLP 64-64-10 (ReLU), 4810 parameters"),
    "logreg": (_logreg, "multinomial logistic regression 64-10, 650 parameters"),
}


def build_model(name: str, n_in: int, n_out: int, seed: int) -> nn.Module:
    """The model ``name`` with its initial weights drawn from ``seed`` (identical on every rank and config)."""
    torch.manual_seed(seed)
    return MODELS[name][0](n_in, n_out)


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


def _evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    with torch.no_grad():
        logits = model(x)
        loss = F.cross_entropy(logits, y).item()
        acc = (logits.argmax(dim=1) == y).float().mean().item()
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


def _train(rank: int, world: int, job: dict[str, Any], data: dict[str, np.ndarray], post) -> dict[str, Any]:
    x_train = torch.from_numpy(data["x_train"])
    y_train = torch.from_numpy(data["y_train"])
    x_test = torch.from_numpy(data["x_test"])
    y_test = torch.from_numpy(data["y_test"])
    n_classes = int(data["n_classes"])
    model = build_model(job["model"], x_train.shape[1], n_classes, job["seed"])
    initial_train_loss, _ = _evaluate(model, x_train, y_train)
    stale = job["options"].get("staleness", "bsp") not in ("bsp", "ssp:0")
    ddp = _distribute(model, job.get("parallel", "ddp"), stale)
    opt = torch.optim.SGD(model.parameters(), lr=job["lr"], momentum=job["momentum"])
    stop_group = dist.new_group(backend="gloo") if job["budget_s"] is not None else None
    if job["backend"] == "delaycomm":
        dist.barrier()
        delaycomm.reset_stats(dist.group.WORLD)  # count the training steps only, not the setup
    else:
        dist.barrier()

    spe = steps_per_epoch(len(x_train), world, job["batch_size"])
    bs = job["batch_size"]
    losses: list[float] = []
    step_s: list[float] = []
    end_s: list[float] = []
    epochs: list[dict[str, float]] = []
    unreported = 0
    stop = False
    t0 = time.perf_counter()
    for epoch in range(job["epochs"]):
        idx = torch.from_numpy(shard_indices(len(x_train), world, rank, bs, job["seed"], epoch))
        for s in range(spe):
            batch = idx[s * bs : (s + 1) * bs]
            start = time.perf_counter()
            loss = F.cross_entropy(ddp(x_train[batch]), y_train[batch])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            end = time.perf_counter()
            losses.append(loss.item())
            step_s.append(end - start)
            end_s.append(end - t0)
            unreported += 1
            if rank == 0 and unreported >= job["progress_every"]:
                post("progress", unreported)
                unreported = 0
            if stop_group is not None:
                flag = torch.tensor([1 if end - t0 >= job["budget_s"] else 0])
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=stop_group)
                if flag.item():
                    stop = True
                    break
        test_loss, test_acc = _evaluate(model, x_test, y_test)
        epochs.append(
            {
                "epoch": epoch + 1,
                "step": len(losses),
                "t_s": time.perf_counter() - t0,
                "test_loss": test_loss,
                "test_accuracy": test_acc,
            }
        )
        if stop:
            break
    wall_s = time.perf_counter() - t0
    # The telemetry of the training steps, read before flush() adds a collective of its own.
    stats = delaycomm.stats(dist.group.WORLD) if job["backend"] == "delaycomm" else None
    # Contributions still deferred at the last step: delivered (so the group ends clean) but not applied to the
    # model, as no step follows. Counted so that the report can say how many there were.
    pending_at_end = len(delaycomm.flush(dist.group.WORLD)) if stale else 0
    if rank == 0 and unreported:
        post("progress", unreported)

    final_train_loss, train_acc = _evaluate(model, x_train, y_train)
    test_loss, test_acc = _evaluate(model, x_test, y_test)
    return {
        "rank": rank,
        "pid": os.getpid(),
        "wall_s": wall_s,
        "steps": len(losses),
        "steps_per_epoch": spe,
        "losses": losses,
        "step_s": step_s,
        "end_s": end_s,
        "epochs": epochs,
        "initial_train_loss": initial_train_loss,
        "final_train_loss": final_train_loss,
        "train_accuracy": train_acc,
        "test_loss": test_loss,
        "test_accuracy": test_acc,
        "stopped_by_budget": stop,
        "pending_keys_at_end": pending_at_end,
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
