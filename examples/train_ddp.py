"""The demo: a small classifier trained with DDP over backend="delaycomm" (run under torchrun).

    python -m torch.distributed.run --standalone --nproc_per_node 2 examples/train_ddp.py [--steps N]

Every DELAYCOMM_* variable applies (e.g. DELAYCOMM_DELAY=exp:p99=20ms DELAYCOMM_DELAY_FRACTION=0.3). Rank 0 prints
the loss and, at the end, delaycomm's telemetry report.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import delaycomm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    parser.add_argument("--batch", type=int, default=64, help="per-rank batch size (default 64)")
    args = parser.parse_args()
    if args.steps <= 0 or args.batch <= 0:
        parser.error("--steps and --batch must be positive")

    dist.init_process_group(backend="delaycomm")
    rank, world = dist.get_rank(), dist.get_world_size()

    # A synthetic but learnable problem: 4 classes separated by a fixed random linear map.
    torch.manual_seed(0)
    teacher = torch.randn(32, 4)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1 + rank)

    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, 32, generator=gen)
        y = (x @ teacher).argmax(dim=1)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and (step == 1 or step % 50 == 0 or step == args.steps):
            print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)
    elapsed = time.perf_counter() - start
    # Under staleness=ssp:S/asp some contributions may still be in flight: put them into .grad and apply them as
    # one more step (under bsp nothing is pending: flush is a no-op).
    opt.zero_grad()
    leftover = delaycomm.flush(into_grad=True)
    opt.step()

    if rank == 0:
        print(
            f"# {args.steps} steps on {world} ranks in {elapsed:.2f} s ({args.steps / elapsed:.1f} steps/s)"
            + (f"; flush delivered the pending contributions of {len(leftover)} bucket(s)" if leftover else "")
        )
        print(delaycomm.report(dist.group.WORLD), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
