"""DeepSpeed over delaycomm (docs/ecosystem.md, "DeepSpeed"): DeepSpeed takes the backend's name as it is.

    DS_ACCELERATOR=cpu python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        examples/ecosystem/deepspeed_job.py --stage 3
"""

from __future__ import annotations

import common
import deepspeed
import torch
import torch.distributed as dist

import delaycomm  # noqa: F401  registers backend="delaycomm" with torch.distributed


def main() -> None:
    args = common.parse_args(
        __doc__, add=lambda p: p.add_argument("--stage", type=int, default=2, choices=[0, 1, 2, 3], help="ZeRO stage")
    )
    stage = args.stage
    deepspeed.init_distributed(dist_backend=args.backend)
    net = common.model()
    config = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
    }
    engine, _, _, _ = deepspeed.initialize(
        model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), config=config
    )
    data = common.dataset(args.steps * args.batch * 2)
    rank = dist.get_rank()
    for step in range(args.steps):
        i = (2 * step + rank) * args.batch  # each rank its own batch, as a DistributedSampler would give
        x, y = data[i : i + args.batch]
        loss = torch.nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
    # ZeRO-3 keeps each rank's shard only: gather the whole parameters to compare them.
    with deepspeed.zero.GatheredParameters(list(net.parameters()), enabled=stage == 3):
        params = [p.detach().clone() for p in net.parameters()]
    common.finish(args, f"DeepSpeed ZeRO-{stage}", params, {"deepspeed": deepspeed.__version__}, stage=stage)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
