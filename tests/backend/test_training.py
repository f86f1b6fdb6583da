"""DDP and FSDP2 on delaycomm train exactly as on Gloo (real processes, real Gloo underneath)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.harness import run_procs

pytestmark = [pytest.mark.multiproc]


def _model(seed: int):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    )


class _WithUnused(__import__("torch").nn.Module):
    def __init__(self):
        import torch

        super().__init__()
        torch.manual_seed(3)
        self.a = torch.nn.Linear(16, 8)
        self.b = torch.nn.Linear(8, 4)
        self.unused = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.b(self.a(x).relu())


def _train_ddp(group, rank, find_unused: bool, no_sync_every: int, steps: int = 20):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _WithUnused() if find_unused else _model(0)
    ddp = DDP(model, process_group=group, find_unused_parameters=find_unused, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    for step in range(steps):
        x = torch.randn(8, 16, generator=g)
        y = torch.randn(8, 4, generator=g)
        if no_sync_every and step % no_sync_every == 0:
            with ddp.no_sync():
                torch.nn.functional.mse_loss(ddp(x), y).backward()
            continue
        opt.zero_grad(set_to_none=False) if not no_sync_every else None
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        if no_sync_every:
            opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _ddp_ranks(rank, world, find_unused, no_sync_every):
    import torch
    import torch.distributed as dist

    import delaycomm

    dist.init_process_group("delaycomm", timeout=timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    ref = _train_ddp(gloo, rank, find_unused, no_sync_every)
    got = _train_ddp(dist.group.WORLD, rank, find_unused, no_sync_every)
    return {
        "equal": all(torch.equal(a, b) for a, b in zip(ref, got)),
        "allreduce_calls": delaycomm.stats(dist.group.WORLD)["ops"]["allreduce"]["calls"],
    }


@pytest.mark.timeout(120)
@pytest.mark.parametrize("no_sync_every", [0, 3], ids=["sync", "no_sync-every-3"])
@pytest.mark.parametrize("find_unused", [False, True], ids=["all-used", "find_unused"])
def test_ddp_matches_gloo_bitwise(find_unused, no_sync_every):
    for rank, out in enumerate(run_procs(_ddp_ranks, 2, find_unused, no_sync_every, timeout=110)):
        assert out["allreduce_calls"] > 0, "DDP's gradient all-reduces did not go through delaycomm"
        assert out["equal"], f"rank {rank}: parameters differ from Gloo's"


def _fsdp_train(mesh, steps: int = 5):
    import torch
    from torch.distributed.fsdp import fully_shard

    model = _model(1)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(mesh.get_rank())
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 16, generator=g)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    full = [p.full_tensor().detach().clone() for p in model.parameters()]
    return losses, full


def _fsdp_ranks(rank, world):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    import delaycomm

    dist.init_process_group("delaycomm", timeout=timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    ref_losses, ref = _fsdp_train(DeviceMesh.from_group(gloo, "cpu"))
    got_losses, got = _fsdp_train(DeviceMesh.from_group(dist.group.WORLD, "cpu"))
    ops = delaycomm.stats(dist.group.WORLD)["ops"]
    return {
        "equal": all(torch.equal(a, b) for a, b in zip(ref, got)),
        "losses": (ref_losses, got_losses),
        "ops": sorted(ops),
    }


@pytest.mark.timeout(180)
def test_fsdp2_matches_gloo():
    for rank, out in enumerate(run_procs(_fsdp_ranks, 2, timeout=170)):
        ref_losses, got_losses = out["losses"]
        assert got_losses == ref_losses, f"rank {rank}: losses differ"
        assert got_losses[-1] < got_losses[0], f"rank {rank}: FSDP2 did not train: {got_losses}"
        assert out["equal"], f"rank {rank}: parameters differ from Gloo's"
        # FSDP2 all-gathers parameters and reduce-scatters gradients through delaycomm.
        assert "_allgather_base" in out["ops"] or "allgather_into_tensor_coalesced" in out["ops"], out["ops"]
        assert any(op.startswith("_reduce_scatter") or op.startswith("reduce_scatter") for op in out["ops"]), out["ops"]
