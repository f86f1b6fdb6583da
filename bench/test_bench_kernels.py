"""pytest-benchmark suite for the fused blend kernel: `pytest bench/ --benchmark-only` (timings) or
`pytest bench/ --benchmark-disable` (a quick smoke run: each benchmark body runs once and its result is checked).

The bandwidth study with copy-bandwidth ratios is bench/kernel_bandwidth.py; these benchmarks track the kernel
and its unfused torch equivalent over time (pytest-benchmark's --benchmark-compare).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from delaycomm import _C

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernel_bandwidth as kb

_has_cuda = torch.cuda.is_available() and bool(_C.cuda_compiled)
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not _has_cuda, reason="needs a CUDA device and a delaycomm built with CUDA"),
        ],
    ),
]
SIZE_BYTES = {"cpu": 4 << 20, "cuda": 256 << 20}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("impl", ["fused", "unfused"])
def test_blend(benchmark, device, dtype, impl):
    case = kb.make_case(SIZE_BYTES[device], kb.DTYPES[dtype], stale=1, stash=True, device=device)
    grad0 = case.grad.clone()
    fn = kb.IMPLS[impl]

    def call():
        fn(case)
        _sync(device)

    benchmark.extra_info["moved_bytes"] = kb.bytes_moved(case.grad.numel(), case.grad.element_size(), 1, True)
    benchmark(call)
    # With --benchmark-disable the body ran once: one blend, checked against a float64 reference. Timed runs
    # blend repeatedly (grad tends to the stale tensor): the values must stay finite.
    assert bool(torch.isfinite(case.grad).all())
    if benchmark.disabled:
        expected = (kb.FRESH_SCALE * grad0.double() + kb.STALE_SCALE * case.stale[0].double()).to(grad0.dtype)
        eps = torch.finfo(grad0.dtype).eps
        torch.testing.assert_close(case.grad, expected, rtol=2 * eps, atol=2 * eps)
        assert torch.equal(case.stash, grad0)
