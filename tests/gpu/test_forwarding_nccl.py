"""What DelayBackend forwards to its inner NCCL group (csrc/backend/DelayBackend.hpp, docs/core.md "Forwarded to
the inner backends"), at world size 1. Skipped without CUDA; the Gloo side is tests/backend/test_forwarding.py."""

from __future__ import annotations

import pytest

from tests.gpu._device import child_env, json_line, needs_cuda, run_python, save_evidence

pytestmark = [pytest.mark.gpu, needs_cuda]

SCRIPT = r"""
import json, tempfile, torch, torch.distributed as dist
from datetime import timedelta
import delaycomm
from delaycomm._registry import backend_of
torch.cuda.set_device(0)
dist.init_process_group("delaycomm", init_method="file://" + tempfile.mkdtemp() + "/s", rank=0, world_size=1)
world = dist.group.WORLD
be = world._get_backend(torch.device("cuda"))
nccl = backend_of(world).inner("cuda")
x = torch.ones(1024, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
out = {"nccl": type(nccl).__name__}
world.set_timeout(timedelta(seconds=7))
out["nccl_timeout_s"] = nccl.options._timeout.total_seconds()
dev = torch.device("cuda", 0)
out["tensor_alloc"] = [be.supports_tensor_alloc(dev), nccl.supports_tensor_alloc(dev)]
if out["tensor_alloc"][1]:
    t = be.allocate_tensor(1024, dtype=torch.float32, device=dev)
    out["allocated"] = [t.device.type, t.numel()]
world._enable_collectives_timing()
work = dist.all_reduce(x, async_op=True)
work.wait()
torch.cuda.synchronize()
out["duration_ms"] = work._get_duration()
world._wait_for_pending_works()
out["pending_works"] = "ok"
print("JSON" + json.dumps(out), flush=True)
dist.destroy_process_group()
"""


def test_nccl_only_methods_reach_the_inner_nccl_group():
    out = json_line(run_python(["-c", SCRIPT], child_env(), timeout=300).stdout)
    save_evidence("forwarding_nccl", out)
    assert out["nccl"] == "ProcessGroupNCCL", out
    assert out["nccl_timeout_s"] == 7.0, out
    assert out["tensor_alloc"][0] == out["tensor_alloc"][1], out
    if out["tensor_alloc"][1]:
        assert out["allocated"] == ["cuda", 1024], out
    assert out["pending_works"] == "ok", out
    assert out["duration_ms"] >= 0.0, out  # NCCL's own timing of the op, through delaycomm's work
