"""A profiled job for `without_injected.sh`: 200 synchronous 1 KiB all-reduces per rank under torch.profiler
(record_shapes=True, so that gloo events carry their size), after a barrier; the trace to argv[1] with {rank}."""

import sys

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import delaycomm  # noqa: F401  (registers the backend)

dist.init_process_group("delaycomm")
t = torch.ones(256)
dist.barrier()
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    for _ in range(200):
        dist.all_reduce(t)
prof.export_chrome_trace(sys.argv[1].format(rank=dist.get_rank()))
dist.destroy_process_group()
