"""A user's compiled DDP training job, run unmodified by tests/stale/test_compile.py to count the graph breaks Dynamo
makes in it (docs/staleness.md, "torch.compile").

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/stale/scripts/compile_job.py \
        --backend delaycomm --variants compiled,cautograd --out DIR [--steps N]

--backend is the backend the script passes to ``init_process_group`` (delaycomm, or gloo for the reference run);
delaycomm is configured only through DELAYCOMM_* variables. Each variant trains a small float64 model with DDP on
the default group for --steps steps, then, under delaycomm, ends as the docs say (``zero_grad``,
``delaycomm.flush(into_grad=True)``, one more step), and writes DIR/<variant>.rank<r>.pt: Dynamo's graph breaks
during the variant (``torch._dynamo.utils.counters["graph_break"]``: reason -> count) and, under delaycomm, the
group's stats.

Variants: compiled (``torch.compile`` of the DDP module: DDPOptimizer splits the graph at the buckets), cautograd
(compiled autograd: ``backward()`` inside a compiled step, DDP's Python reducer; run last, it sets Dynamo's config
for the rest of the process).
"""

from __future__ import annotations

import argparse
import collections
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

DIM_IN, HIDDEN, DIM_OUT, BATCH, LR = 16, 32, 4, 32, 0.05


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(DIM_IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(HIDDEN, DIM_OUT)).double()


def train(variant: str, rank: int, steps: int, backend: str) -> dict:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    if variant == "cautograd":
        torch._dynamo.config.optimize_ddp = "python_reducer"
        torch._dynamo.config.compiled_autograd = True
    ddp = DDP(make_model())
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    # aot_eager: Dynamo and AOTAutograd as under inductor, without compiling C++ kernels (docs/ci.md).
    if variant == "compiled":
        net = torch.compile(ddp, backend="aot_eager")

        def step_fn(x, y):
            loss = F.mse_loss(net(x), y)
            loss.backward()
            return loss
    else:

        @torch.compile(backend="aot_eager")
        def step_fn(x, y):
            loss = F.mse_loss(ddp(x), y)
            loss.backward()
            return loss

    gen = torch.Generator().manual_seed(1 + rank)
    teacher = torch.randn(DIM_IN, DIM_OUT, generator=torch.Generator().manual_seed(1234), dtype=torch.float64)
    losses = []
    for _ in range(steps):
        x = torch.randn(BATCH, DIM_IN, generator=gen, dtype=torch.float64)
        opt.zero_grad(set_to_none=True)
        losses.append(float(step_fn(x, torch.tanh(x @ teacher)).detach()))
        opt.step()
    out = {"losses": losses, "graph_breaks": dict(collections.Counter(counters["graph_break"]))}
    if backend == "delaycomm":
        import delaycomm

        opt.zero_grad(set_to_none=True)
        delaycomm.flush(into_grad=True)
        opt.step()
        out["stats"] = delaycomm.stats(dist.group.WORLD)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="delaycomm")
    parser.add_argument("--variants", default="compiled")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    dist.init_process_group(backend=args.backend)
    rank = dist.get_rank()
    os.makedirs(args.out, exist_ok=True)
    for variant in args.variants.split(","):
        result = train(variant, rank, args.steps, args.backend)
        torch.save(result, os.path.join(args.out, f"{variant}.rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
