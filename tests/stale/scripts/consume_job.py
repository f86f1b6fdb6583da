"""A user's training loops that consume gradients differently from the plain loop, run unmodified under torchrun by
tests/stale/test_consume.py (docs/staleness.md, "The rule").

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/stale/scripts/consume_job.py \
        --paths grow,overflow,skip --out DIR [--steps N]

Each path trains a small regression model (float64 unless said) on a process group of its own, ends as the guide
says (``opt.zero_grad(); delaycomm.flush(into_grad=True)``, then the last step: ``scaler.step(opt)`` under
GradScaler), and writes DIR/<path>.rank<r>.pt: what the optimizer consumed per parameter (each step's ``.grad``,
unscaled, read by an optimizer step pre hook: only steps taken fire it), what the rank computed per parameter at
the steps its optimizer took (a reference copy at the same parameters, unscaled: its contributions), the stats of
its group, and what the path forced. delaycomm is configured only through DELAYCOMM_* variables.

Paths (DDP unless said):
  grow      GradScaler, init_scale 2^8, growth_interval 2: the scale doubles every 2 steps, every step taken
  overflow  GradScaler, growth_interval 4, an overflow at step 12 on every rank (the loss times inf): that step is
            skipped, its late contributions discarded, the scale halved; staleness goes on after it
  default   GradScaler with its defaults
  skip      a loop that skips opt.step() every 5th step (zero_grad every step)
  gradnone  the first layer's weight.grad set to None after backward for the first steps (warm-up freezing),
            until the first step >= 6 after whose backward a contribution is in flight: it lands on a step that
            applies the weight, so the rule must discard it (forced: it does not depend on the seed's draws)
  bf16      bf16 autocast (float32 model), no scaler
  fsdp1     FSDP1 FULL_SHARD with ShardedGradScaler, growth_interval 2 (conservation: DELAYCOMM_STALE_CHECK=1)
  fsdp2     FSDP2 (fully_shard) with GradScaler, growth_interval 2 (conservation: DELAYCOMM_STALE_CHECK=1)
  lost      a loop that loses what flush delivered (flush() not applied, then a step): under
            DELAYCOMM_STALE_CHECK=1 that step raises, naming the parameters; ends at the first step >= 10 after
            whose backward a contribution is in flight (forced), and records the error
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from job_main import run_paths
from torch.nn.parallel import DistributedDataParallel as DDP

import delaycomm

DIM_IN, DIM_HIDDEN, DIM_OUT, BATCH = 16, 32, 4, 32
LR = 0.05
OVERFLOW_STEP = 12
SCALER_PATHS = {"grow": {"init_scale": 2.0**8, "growth_interval": 2}, "overflow": {"growth_interval": 4}, "default": {}}


def make_model(seed: int = 0, dtype=torch.float64) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(DIM_IN, DIM_HIDDEN), torch.nn.Tanh(), torch.nn.Linear(DIM_HIDDEN, DIM_OUT)
    ).to(dtype)


def batches(rank: int, steps: int, dtype=torch.float64):
    gen = torch.Generator().manual_seed(1 + rank)
    torch.manual_seed(1234)
    teacher = torch.randn(DIM_IN, DIM_OUT, dtype=dtype)
    for _ in range(steps):
        x = torch.randn(BATCH, DIM_IN, generator=gen, dtype=dtype)
        yield x, torch.tanh(x @ teacher)


def stale_calls(group) -> int:
    ops = delaycomm.stats(group)["ops"]
    return sum(o["stale_calls"] for op, o in ops.items() if op in ("allreduce", "_reduce_scatter_base"))


class Consumed:
    """What the optimizer consumed: each step's .grad (an optimizer step pre hook: only steps taken fire it)."""

    def __init__(self, opt, params):
        self.params = params
        self.sums = [torch.zeros_like(p, dtype=torch.float64) for p in params]
        self.steps = 0
        opt.register_step_pre_hook(self._hook)

    def _hook(self, opt, args, kwargs):
        self.steps += 1
        for s, p in zip(self.sums, self.params):
            if p.grad is not None:
                g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                s += g.double()


