"""A user's DeepSpeed ZeRO training script on CPU, run unmodified under torchrun by scripts/ecosystem-check.sh
(outside CI: DeepSpeed is not a dependency of delaycomm).

    DS_ACCELERATOR=cpu python -m torch.distributed.run --standalone --nproc_per_node 2 \
        tests/stale/scripts/deepspeed_job.py --stage 2 --out DIR

delaycomm is configured only through DELAYCOMM_* variables. Writes DIR/zero<stage>.rank<r>.json: the losses and
delaycomm's stats of every group.
"""

from __future__ import annotations

import argparse
import json
import os

import deepspeed
import torch
import torch.distributed as dist

import delaycomm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", type=int, required=True, choices=[0, 1, 2, 3])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--reduce-bucket-size", type=int, help="ZeRO's reduce_bucket_size (default: DeepSpeed's, 5e8 elements)"
    )
    args = parser.parse_args()

    deepspeed.init_distributed(dist_backend="delaycomm")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    config = {
        "train_micro_batch_size_per_gpu": 32,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": args.stage},
        "zero_allow_untested_optimizer": True,
    }
    if args.reduce_bucket_size is not None:
        config["zero_optimization"]["reduce_bucket_size"] = args.reduce_bucket_size
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05), config=config
    )
    gen = torch.Generator().manual_seed(1 + rank)
    torch.manual_seed(1234)
    teacher = torch.randn(16, 4)
    losses = []
    for _ in range(args.steps):
        x = torch.randn(32, 16, generator=gen)
        loss = torch.nn.functional.mse_loss(engine(x), torch.tanh(x @ teacher))
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    delaycomm.flush()
    stats = delaycomm.stats()["groups"]  # DeepSpeed reduces gradients on a data-parallel group of its own
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"zero{args.stage}.rank{rank}.json"), "w") as f:
        json.dump({"losses": losses, "stats": stats}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
