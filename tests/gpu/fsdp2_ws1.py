"""FSDP2 on one device through delaycomm, run under torchrun by tests/gpu/test_fsdp2.py (world size 1).

    python -m torch.distributed.run --standalone --nproc_per_node 1 tests/gpu/fsdp2_ws1.py --device cuda

1. An FSDP2 (fully_shard) training loop of the DDP test's model: at world size 1 FSDP2 issues no collective (it
   copies instead of reduce-scattering), so this shows that FSDP2 runs on delaycomm's group and trains.
2. The stale reduce-scatter as FSDP2 issues it at world size > 1: reduce_scatter_single inside the owner scope
   delaycomm opens around FSDP2's reduction of one parameter group, a new input every step, on the device: the
   fused blend kernel and the inner backend's reduce-scatter.
   With integer-valued inputs, sum(outputs) + flush() equals sum(inputs) exactly under stale_policy=apply.

delaycomm is configured by DELAYCOMM_* variables. Prints ``JSON{...}``: losses, the stream's conservation error,
this rank's stats.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import delaycomm
from delaycomm._owners import reduction_scope

SCOPE = "FSDP2 params 0-1 (layers.0.weight +1)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local)
    dev = torch.device(args.device, local) if args.device == "cuda" else torch.device("cpu")
    dist.init_process_group(backend="delaycomm")
    world = dist.get_world_size()

    torch.manual_seed(0)
    teacher = torch.randn(32, 4, device=dev)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(dev)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator(device=dev).manual_seed(1)
    losses = []
    for _ in range(args.steps):
        x = torch.randn(64, 32, generator=gen, device=dev)
        loss = torch.nn.functional.cross_entropy(model(x), (x @ teacher).argmax(dim=1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())

    shard = 4099  # not a multiple of any vector width
    total_in = torch.zeros(shard * world, dtype=torch.float64, device=dev)
    total_out = torch.zeros(shard, dtype=torch.float64, device=dev)
    for _ in range(args.steps):
        inp = torch.randint(-8, 9, (shard * world,), generator=gen, device=dev).float()
        total_in += inp.double()
        out = torch.empty(shard, device=dev)
        with reduction_scope(SCOPE):  # as delaycomm scopes FSDP2's reduction of one parameter group
            dist.reduce_scatter_single(out, inp)
        total_out += out.double()
    flushed = delaycomm.flush()
    for v in flushed.values():
        total_out += v.double()
    rank = dist.get_rank()
    err = (total_out - total_in[rank * shard : (rank + 1) * shard]).abs().max().item()
    if args.device == "cuda":
        torch.cuda.synchronize()
    print(
        "JSON"
        + json.dumps(
            {
                "losses": [float(v) for v in losses],
                "conservation_error": err,
                "flushed": len(flushed),
                "stats": delaycomm.stats(dist.group.WORLD),
            }
        ),
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
