"""The NCCL path at world size 1 (one GPU: NCCL refuses two ranks on one device), and the NCCL settings as NCCL
itself reports them. Skipped without CUDA.

NOTE: at world size 1 NCCL never reads NCCL_ALGO: its tuning model returns before parsing it when the communicator
has one rank (``ncclTopoTuneModel`` in NCCL's ``src/graph/tuning.cc``, every release from 2.24 to 2.30), so no
"NCCL_ALGO set by environment" line can appear on a one-GPU machine. What NCCL does report there is
NCCL_BUFFSIZE (read for every communicator); for NCCL_ALGO these tests check the environment NCCL was started
with and record NCCL's line when a NCCL version prints one (a machine with 2+ GPUs shows it).
"""

from __future__ import annotations

import pytest

from tests.gpu._device import child_env, json_line, needs_cuda, run_python, save_evidence
from tests.gpu.nccl_log import nccl_lines

pytestmark = [pytest.mark.gpu, needs_cuda]

SCRIPT = r"""
import json, os, tempfile, torch, torch.distributed as dist
import delaycomm
torch.cuda.set_device(0)
dist.init_process_group("delaycomm", init_method="file://" + tempfile.mkdtemp() + "/s", rank=0, world_size=1)
out = {"env_before_nccl": {k: os.environ.get(k) for k in ("NCCL_ALGO", "NCCL_BUFFSIZE")}}
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
results["ddp_matches_local"] = all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters()))
# a CPU tensor in the same group still goes to Gloo
c = torch.ones(3); dist.all_reduce(c); results["cpu_through_gloo"] = c.tolist() == [1.0, 1.0, 1.0]
torch.cuda.synchronize()
out["env_after"] = {k: os.environ.get(k) for k in ("NCCL_ALGO", "NCCL_BUFFSIZE")}
out["nccl_settings"] = delaycomm.nccl_settings()
out["stats_allreduce"] = delaycomm.stats(dist.group.WORLD)["ops"]["allreduce"]
out["results"] = results
print("JSON" + json.dumps(out), flush=True)
dist.destroy_process_group()
"""


def _run_script(**env):
    proc = run_python(["-c", SCRIPT], child_env(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,ENV", **env), timeout=300)
    return json_line(proc.stdout), nccl_lines(proc.stdout + "\n" + proc.stderr)


def test_nccl_path_and_delaycomm_defaults_as_nccl_reports_them():
    out, nccl = _run_script()
    save_evidence("nccl_default_settings", {"script": out, "nccl": nccl})
    assert out["cuda_backend"] == "DelayBackend"
    failed = [k for k, ok in out["results"].items() if not ok]
    assert not failed, failed
    # delaycomm set both before NCCL started, and says so
    assert out["env_after"] == {"NCCL_ALGO": "allreduce:tree", "NCCL_BUFFSIZE": "2097152"}
    assert out["nccl_settings"]["NCCL_ALGO"]["source"].startswith("delaycomm")
    # NCCL's own word: it read NCCL_BUFFSIZE from the environment, with delaycomm's value
    assert nccl["set_by_environment"].get("NCCL_BUFFSIZE") == ["2097152"], nccl
    # NCCL_ALGO: printed only by a communicator of 2+ ranks (see the module's docstring); when printed, ours
    assert nccl["set_by_environment"].get("NCCL_ALGO", ["allreduce:tree"]) == ["allreduce:tree"], nccl
    # GPU latency comes from CUDA events, harvested lazily
    st = out["stats_allreduce"]
    assert st["calls"] == 6 and st["latency"]["count"] + st["untimed"] == st["calls"], st
    assert st["latency"]["p50_us"] > 0


def test_a_users_own_nccl_settings_win_as_nccl_reports_them():
    out, nccl = _run_script(NCCL_ALGO="ring", NCCL_BUFFSIZE="4194304")
    save_evidence("nccl_user_settings", {"script": out, "nccl": nccl})
    assert out["env_after"] == {"NCCL_ALGO": "ring", "NCCL_BUFFSIZE": "4194304"}
    assert out["nccl_settings"]["NCCL_ALGO"] == {"value": "ring", "source": "user environment"}
    assert out["nccl_settings"]["NCCL_BUFFSIZE"] == {"value": "4194304", "source": "user environment"}
    assert nccl["set_by_environment"].get("NCCL_BUFFSIZE") == ["4194304"], nccl
    assert nccl["set_by_environment"].get("NCCL_ALGO", ["ring"]) == ["ring"], nccl
