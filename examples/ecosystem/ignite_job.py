"""PyTorch-Ignite over delaycomm (docs/ecosystem.md, "ignite"): initialise the process group yourself, wrap the
model in DistributedDataParallel by hand, and give each rank its shard of the data with a DistributedSampler.

    python -m torch.distributed.run --standalone --nproc_per_node 2 examples/ecosystem/ignite_job.py

Two ways that fail, for comparison:
  --way parallel    ignite's own way, idist.Parallel(backend="delaycomm"): refused.
  --way auto_model  the group initialised first, then idist.auto_model(model) and idist.auto_dataloader:
                    auto_model wraps the model in DDP only for the backends it names (nccl, gloo, mpi) and returns
                    any other's as it is, silently; auto_dataloader shards the data; the run ends normally while
                    each rank trains its own model on its own shard (the ranks' parameters differ).
"""

from __future__ import annotations

import common
import ignite
import ignite.distributed as idist
import torch
import torch.distributed as dist
from ignite.engine import create_supervised_trainer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import delaycomm  # noqa: F401  registers backend="delaycomm" with torch.distributed


def train(args, _local_rank=None) -> None:
    net = common.model()
    data = common.dataset(args.steps * args.batch * 2)
    if args.way == "auto_model":
        model = idist.auto_model(net)  # NOTE: returns net itself, not DDP: the wrong way, on purpose
        loader = idist.auto_dataloader(data, batch_size=args.batch, shuffle=False)
    else:
        # The recipe: DDP by hand (auto_model would leave the model unwrapped on this backend), and the sampler.
        model = DDP(net)
        loader = DataLoader(data, batch_size=args.batch, sampler=DistributedSampler(data, shuffle=False))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = create_supervised_trainer(model, opt, torch.nn.functional.cross_entropy)
    trainer.run(loader, max_epochs=1)
    common.finish(
        args, "ignite", net.parameters(), {"pytorch-ignite": ignite.__version__}, wrapped=isinstance(model, DDP)
    )


def main() -> None:
    args = common.parse_args(__doc__, ways=("recipe", "parallel", "auto_model"))
    if args.way == "parallel":
        with idist.Parallel(backend=args.backend) as parallel:
            parallel.run(train, args)
        return
    dist.init_process_group(backend=args.backend)
    train(args)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
