"""A user's training jobs on the ecosystem's gradient paths, run unmodified under torchrun by
tests/stale/test_paths.py (docs/staleness.md, "Which reductions go stale").

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/stale/scripts/paths_job.py \
        --paths ddp,fp16,powersgd --out DIR [--steps N]

Each path trains a small float64 regression model for --steps steps on a process group of its own (so each
path calibrates step_ms=auto on its own, and its stats are its own), then calls delaycomm.flush() as a user would
at the end of training, and writes DIR/<path>.rank<r>.pt: the losses, the stats of its group(s), and for the
data-parallel paths the sum over the steps of the gradients each rank computed (its contributions) and of the
gradients DDP delivered, with what flush() delivered per parameter (FlushResult.grads, as a user applies it).
delaycomm is configured only through DELAYCOMM_* variables; every other option keeps its default.

Paths (2 ranks unless noted): ddp, tiny (1 KiB buckets), unused (find_unused_parameters, a head used on odd steps
only), static (static_graph), nosync (no_sync accumulation over 2 micro-batches), view (gradient_as_bucket_view),
fp16 and bf16 (torch's compress hooks; bf16's body as a user's hook: DDP refuses the hook itself without a GPU),
powersgd (PowerSGD, rank 2, compression from step 10), join (uneven inputs: rank r runs steps + 7 r steps under
ddp.join()), compiled (torch.compile of the DDP module: DDPOptimizer's graph split), cautograd (compiled
autograd: DDP's Python reducer), metric (a persistent float
tensor SUM-all-reduced every step, outside training), tp (tensor parallel: colwise + rowwise Linear, forward and
backward all-reduces), fsdp2, hsdp (4 ranks: 2 x 2 mesh), tp_fsdp2 (4 ranks: 2 x 2 mesh, FSDP2 over dp, TP over
tp).
"""

from __future__ import annotations

import collections
import contextlib

import torch
import torch.distributed as dist
from job_main import run_paths
from torch.nn.parallel import DistributedDataParallel as DDP

import delaycomm

DIM_IN, DIM_HIDDEN, DIM_OUT, BATCH = 16, 32, 4, 32
LR = 0.05


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(DIM_IN, DIM_HIDDEN), torch.nn.Tanh(), torch.nn.Linear(DIM_HIDDEN, DIM_OUT)
    ).double()


