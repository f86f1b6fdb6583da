"""GPU network delay: the stream-ordered sleep kernel (runs only with a CUDA device and CUDA sources)."""

from __future__ import annotations

import math
import tempfile
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import delaycomm
from delaycomm import _C

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not _C.cuda_compiled, reason="this build has no CUDA sources"),
]


def _init_one_gpu(store: str, options: delaycomm.DelayConfig) -> None:
    """The default group: world size 1 on GPU 0, the store a file."""
    dist.init_process_group(
        "delaycomm",
        init_method=f"file://{store}",
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=60),
        device_id=torch.device("cuda", 0),
        pg_options=options,
    )


@pytest.mark.timeout(60)
def test_sleep_kernel_waits_on_the_stream_not_the_host():
    _C._gpu_sleep(0, 1)  # loads the kernel's module (the first launch of a kernel is slow)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    t0 = time.monotonic()
    _C._gpu_sleep(0, 50_000_000)
    host_s = time.monotonic() - t0
    b.record()
    b.synchronize()
    assert host_s < 0.025
    assert a.elapsed_time(b) >= 50.0


@pytest.mark.timeout(120)
def test_nccl_all_reduce_is_delayed_on_the_gpu_and_the_host_goes_on():
    with tempfile.TemporaryDirectory() as d:
        _init_one_gpu(f"{d}/s", delaycomm.DelayConfig(delay="const:80ms", delay_fraction=1.0, delay_ops="allreduce"))
        try:
            x = torch.full((1 << 20,), 3.0, device="cuda")
            dist.all_reduce(x)  # warm-up: creates the communicator (delayed too)
            torch.cuda.synchronize()
            y = torch.ones(16, device="cuda")
            independent = y * 2  # loads the kernel now: a lazy module load may wait for the whole device
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.monotonic()
            work = dist.all_reduce(x, async_op=True)
            call_s = time.monotonic() - t0
            independent = y * 2  # compute on the current stream that does not use x
            done_indep = torch.cuda.Event()
            done_indep.record()
            done_indep.synchronize()
            collective_done_early = work.is_completed()
            work.wait()
            end.record()
            end.synchronize()
            assert call_s < 0.04  # the host never waits for the 80 ms
            assert not collective_done_early  # independent compute finished while the collective was held back
            assert start.elapsed_time(end) >= 80.0
            assert torch.all(x == 3.0) and torch.all(independent == 2.0)
            # async_op=False: the caller's stream must see the delayed result without a wait().
            x.fill_(5.0)
            start.record()
            dist.all_reduce(x)
            z = x * 1
            end.record()
            end.synchronize()
            assert start.elapsed_time(end) >= 80.0
            assert torch.all(z == 5.0)
            s = delaycomm.stats(dist.group.WORLD)["ops"]["allreduce"]
            assert s["delayed_calls"] == 3
        finally:
            dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_a_profile_alone_replays_cuda_ops_as_add_with_a_warning_and_an_explicit_match_raises(tmp_path):
    """DELAYCOMM_DELAY=profile:FILE and nothing else on NCCL: delay_mode=auto's match cannot time a cuda op's own
    latency on the host, so every call gets its whole target (counted as uncalibrated, warned once per op); an
    explicit delay_mode=match raises at the op (docs/delay.md, "Match mode")."""
    import json
    import warnings

    target_ns = 40e6
    b = math.floor(math.log(target_ns) / math.log(1.02))
    cls = {"bytes": 4096, "count": 100, "zeros": 0, "min_ns": target_ns, "max_ns": target_ns * 1.019,
           "buckets": [[b, 100]]}  # fmt: skip
    doc = {"format": "delaycomm-profile", "version": 1, "histogram": {"base": 1.02, "unit": "ns"},
           "metadata": {"world_size": 1}, "ops": {"allreduce": [cls]}}  # fmt: skip
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    for mode in (None, "match"):
        kw = {"delay_mode": mode} if mode else {}
        _init_one_gpu(f"{tmp_path}/s-{mode}", delaycomm.DelayConfig(delay=f"profile:{path}", **kw))
        try:
            x = torch.ones(1024, device="cuda")  # 4 KiB: the profile's class
            if mode == "match":
                with pytest.raises(RuntimeError, match=r"delay_mode=match .* for cuda tensors use delay_mode=add"):
                    dist.all_reduce(x)
                continue
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for _ in range(3):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    dist.all_reduce(x)
                    end.record()
                    end.synchronize()
                    assert start.elapsed_time(end) >= 0.9 * target_ns / 1e6  # the whole target, on the stream
            said = [str(w.message) for w in caught if "on cuda tensors cannot have" in str(w.message)]
            assert len(said) == 1, said
            m = delaycomm.stats(dist.group.WORLD)["ops"]["allreduce"]
            assert m["match"]["uncalibrated"] == 3 and m["delayed_calls"] == 3
        finally:
            dist.destroy_process_group()