def train_ddp(path: str, rank: int, steps: int) -> dict:
    group = dist.new_group()
    dtype = torch.float32 if path == "bf16" else torch.float64
    model, local = make_model(dtype=dtype), make_model(dtype=dtype)
    ddp = DDP(model, process_group=group)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=LR)
    consumed = Consumed(opt, params)
    scaler = torch.amp.GradScaler("cpu", **SCALER_PATHS[path]) if path in SCALER_PATHS else None
    contributed = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    forced: dict = {}
    scales, losses, taken = [], [], []
    backend = delaycomm._registry.backend_of(group)  # only to force the gradnone path's in-flight contribution
    dropping = path == "gradnone"
    for step, (x, y) in enumerate(batches(rank, steps, dtype)):
        local.load_state_dict(model.state_dict())
        local.zero_grad()
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=path == "bf16")
        with autocast:
            torch.nn.functional.mse_loss(local(x), y).backward()
        mine = [q.grad.double().clone() for q in local.parameters()]
        opt.zero_grad()
        with autocast:
            loss = torch.nn.functional.mse_loss(ddp(x), y)
        if path == "overflow" and step == OVERFLOW_STEP:
            loss = loss * float("inf")
            forced["overflow_stale_before"] = stale_calls(group)
        (scaler.scale(loss) if scaler is not None else loss).backward()
        dropped_now = False
        if dropping:
            model[0].weight.grad = None  # warm-up freezing: the optimizer skips the weight
            dropped_now = True
            if step >= 6 and backend.stale_pending()[1] > 0:
                forced["gradnone_last_dropped"] = step
                forced["gradnone_in_flight"] = backend.stale_pending()[1]
                dropping = False
        before = consumed.steps
        if path == "skip" and step % 5 == 4:
            pass  # the loop skips this step
        elif scaler is not None:
            scales.append(scaler.get_scale())
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        if consumed.steps != before:
            taken.append(step)
            for i, (c, g) in enumerate(zip(contributed, mine)):
                if not (dropped_now and i == 0):
                    c += g
        losses.append(float(loss.detach()))
    opt.zero_grad()
    if delaycomm.flush(group, into_grad=True).grads:  # GradScaler.step needs a gradient to check
        if scaler is not None:
            scaler.step(opt)
        else:
            opt.step()
    return {
        "contributed": contributed,
        "consumed": consumed.sums,
        "steps_taken": consumed.steps,
        "taken": taken,
        "scales": scales,
        "losses": losses,
        "forced": forced,
        "stale_calls": stale_calls(group),
        "stats": delaycomm.stats(group),
    }


def train_fsdp(path: str, rank: int, world: int, steps: int) -> dict:
    """FSDP1 or FSDP2 with a GradScaler; what conserves is DELAYCOMM_STALE_CHECK=1's to check (at flush and at the
    step after it)."""
    group = dist.new_group()
    model = make_model()
    if path == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        net = FSDP(model, process_group=group, device_id=torch.device("cpu"))
        scaler = ShardedGradScaler("cpu", init_scale=2.0**8, growth_interval=2, process_group=group)
    else:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(group, "cpu")
        fully_shard(model, mesh=mesh)
        net = model
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    scales, losses = [], []
    for x, y in batches(rank, steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        scaler.scale(loss).backward()
        scales.append(scaler.get_scale())
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss.detach()))
    opt.zero_grad()
    if delaycomm.flush(group, into_grad=True).grads:
        scaler.step(opt)  # stale_check checks here that the flushed gradients were consumed
    return {"scales": scales, "losses": losses, "stale_calls": stale_calls(group), "stats": delaycomm.stats(group)}


def train_lost(rank: int, steps: int) -> dict:
    """Loses what flush delivered: stale_check must name the parameters at the step after the flush."""
    group = dist.new_group()
    model = make_model()
    ddp = DDP(model, process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    backend = delaycomm._registry.backend_of(group)  # only to force a contribution in flight at the flush
    in_flight = 0
    for step, (x, y) in enumerate(batches(rank, steps)):
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        in_flight = backend.stale_pending()[1]
        if step >= 10 and in_flight > 0:
            break
    opt.zero_grad(set_to_none=False)
    delaycomm.flush(group)  # not applied: lost
    error = ""
    try:
        opt.step()
    except RuntimeError as e:
        error = str(e)
    return {"in_flight": in_flight, "error": error, "stale_calls": stale_calls(group)}


def _train(path: str, rank: int, world: int, steps: int) -> dict:
    if path in ("fsdp1", "fsdp2"):
        return train_fsdp(path, rank, world, steps)
    if path == "lost":
        return train_lost(rank, steps)
    return train_ddp(path, rank, steps)


def main() -> None:
    run_paths(__doc__, 30, _train)


if __name__ == "__main__":
    main()
