"""The FSDP2 demo: the classifier of train_ddp.py, sharded with fully_shard over backend="delaycomm" (torchrun).

    python -m torch.distributed.run --standalone --nproc_per_node 2 examples/train_fsdp2.py [--steps N]

Each Linear layer is its own FSDP2 parameter group (fully_shard), and the root holds the rest; every gradient is
reduce-scattered. Every DELAYCOMM_* variable applies (e.g. DELAYCOMM_DELAY=exp:p99=20ms
DELAYCOMM_DELAY_FRACTION=0.3 DELAYCOMM_STALENESS=ssp:2). Rank 0 prints the loss and, at the end, delaycomm's
telemetry report. --loss-log FILE writes rank 0's loss at every step (one number a line).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import delaycomm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    parser.add_argument("--batch", type=int, default=64, help="per-rank batch size (default 64)")
    parser.add_argument("--loss-log", metavar="FILE", help="write rank 0's loss at every step to FILE")
    args = parser.parse_args()
    if args.steps <= 0 or args.batch <= 0:
        parser.error("--steps and --batch must be positive")

    dist.init_process_group(backend="delaycomm")
    rank, world = dist.get_rank(), dist.get_world_size()

    # The problem and model of train_ddp.py (same seeds): 4 classes separated by a fixed random linear map.
    torch.manual_seed(0)
    teacher = torch.randn(32, 4)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1 + rank)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.steps)

    losses = []
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, 32, generator=gen)
        y = (x @ teacher).argmax(dim=1)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        if rank == 0 and (step == 1 or step % 50 == 0 or step == args.steps):
            print(f"step {step:4d}  loss {losses[-1]:.4f}", flush=True)
    elapsed = time.perf_counter() - start
    # Under staleness=ssp:S/asp some contributions may still be in flight: put them into the parameters' sharded
    # .grad and apply them as one more step (under bsp nothing is pending: flush is a no-op).
    opt.zero_grad()
    leftover = delaycomm.flush(into_grad=True)
    opt.step()

    if rank == 0:
        print(
            f"# {args.steps} steps on {world} ranks in {elapsed:.2f} s ({args.steps / elapsed:.1f} steps/s)"
            + (f"; flush delivered the pending contributions of {len(leftover)} stream(s)" if leftover else "")
        )
        print(delaycomm.report(dist.group.WORLD), flush=True)
        if args.loss_log:
            with open(args.loss_log, "w") as f:
                f.write("".join(f"{v:.6f}\n" for v in losses))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
