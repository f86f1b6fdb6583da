"""A user's DDP training script, run unmodified under torchrun by tests/stale/test_acceptance.py.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/stale/scripts/ddp_job.py \
        [--metric-first] [--hook] [--record DIR]

delaycomm is configured only through DELAYCOMM_* variables; every other option keeps its default.

--metric-first  all_reduce a metric (the number of samples) before training, as many scripts do.
--hook          register delaycomm.ddp_hook (each bucket an AVG stream of this DDP module).
--record DIR    also keep a running-statistics buffer that is all_reduced (SUM) every step, and save this rank's
                contributions and the outputs of every bucket reduction and of that buffer, and what flush()
                delivered, to DIR/rank<r>.pt: the test checks that nothing was lost or counted twice.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import delaycomm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--metric-first", action="store_true")
    parser.add_argument("--hook", action="store_true")
    parser.add_argument("--record", metavar="DIR")
    args = parser.parse_args()

    dist.init_process_group(backend="delaycomm")
    rank = dist.get_rank()
    torch.manual_seed(0)
    teacher = torch.randn(32, 4)
    gen = torch.Generator().manual_seed(1 + rank)

    if args.metric_first:
        samples = torch.tensor([float(args.steps * 64)])
        dist.all_reduce(samples)

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    ddp = DDP(model)
    buckets: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    if args.hook:
        if args.record:

            def recording_hook(state, bucket):
                contribution = bucket.buffer().detach().clone()
                index = bucket.index()
                fut = delaycomm.ddp_hook(state, bucket)

                def keep(f):
                    out = f.value()
                    buckets.append((index, contribution, out.detach().clone()))
                    return out

                return fut.then(keep)

            ddp.register_comm_hook(None, recording_hook)
        else:
            ddp.register_comm_hook(None, delaycomm.ddp_hook)

    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    running = torch.zeros(8)  # running statistics, all-reduced (SUM) every step when recording
    sums_in, sums_out = [], []
    for _ in range(args.steps):
        x = torch.randn(64, 32, generator=gen)
        y = (x @ teacher).argmax(dim=1)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.record:
            running.copy_(torch.randn(8, generator=gen))
            sums_in.append(running.clone())
            dist.all_reduce(running)
            sums_out.append(running.clone())
    flushed = delaycomm.flush()
    if args.record:
        os.makedirs(args.record, exist_ok=True)
        torch.save(
            {
                "buckets": buckets,
                "sum_in": sums_in,
                "sum_out": sums_out,
                "flushed": dict(flushed),
                "world": dist.get_world_size(),
            },
            os.path.join(args.record, f"rank{rank}.pt"),
        )
    if rank == 0:
        print(delaycomm.report(dist.group.WORLD), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
