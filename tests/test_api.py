"""The rest of the c10d surface through delaycomm: objects, p2p, subgroups, barriers, functional collectives,
debug mode, destroy/re-init, telemetry, and clear errors (real ranks)."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest

from tests.dist_utils import run_ranks

pytestmark = [pytest.mark.multiproc]


def _surface(rank, world, stats_path):
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    import delaycomm

    out = {}
    # destroy and re-init in one process (first: torch's own Gloo cannot re-init after new_group subgroups,
    # see test_reinit_after_subgroups_is_a_torch_limit)
    dist.init_process_group("delaycomm", timeout=timedelta(seconds=30))
    t = torch.ones(2)
    dist.all_reduce(t)
    dist.destroy_process_group()
    # NOTE: the second world rendezvouses through a file: re-creating the TCPStore on the same port races (a fast
    # rank can reach the old store before the slow rank tears it down), in torch with any backend.
    rdzv = stats_path.format(rank="rdzv")
    dist.init_process_group("delaycomm", init_method=f"file://{rdzv}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=30),
                            pg_options=delaycomm.DelayConfig(stats=stats_path))
    t = torch.ones(2)
    dist.all_reduce(t)
    out["after_reinit"] = t.tolist()
    # object collectives
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
    out["all_gather_object"] = objs
    lst = [{"from": rank}] if rank == 1 else [None]
    dist.broadcast_object_list(lst, src=1)
    out["broadcast_object_list"] = lst
    # send / recv around a ring, then batch_isend_irecv the other way
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    buf = torch.zeros(3)
    if rank % 2 == 0:
        dist.send(torch.full((3,), float(rank)), nxt)
        dist.recv(buf, prv)
    else:
        dist.recv(buf, prv)
        dist.send(torch.full((3,), float(rank)), nxt)
    out["recv"] = buf.tolist()
    got = torch.zeros(2)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((2,), 10.0 + rank), prv),
                                   dist.P2POp(dist.irecv, got, nxt)])
    for r in reqs:
        r.wait()
    out["batch_isend_irecv"] = got.tolist()
    # functional collectives dispatch through the same backend
    t = torch.full((4,), float(rank + 1))
    out["funcol_all_reduce"] = funcol.all_reduce(t, "sum", dist.group.WORLD).tolist()
    out["funcol_all_gather"] = funcol.all_gather_single(torch.tensor([float(rank)]), 0, dist.group.WORLD).tolist()
    # subgroups
    evens = dist.new_group([r for r in range(world) if r % 2 == 0])
    odds = dist.new_group([r for r in range(world) if r % 2 == 1])
    mine = evens if rank % 2 == 0 else odds
    s = torch.tensor([float(rank)])
    dist.all_reduce(s, group=mine)
    out["subgroup_sum"] = s.item()
    out["subgroup_backend"] = dist.get_backend(mine)
    # barriers
    dist.barrier()
    # NOTE: torch's dist.monitored_barrier() refuses every backend name but "gloo" before reaching the backend;
    # the backend's own method (what it would call) forwards to the inner Gloo group.
    dist.group.WORLD._get_backend(torch.device("cpu")).monitored_barrier(timedelta(seconds=20), True)
    # clear errors
    errors = {}
    for name, fn in {
        # the public API dispatches meta tensors elsewhere; the backend itself must refuse a mixed list
        "mixed_devices": lambda: dist.group.WORLD._get_backend(torch.device("cpu")).allreduce(
            [torch.zeros(2), torch.zeros(2, device="meta")]),
        "meta_device": lambda: dist.group.WORLD._get_backend(torch.device("cpu")).allreduce(
            [torch.zeros(2, device="meta")]),
        "non_contiguous": lambda: dist.all_reduce(torch.zeros(4, 4).t()),
        "sparse_broadcast": lambda: dist.group.WORLD._get_backend(torch.device("cpu")).broadcast(
            [torch.zeros(3).to_sparse()]),
        "split": lambda: dist.split_group(split_ranks=[[0], [1]]),
    }.items():
        try:
            fn()
            errors[name] = None
        except Exception as e:  # noqa: BLE001
            errors[name] = f"{type(e).__name__}: {e}"
    out["errors"] = errors
    # sparse all-reduce: Gloo supports it on CPU, so delaycomm does
    i = torch.tensor([[rank % 3]])
    sp = torch.sparse_coo_tensor(i, torch.tensor([1.0]), (3,), check_invariants=True)
    dist.all_reduce(sp)
    out["sparse_sum"] = sp.to_dense().tolist()
    # telemetry
    st = delaycomm.stats(dist.group.WORLD)
    out["stats_ops"] = {k: v["calls"] for k, v in st["ops"].items()}
    out["p50"] = st["ops"]["allreduce"]["latency"]["p50_us"]
    out["report"] = delaycomm.report(dist.group.WORLD)
    # NOTE: ProcessGroup only forwards sequence numbers for GLOO/NCCL/UCC types; the backend has its own.
    out["seq"] = dist.group.WORLD._get_backend(torch.device("cpu"))._get_sequence_number_for_group()
    dist.destroy_process_group()
    return out


@pytest.mark.timeout(120)
def test_c10d_surface(tmp_path):
    world = 2
    stats_path = str(tmp_path / "stats-{rank}.json")
    results = run_ranks(_surface, world, stats_path, timeout=110)
    for rank, out in results.items():
        assert out["all_gather_object"] == [{"rank": r, "s": "x" * r} for r in range(world)]
        assert out["broadcast_object_list"] == [{"from": 1}]
        assert out["recv"] == [float((rank - 1) % world)] * 3
        assert out["batch_isend_irecv"] == [10.0 + (rank + 1) % world] * 2
        assert out["funcol_all_reduce"] == [float(sum(range(1, world + 1)))] * 4
        assert out["funcol_all_gather"] == [float(r) for r in range(world)]
        assert out["subgroup_sum"] == float(rank)  # one member per subgroup at world 2
        assert out["subgroup_backend"] == "delaycomm"
        errs = out["errors"]
        assert errs["mixed_devices"] and "must all be on one device type, got cpu and meta" in errs["mixed_devices"]
        assert errs["meta_device"] and "Backend delaycomm does not support allreduce on meta" in errs["meta_device"]
        assert errs["non_contiguous"] and "must be contiguous" in errs["non_contiguous"], errs
        assert errs["sparse_broadcast"] and "is sparse; only all_reduce" in errs["sparse_broadcast"], errs
        assert errs["split"] is not None, errs
        assert out["sparse_sum"] == [float(sum(1 for r in range(world) if r % 3 == j)) for j in range(3)]
        assert out["stats_ops"]["allreduce"] >= 3 and out["stats_ops"]["send"] >= 1, out["stats_ops"]
        assert out["p50"] > 0
        assert "allreduce" in out["report"] and "p99" in out["report"]
        assert out["seq"] > 10
        assert out["after_reinit"] == [float(world)] * 2
        # the stats option wrote this rank's JSON at destroy time
        data = json.loads((tmp_path / f"stats-{rank}.json").read_text())
        assert data["rank"] == rank and data["ops"]["allreduce"]["calls"] >= 3


def _detail(rank, world):
    import torch
    import torch.distributed as dist

    import delaycomm

    dist.init_process_group("delaycomm", timeout=timedelta(seconds=30))
    t = torch.ones(3)
    dist.all_reduce(t)
    out = {"sum": t.tolist(), "calls": delaycomm.stats(dist.group.WORLD)["ops"]["allreduce"]["calls"]}
    # The debug wrapper checks that ranks call matching collectives: a mismatch is reported, not hung.
    try:
        if rank == 0:
            dist.all_reduce(torch.ones(3))
        else:
            dist.all_reduce(torch.ones(5))
        out["mismatch"] = None
    except Exception as e:  # noqa: BLE001
        out["mismatch"] = str(e)
    return out


@pytest.mark.timeout(90)
def test_torch_distributed_debug_detail():
    results = run_ranks(_detail, 2, timeout=80, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    for out in results.values():
        assert out["sum"] == [2.0] * 3
        assert out["calls"] >= 1
        assert out["mismatch"] and "mismatch" in out["mismatch"].lower(), out["mismatch"]


def _dies(rank, world):
    import time

    import torch
    import torch.distributed as dist

    import delaycomm  # noqa: F401

    dist.init_process_group("delaycomm", timeout=timedelta(seconds=5))
    t = torch.ones(1 << 16)
    dist.all_reduce(t)
    if rank == 1:
        os._exit(3)  # dies before the next collective
    start = time.monotonic()
    try:
        for _ in range(3):
            dist.all_reduce(t)
        return {"raised": None, "elapsed": time.monotonic() - start}
    except Exception as e:  # noqa: BLE001
        return {"raised": f"{type(e).__name__}: {e}", "elapsed": time.monotonic() - start}


@pytest.mark.timeout(60)
def test_rank_death_makes_survivors_raise_within_timeout():
    results = run_ranks(_dies, 2, timeout=50, expect_exit={1})
    out = results[0]
    assert out["raised"] is not None, "the survivor's all_reduce did not fail"
    assert out["elapsed"] < 5 + 10, out  # the group timeout (5 s) plus slack for a loaded machine
