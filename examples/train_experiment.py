"""A training script that reports to ``python -m delaycomm.experiment run`` (docs/experiment.md, "Your own job").

    python -m delaycomm.experiment run --seeds 5 -- examples/train_experiment.py --steps 200

It is an ordinary torchrun script (``python -m torch.distributed.run --standalone --nproc_per_node 2
examples/train_experiment.py`` runs it alone); two lines make it an experiment's job:

- the seed: ``delaycomm.experiment.seed()`` (``DELAYCOMM_SEED``, 0 outside the experiment) seeds its initial weights
  and its data, so each seed is a different run and every config of one seed starts alike;
- the metrics: ``delaycomm.experiment.report(step=..., loss=...)`` each step (a loss curve) and the final values
  (``report(test_loss=..., test_accuracy=...)``), printed by rank 0 as ``DELAYCOMM_METRIC name=value`` lines.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import delaycomm
from delaycomm import experiment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    parser.add_argument("--batch", type=int, default=32, help="per-rank batch size (default 32)")
    args = parser.parse_args()
    if args.steps <= 0 or args.batch <= 0:
        parser.error("--steps and --batch must be positive")

    dist.init_process_group(backend="delaycomm")
    rank = dist.get_rank()
    seed = experiment.seed()

    # A learnable problem: 4 classes separated by a random linear map drawn from the seed, with label noise.
    torch.manual_seed(seed)
    teacher = torch.randn(32, 4)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(1000 * seed + 1 + rank)  # each rank its own batches, fixed by the seed

    def batch(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, 32, generator=gen)
        logits = x @ teacher + 0.5 * torch.randn(n, 4, generator=gen)
        return x, logits.argmax(dim=1)

    for step in range(1, args.steps + 1):
        x, y = batch(args.batch, data)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        experiment.report(step=step, loss=loss.item())
    delaycomm.flush()  # under ssp/asp, deliver what is still in flight (a no-op under bsp)

    x, y = batch(2000, torch.Generator().manual_seed(10**6 + seed))  # held out, the same for every config
    with torch.no_grad():
        out = model(x)
    experiment.report(
        test_loss=torch.nn.functional.cross_entropy(out, y).item(),
        test_accuracy=(out.argmax(dim=1) == y).float().mean().item(),
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
