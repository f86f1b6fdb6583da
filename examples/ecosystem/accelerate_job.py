"""accelerate over delaycomm (docs/ecosystem.md, "accelerate"): initialise the process group yourself, then create
the Accelerator; it takes the group as it finds it.

    python -m torch.distributed.run --standalone --nproc_per_node 2 examples/ecosystem/accelerate_job.py

--way kwargs is accelerate's own way, InitProcessGroupKwargs(backend="delaycomm"), which it refuses.
"""

from __future__ import annotations

import accelerate
import common
import torch
import torch.distributed as dist
from accelerate import Accelerator

import delaycomm  # noqa: F401  registers backend="delaycomm" with torch.distributed


def main() -> None:
    args = common.parse_args(__doc__, ways=("recipe", "kwargs"))
    if args.way == "kwargs":
        from accelerate.utils import InitProcessGroupKwargs

        accelerator = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(backend=args.backend)])
    else:
        # The recipe: the group first; Accelerator() finds it initialised and uses it as it is.
        dist.init_process_group(backend=args.backend)
        accelerator = Accelerator(cpu=True)

    net = common.model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    data = torch.utils.data.DataLoader(common.dataset(args.steps * args.batch * 2), batch_size=args.batch)
    net, opt, data = accelerator.prepare(net, opt, data)  # wraps net in DDP, shards the batches over the ranks
    for x, y in data:
        loss = torch.nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        accelerator.backward(loss)
        opt.step()
    common.finish(
        args, "accelerate", accelerator.unwrap_model(net).parameters(), {"accelerate": accelerate.__version__}
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
