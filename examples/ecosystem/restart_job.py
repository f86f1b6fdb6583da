"""A DDP job that torchrun restarts after a failure (docs/ecosystem.md, "torchrun restarts"): it checkpoints every
--every steps, and on its first attempt rank 1 fails on purpose at step --fail-at; torchrun restarts both ranks,
which resume from the last checkpoint and finish.

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        --max-restarts 1 examples/ecosystem/restart_job.py --ckpt /tmp/ckpt

Without TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 the restart fails, on Gloo as on delaycomm (stale rendezvous keys in
the store torchrun shares with the workers, pytorch/pytorch#135712). The data of step s are a function of s and
the rank, so a resumed run trains on what an uninterrupted one does (--fail-at 0: no failure).
"""

from __future__ import annotations

import os

import common
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import delaycomm  # noqa: F401  registers backend="delaycomm" with torch.distributed


def add_flags(parser) -> None:
    parser.add_argument("--ckpt", required=True, help="a folder for the checkpoint (empty at the first attempt)")
    parser.add_argument("--every", type=int, default=10, help="checkpoint every N steps (default 10)")
    parser.add_argument("--fail-at", type=int, default=15, help="first attempt: rank 1 fails at this step; 0: never")


def main() -> None:
    args = common.parse_args(__doc__, add=add_flags)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group(backend=args.backend)
    rank = dist.get_rank()
    net = common.model()
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    path = os.path.join(args.ckpt, "checkpoint.pt")
    start = 0
    if os.path.exists(path):
        state = torch.load(path)
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    data = common.dataset(args.steps * args.batch * 2)
    for step in range(start, args.steps):
        if attempt == 0 and rank == 1 and step == args.fail_at:
            raise RuntimeError(f"rank 1 fails on purpose at step {step} (attempt {attempt})")
        i = (2 * step + rank) * args.batch
        x, y = data[i : i + args.batch]
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % args.every == 0 and rank == 0:
            os.makedirs(args.ckpt, exist_ok=True)
            torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "step": step + 1}, path + ".tmp")
            os.replace(path + ".tmp", path)  # whole or absent, whenever the failure comes
    common.finish(args, "torchrun restarts", net.parameters(), {}, restarts=attempt, resumed_from=start)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