class TwoHeads(torch.nn.Module):
    """A trunk and two heads; head b is used on odd steps only (find_unused_parameters)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.trunk = torch.nn.Linear(DIM_IN, DIM_HIDDEN).double()
        self.a = torch.nn.Linear(DIM_HIDDEN, DIM_OUT).double()
        self.b = torch.nn.Linear(DIM_HIDDEN, DIM_OUT).double()

    def forward(self, x, use_b: bool):
        h = torch.tanh(self.trunk(x))
        return self.a(h) + (self.b(h) if use_b else 0.0)


def batches(rank: int, steps: int):
    """The same data stream for a rank under every staleness setting (seed 1 + rank)."""
    gen = torch.Generator().manual_seed(1 + rank)
    torch.manual_seed(1234)
    teacher = torch.randn(DIM_IN, DIM_OUT, dtype=torch.float64)
    for _ in range(steps):
        x = torch.randn(BATCH, DIM_IN, generator=gen, dtype=torch.float64)
        yield x, torch.tanh(x @ teacher)


def group_stats(group) -> dict:
    return delaycomm.stats(group)


def on_params(result, params, hook_layout) -> dict[int, torch.Tensor]:
    """What flush() delivered, per parameter (index into params -> tensor), as a user applies it: its ``grads``; a
    user's own comm hook's buckets (flush() cannot know how a hook uses its result: ``unapplied``) mapped by the hook's
    owner, who knows the bucket layout its hook saw (``hook_layout``: GradBucket.parameters() of each bucket)."""
    out = {}
    for p, g in result.grads.items():
        i = next(j for j, q in enumerate(params) if q is p)
        out[i] = out.get(i, 0) + g.double()
    if not result.unapplied:
        return out
    assert hook_layout, f"flush left streams unapplied on a path without a hook of the user's own: {result.unapplied}"
    assert not result.grads, "a path whose hook is the user's own has nothing flush() could apply"
    by_size = {}
    for bucket in hook_layout.values():
        by_size.setdefault(sum(p.numel() for p in bucket), []).append(bucket)
    for t in result.values():
        candidates = by_size.get(t.numel(), [])
        assert len(candidates) == 1, f"flush delivered {t.numel()} elements: no single bucket of that size"
        offset = 0
        for p in candidates[0]:
            i = next(j for j, q in enumerate(params) if q is p)
            out[i] = out.get(i, 0) + t[offset : offset + p.numel()].view_as(p).double()
            offset += p.numel()
    return out


def train_ddp(path: str, rank: int, world: int, steps: int) -> dict:
    group = dist.new_group()
    kwargs = {"process_group": group}
    if path == "tiny":
        kwargs["bucket_cap_mb"] = 1 / 1024
    elif path == "unused":
        kwargs["find_unused_parameters"] = True
    elif path == "static":
        kwargs["static_graph"] = True
    elif path == "view":
        kwargs["gradient_as_bucket_view"] = True
    model = TwoHeads() if path == "unused" else make_model()
    # The reference copy computes this rank's own gradient (its contribution) at the same parameters.
    local = TwoHeads() if path == "unused" else make_model()
    ddp = DDP(model, **kwargs)
    hook_layout: dict[int, list[torch.Tensor]] = {}
    if path in ("fp16", "bf16"):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        if path == "fp16":
            ddp.register_comm_hook(group, default_hooks.fp16_compress_hook)
        else:
            # DDP refuses bf16_compress_hook itself without CUDA or XPU; a user's hook runs its body on CPU.
            def bf16_hook(process_group, bucket):
                hook_layout[bucket.index()] = bucket.parameters()
                return default_hooks._compress_hook(torch.bfloat16, process_group, bucket)

            ddp.register_comm_hook(group, bf16_hook)
    elif path == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

        state = psgd.PowerSGDState(process_group=group, matrix_approximation_rank=2, start_powerSGD_iter=10)
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
    if path == "cautograd":
        # Compiled autograd: DDP's reducer runs in Python, its all-reduces traced into the compiled backward.
        torch._dynamo.config.optimize_ddp = "python_reducer"
        torch._dynamo.config.compiled_autograd = True
    # aot_eager: Dynamo and AOTAutograd, as under inductor (DDPOptimizer splits the graph at bucket boundaries;
    # compiled autograd traces the backward), without generating and compiling C++ kernels, which costs CI tens
    # of CPU seconds and changes nothing delaycomm sees.
    net = torch.compile(ddp, backend="aot_eager") if path in ("compiled", "cautograd") else ddp
    breaks_before = _graph_breaks() if path in ("compiled", "cautograd") else None
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=LR)
    contributed = [torch.zeros_like(p) for p in params]
    delivered = [torch.zeros_like(p) for p in params]
    losses = []
    my_steps = steps + 7 * rank if path == "join" else steps
    join = ddp.join() if path == "join" else contextlib.nullcontext()
    with join:
        for step, (x, y) in enumerate(batches(rank, my_steps)):
            use_b = step % 2 == 1

            def fwd(m, xx, use_b=use_b):
                return m(xx, use_b) if path == "unused" else m(xx)

            local.load_state_dict(model.state_dict())
            local.zero_grad()
            torch.nn.functional.mse_loss(fwd(local, x), y).backward()
            for c, q in zip(contributed, local.parameters()):
                if q.grad is not None:
                    c += q.grad
            opt.zero_grad()
            if path == "nosync":
                half = BATCH // 2
                with ddp.no_sync():
                    (torch.nn.functional.mse_loss(fwd(net, x[:half]), y[:half]) / 2).backward()
                loss = torch.nn.functional.mse_loss(fwd(net, x[half:]), y[half:]) / 2
                loss.backward()
                loss = loss * 2
            else:
                loss = torch.nn.functional.mse_loss(fwd(net, x), y)
                loss.backward()
            for d, p in zip(delivered, params):
                if p.grad is not None:
                    d += p.grad
            opt.step()
            losses.append(float(loss.detach()))
    result = delaycomm.flush(group)
    flushed = dict(result)
    flush_on_params = on_params(result, params, hook_layout)
    breaks = None
    if breaks_before is not None:
        breaks = _graph_breaks()
        breaks.subtract(breaks_before)
        breaks = {k: v for k, v in breaks.items() if v}
    return {
        "graph_breaks": breaks,
        "losses": losses,
        "contributed": contributed,
        "delivered": delivered,
        "flushed": flush_on_params,
        "flushed_numels": sorted(t.numel() for t in flushed.values()),
        "stats": [group_stats(group)],
    }


def _graph_breaks() -> collections.Counter:
    """Dynamo's graph breaks so far, by reason."""
    from torch._dynamo.utils import counters

    return collections.Counter(counters["graph_break"])


