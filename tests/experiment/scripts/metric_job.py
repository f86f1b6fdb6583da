"""A user's job for the tests of ``python -m delaycomm.experiment run`` (tests/experiment/test_run_job.py).

An ordinary DDP script on ``backend="delaycomm"``: seeds its weights and data from ``DELAYCOMM_SEED``, prints
``DELAYCOMM_METRIC step=N loss=...`` lines on rank 0 by hand (the raw contract, not the helper), then its final
metrics. For the error rows, it misbehaves on purpose when its delay is one of three sentinel values:
``const:1ms`` raises, ``const:2ms`` hangs, ``const:3ms`` reports nothing.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import delaycomm

delay = os.environ.get("DELAYCOMM_DELAY", "none")
if delay == "const:1ms":
    raise ValueError("the job failed on purpose")
if delay == "const:2ms":
    time.sleep(600)
dist.init_process_group(backend="delaycomm")
rank = dist.get_rank()
seed = int(os.environ["DELAYCOMM_SEED"])

torch.manual_seed(seed)
model = DDP(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(100 * seed + rank)
w = torch.arange(8, dtype=torch.float32)
for step in range(1, 31):
    x = torch.randn(16, 8, generator=gen)
    loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), x @ w)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0 and delay != "const:3ms":
        print(f"DELAYCOMM_METRIC step={step} loss={loss.item()!r}", flush=True)
delaycomm.flush()
if rank == 0 and delay != "const:3ms":
    print("some other output of the job")
    print(f"DELAYCOMM_METRIC final_loss={loss.item()!r} seed_seen={seed}", flush=True)
dist.destroy_process_group()
