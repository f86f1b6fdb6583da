"""A user's DDP training script, nothing delaycomm-specific in it but the backend's name: run under torchrun.

    python -m torch.distributed.run --standalone --nproc_per_node 1 tests/gpu/ddp_train.py --device cuda

delaycomm is configured from outside, by DELAYCOMM_* variables (delay, staleness, stats file), as a user would.
Rank 0 prints ``JSON{...}`` at the end: the loss of every step, a checksum of the parameters, the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="delaycomm", help="torch.distributed backend (default delaycomm)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local)
    dev = torch.device(args.device, local) if args.device == "cuda" else torch.device("cpu")
    dist.init_process_group(backend=args.backend)
    rank = dist.get_rank()
    torch.manual_seed(0)
    teacher = torch.randn(32, 4, device=dev)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(dev)
    ddp = DDP(model, device_ids=[local] if args.device == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator(device=dev).manual_seed(1 + rank)
    losses = []
    start = time.perf_counter()
    for _ in range(args.steps):
        x = torch.randn(64, 32, generator=gen, device=dev)
        y = (x @ teacher).argmax(dim=1)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    if args.device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    if rank == 0:
        print(
            "JSON"
            + json.dumps(
                {
                    "losses": [float(v) for v in losses],
                    "param_sum": float(sum(p.double().sum() for p in model.parameters())),
                    "elapsed_s": elapsed,
                    "steps": args.steps,
                    "world_size": dist.get_world_size(),
                    "backend": args.backend,
                    "device": args.device,
                }
            ),
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