def train_metric(rank: int, world: int, steps: int) -> dict:
    """A persistent metric tensor SUM-all-reduced every step: never a gradient."""
    group = dist.new_group()
    metric = torch.zeros(8, dtype=torch.float64)
    contributed, delivered = torch.zeros(8, dtype=torch.float64), torch.zeros(8, dtype=torch.float64)
    gen = torch.Generator().manual_seed(1 + rank)
    for _ in range(steps):
        metric.copy_(torch.randn(8, generator=gen, dtype=torch.float64))
        contributed += metric
        dist.all_reduce(metric, group=group)
        delivered += metric
    flushed = delaycomm.flush(group)
    return {
        "losses": [],
        "contributed": [contributed],
        "delivered": [delivered],
        "flushed": {},
        "flushed_numels": [t.numel() for _, t in flushed],
        "stats": [group_stats(group)],
    }


def train_mesh(path: str, rank: int, world: int, steps: int) -> dict:
    """FSDP2, HSDP and TP (+ FSDP2) from DeviceMesh: every collective on the mesh's own groups."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if path == "fsdp2":
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    else:
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    model = make_model()
    if path in ("tp", "tp_fsdp2"):
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        # A replicated input layer, so that the colwise layer's input needs a gradient: TP's backward all-reduce.
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(DIM_IN, DIM_IN), torch.nn.Tanh(), *make_model()).double()
        parallelize_module(model, mesh["tp"], {"2": ColwiseParallel(), "4": RowwiseParallel()})
    if path == "fsdp2":
        fully_shard(model, mesh=mesh)
    elif path == "hsdp":
        fully_shard(model, mesh=mesh)  # 2-D mesh: replicate over dp, shard over tp
    elif path == "tp_fsdp2":
        fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    data_rank = mesh.get_local_rank("dp") if path != "fsdp2" else rank
    for x, y in batches(data_rank if path != "hsdp" else rank, steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    stats = []
    for dim in mesh.mesh_dim_names:
        g = mesh.get_group(dim)
        delaycomm.flush(g)
        stats.append(group_stats(g))
    return {"losses": losses, "stats": stats}


def _train(path: str, rank: int, world: int, steps: int) -> dict:
    if path == "metric":
        return train_metric(rank, world, steps)
    if path in ("tp", "fsdp2", "hsdp", "tp_fsdp2"):
        return train_mesh(path, rank, world, steps)
    return train_ddp(path, rank, world, steps)


def main() -> None:
    run_paths(__doc__, 60, _train)


if __name__ == "__main__":
    main()
