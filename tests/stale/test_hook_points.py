"""A private torch hook point that delaycomm cannot find (a torch release renamed it) fails loudly, on the safe
side (python/delaycomm/_owners.py, ``patch`` and ``warn_missing``; docs/staleness.md, "Which reductions go stale"):
one warning naming it, and the reductions it would have recognised are kept fresh with their delay, never made
stale unrecognised.

The renames are simulated where delaycomm looks the hook points up (``delaycomm._ddp.HOOK_POINTS``,
``delaycomm._fsdp.HOOK_POINTS``), before the first delaycomm group installs the hooks; DDP, FSDP1 and FSDP2 run
unchanged. With the hook points in place, each of these models goes stale within these steps
(tests/stale/test_owners.py).
"""

from __future__ import annotations

import sys
import warnings
from datetime import timedelta

import pytest

from tests.harness import run_procs

pytestmark = [pytest.mark.multiproc]

DDP_RENAMED = "_post_forward_of_another_torch"
FSDP2_RENAMED = "foreach_reduce_of_another_torch"
FSDP1_MODULE = "torch.distributed.fsdp._runtime_utils_of_another_torch"
STEPS = 12


def _train(model, steps: int) -> None:
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()


def _without_hook_points(rank, world, steps):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    import delaycomm
    from delaycomm import _ddp, _fsdp

    _ddp.HOOK_POINTS[:] = [(DDP_RENAMED if n == "_post_forward" else n, m, w) for n, m, w in _ddp.HOOK_POINTS]
    _fsdp.HOOK_POINTS[:] = [
        (FSDP1_MODULE if n.startswith("_reduce_grad") else mod, FSDP2_RENAMED if n == "foreach_reduce" else n, m, w)
        for mod, n, m, w in _fsdp.HOOK_POINTS
    ]
    cfg = delaycomm.DelayConfig(delay="const:2ms", delay_fraction=0.5, staleness="ssp:2", step_ms=1.0)
    out = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.init_process_group("delaycomm", timeout=timedelta(seconds=60), pg_options=cfg)
        groups = {
            "ddp": dist.group.WORLD,
            "fsdp1": dist.new_group(pg_options=cfg),
            "fsdp2": dist.new_group(pg_options=cfg),
        }

        def net():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))

        _train(DDP(net(), process_group=groups["ddp"]), steps)
        _train(FSDP(net(), process_group=groups["fsdp1"], device_id=torch.device("cpu")), steps)
        _train(fully_shard(net(), mesh=DeviceMesh.from_group(groups["fsdp2"], "cpu")), steps)
        for name, group in groups.items():
            st = delaycomm.stats(group)
            out[name] = {"ops": st["ops"], "stale": st["staleness"]["stale"]}
    dist.destroy_process_group()
    out["warnings"] = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    return out


@pytest.mark.timeout(150)
def test_missing_hook_points_warn_once_and_keep_their_reductions_fresh_with_their_delay():
    for out in run_procs(_without_hook_points, 2, STEPS, timeout=140):
        msgs = out["warnings"]
        for missing, what in [
            (
                f"DistributedDataParallel.{DDP_RENAMED}",
                "DDP's buckets (its reducer's default hook) cannot be recognised",
            ),
            (f"_fsdp_param_group.{FSDP2_RENAMED}", "FSDP2's parameter groups cannot be recognised"),
            (FSDP1_MODULE, "FSDP1's sharded flat parameters cannot be recognised"),
        ]:
            named = [w for w in msgs if missing in w]
            assert len(named) == 1 and what in named[0] and "kept fresh" in named[0], (missing, msgs)
        for name, op in [("ddp", "allreduce"), ("fsdp1", "_reduce_scatter_base"), ("fsdp2", "_reduce_scatter_base")]:
            o = out[name]["ops"][op]
            # Never stale unrecognised; delayed as under bsp (about half of the calls: delay_fraction 0.5).
            assert o["stale_calls"] == 0 and out[name]["stale"] == 0, (name, o)
            assert o["kept_fresh_calls"] >= STEPS, (name, out[name])
            assert 2 <= o["delayed_calls"] <= o["calls"] - 2, (name, o)
        # What the user then sees for those reductions: the one-time "kept fresh" warning and its reason.
        assert any("no model delaycomm recognises" in w for w in msgs), msgs


def test_fsdp_hook_points_wait_for_fsdp_to_be_imported(tmp_path, monkeypatch):
    """A job that never imports FSDP does not pay for importing it (seconds of CPU): _fsdp.install() waits for the
    package, and patches right after it is imported, before the importer sees it (a stand-in package here)."""
    from delaycomm import _fsdp

    pkg = tmp_path / "fsdp_stand_in"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import hooked\n")
    (pkg / "hooked.py").write_text("def reduce(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def install_now():
        import fsdp_stand_in.hooked as hooked  # the package has run: its submodules are there

        seen.append(hooked.reduce(1))
        hooked.reduce = lambda x: x + 1

    finder = _fsdp._AfterImport("fsdp_stand_in", install_now)
    monkeypatch.setattr("sys.meta_path", [finder, *sys.meta_path])
    monkeypatch.delitem(sys.modules, "fsdp_stand_in", raising=False)
    assert seen == []
    import fsdp_stand_in  # the user's import

    assert seen == [1] and fsdp_stand_in.hooked.reduce(1) == 2  # patched before the import returned
    assert finder not in sys.meta_path  # once
    assert type(fsdp_stand_in.__loader__).__name__ == "SourceFileLoader"  # the module's own loader
    for name in ("fsdp_stand_in", "fsdp_stand_in.hooked"):
        sys.modules.pop(name, None)
