"""The NCCL path at world size 1 (one GPU: NCCL refuses two ranks on one device). Skipped without CUDA."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SCRIPT = r"""
import json, os, torch, torch.distributed as dist
import delaycomm
dist.init_process_group("delaycomm", init_method="file://" + os.environ["RDZV"], rank=0, world_size=1)
torch.cuda.set_device(0)
out = {"nccl_settings": delaycomm.nccl_settings(), "env": {k: os.environ.get(k) for k in ("NCCL_ALGO", "NCCL_BUFFSIZE")}}
be = dist.group.WORLD._get_backend(torch.device("cuda"))
out["cuda_backend"] = type(be).__name__
results = {}
for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64):
    t = torch.arange(1000, device="cuda").to(dtype)
    ref = t.clone()
    dist.all_reduce(t)
    results[f"all_reduce_{dtype}"] = bool(torch.equal(t, ref))
x = torch.full((1 << 20,), 3.0, device="cuda")
work = dist.all_reduce(x, async_op=True)
fut_value = work.get_future().wait()
work.wait()
results["async_future"] = bool(torch.equal(fut_value[0], x))
b = torch.arange(10.0, device="cuda"); dist.broadcast(b, 0); results["broadcast"] = b.tolist() == list(map(float, range(10)))
ag = torch.zeros(10, device="cuda"); dist.all_gather_into_tensor(ag, torch.arange(10.0, device="cuda"))
results["all_gather_into_tensor"] = ag.tolist() == list(map(float, range(10)))
rs = torch.zeros(10, device="cuda"); dist.reduce_scatter_tensor(rs, torch.arange(10.0, device="cuda"))
results["reduce_scatter_tensor"] = rs.tolist() == list(map(float, range(10)))
a2a = torch.zeros(8, device="cuda"); dist.all_to_all_single(a2a, torch.arange(8.0, device="cuda"))
results["all_to_all_single"] = a2a.tolist() == list(map(float, range(8)))
dist.barrier(device_ids=[0])
# DDP on the GPU over delaycomm == plain single-process training (world size 1)
torch.manual_seed(0)
model = torch.nn.Linear(8, 2).cuda()
ref = torch.nn.Linear(8, 2).cuda(); ref.load_state_dict(model.state_dict())
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
o1, o2 = torch.optim.SGD(ddp.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
for _ in range(5):
    xx = torch.randn(4, 8, device="cuda")
    for m, o in ((ddp, o1), (ref, o2)):
        o.zero_grad(); m(xx).pow(2).mean().backward(); o.step()
results["ddp_matches_local"] = all(torch.allclose(p, q) for p, q in zip(model.parameters(), ref.parameters()))
# a CPU tensor in the same group still goes to Gloo
c = torch.ones(3); dist.all_reduce(c); results["cpu_through_gloo"] = c.tolist() == [1.0, 1.0, 1.0]
torch.cuda.synchronize()
st = delaycomm.stats(dist.group.WORLD)
out["stats_allreduce"] = st["ops"]["allreduce"]
out["results"] = results
print("JSON" + json.dumps(out))
dist.destroy_process_group()
"""


def test_nccl_path_world_size_1(tmp_path):
    env = {**os.environ, "RDZV": str(tmp_path / "rdzv")}
    env.pop("NCCL_ALGO", None)
    env.pop("NCCL_BUFFSIZE", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("JSON"))
    import json

    out = json.loads(line[4:])
    assert out["cuda_backend"] == "DelayBackend"
    assert out["env"] == {"NCCL_ALGO": "allreduce:tree", "NCCL_BUFFSIZE": "2097152"}
    assert out["nccl_settings"]["NCCL_ALGO"]["source"].startswith("delaycomm")
    failed = [k for k, ok in out["results"].items() if not ok]
    assert not failed, failed
    # GPU latency comes from CUDA events, harvested lazily
    assert out["stats_allreduce"]["latency"]["count"] >= 1
    assert out["stats_allreduce"]["latency"]["p50_us"] > 0


def test_user_nccl_algo_wins(tmp_path):
    env = {**os.environ, "RDZV": str(tmp_path / "rdzv"), "NCCL_ALGO": "ring"}
    code = ("import os, torch, torch.distributed as dist, delaycomm\n"
            "dist.init_process_group('delaycomm', init_method='file://' + os.environ['RDZV'], rank=0, world_size=1)\n"
            "t = torch.ones(4, device='cuda'); dist.all_reduce(t)\n"
            "print(os.environ['NCCL_ALGO'], delaycomm.nccl_settings()['NCCL_ALGO']['source'])\n"
            "dist.destroy_process_group()\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-3:] == ["ring", "user", "environment"]
