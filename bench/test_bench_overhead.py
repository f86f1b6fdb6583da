"""Wrapper overhead: the same collective through delaycomm and through the raw backend it wraps.

One process, world size 1: the inner collective does almost nothing, so the difference is what the wrapper
adds per call (Python dispatch, the DelayBackend, its Work and telemetry). Multi-rank overhead is what
``python -m delaycomm.bench`` measures.
"""

import os

import pytest
import torch
import torch.distributed as dist

import delaycomm

HAS_CUDA = torch.cuda.is_available() and dist.is_nccl_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device / NCCL"))]
RAW = {"cpu": "gloo", "cuda": "nccl"}


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    if dist.is_initialized():
        pytest.skip("a default process group exists already in this process")
    store = tmp_path_factory.mktemp("store") / "store"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    made = {"gloo": dist.new_group(backend="gloo"), "delaycomm": dist.new_group(backend="delaycomm")}
    if HAS_CUDA:
        made["nccl"] = dist.new_group(backend="nccl")
    yield made
    dist.destroy_process_group()


def _backend(name, device):
    return RAW[device] if name == "raw" else "delaycomm"


def _sequence(group, device):
    """The group's collective count on ``device`` (c10d's sequence number: one per collective issued)."""
    return group._get_backend(torch.device(device))._get_sequence_number_for_group()


def _counted(fn):
    """``fn`` and a list whose one element counts its calls."""
    calls = [0]

    def counted():
        calls[0] += 1
        fn()

    return counted, calls


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("nbytes", [8, 65536])
@pytest.mark.parametrize("which", ["raw", "delaycomm"])
def test_all_reduce_call(benchmark, groups, device, nbytes, which):
    group = groups[_backend(which, device)]
    t = torch.ones(nbytes // 4, device=device)

    def call():
        dist.all_reduce(t, group=group)
        if device == "cuda":
            torch.cuda.synchronize()

    benchmark.group = f"all_reduce {device} {nbytes} B, world size 1"
    call, calls = _counted(call)
    before = _sequence(group, device)
    benchmark(call)
    # NOTE: SUM over one rank leaves the data as it was, so the data alone cannot tell that anything ran: the
    # group's sequence number says every call issued its collective.
    assert calls[0] >= 1 and _sequence(group, device) - before == calls[0]
    assert t.eq(1).all()


@pytest.mark.parametrize("which", ["raw", "delaycomm"])
def test_async_all_reduce_then_wait(benchmark, groups, which):
    group = groups[_backend(which, "cpu")]
    t = torch.ones(2)

    def call():
        dist.all_reduce(t, group=group, async_op=True).wait()

    benchmark.group = "all_reduce cpu 8 B async + wait, world size 1"
    call, calls = _counted(call)
    before = _sequence(group, "cpu")
    benchmark(call)
    assert calls[0] >= 1 and _sequence(group, "cpu") - before == calls[0]
    assert t.eq(1).all()


def test_stats_snapshot(benchmark, groups):
    dist.all_reduce(torch.ones(2), group=groups["delaycomm"])
    benchmark.group = "telemetry"
    out = benchmark(delaycomm.stats, groups["delaycomm"])
    assert out["ops"]["allreduce"]["calls"] >= 1
