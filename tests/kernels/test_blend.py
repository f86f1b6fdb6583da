"""The fused pack/blend kernel (csrc/kernels/Blend.hpp) against a float64 torch reference, on CPU and CUDA.

stash = grad (bit-exact, before the blend); grad = a * grad + sum_i b_i * stale_i, accumulated in float32
(float64 for float64) and rounded to grad's dtype once.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from delaycomm import _C

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
BITS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16, torch.float16: torch.int16}
# Unit roundoff of the accumulation type (float32, or float64 for float64).
ACC_EPS = {torch.float32: 2.0**-24, torch.float64: 2.0**-53, torch.bfloat16: 2.0**-24, torch.float16: 2.0**-24}
MAX_STALE_PER_CUDA_PASS = 8  # kMaxStalePerCudaPass in Blend.hpp
CPU_PARALLEL_GRAIN = 1 << 16  # kCpuParallelGrain in Blend.hpp

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


@pytest.fixture(params=["auto", "baseline"])
def cpu_isa(request):
    """Runs a CPU test on the best loops the CPU has and again on the baseline loops."""
    _C._set_blend_cpu_isa(request.param)
    yield _C._blend_cpu_isa()
    _C._set_blend_cpu_isa("auto")


def randn(n: int, dtype: torch.dtype, device: str, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(n, dtype=torch.float64, generator=gen).to(dtype=dtype, device=device)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(BITS[t.dtype])


def check_blend(out: torch.Tensor, grad0: torch.Tensor, a: float, stale: list[torch.Tensor], scales: list[float]):
    """|out - exact| within one rounding to out's dtype plus the float32 (float64) accumulation error."""
    dtype = out.dtype
    terms = [a * grad0.double()] if a != 0 else []
    terms += [b * s.double() for s, b in zip(stale, scales)]
    exact = sum(terms) if terms else torch.zeros_like(grad0, dtype=torch.float64)
    magnitude = sum(t.abs() for t in terms) if terms else torch.zeros_like(exact)
    # Each further CUDA launch beyond kMaxStalePerCudaPass rounds the running sum to dtype once more (Blend.hpp).
    roundings = 1 + max(0, (len(stale) - 1) // MAX_STALE_PER_CUDA_PASS) if out.is_cuda else 1
    rounding = torch.finfo(dtype).eps / 2 if dtype in (torch.bfloat16, torch.float16) else 0.0
    bound = roundings * rounding * magnitude + (len(terms) + 2) * ACC_EPS[dtype] * magnitude
    tiny = torch.finfo(dtype).tiny  # float16/bfloat16 results below the normal range lose relative precision
    err = (out.double().cpu() - exact.cpu()).abs()
    excess = err - bound.cpu() - (2 * tiny if rounding else 0.0)
    worst = int(excess.argmax()) if excess.numel() else 0
    assert excess.numel() == 0 or excess.max() <= 0, (
        f"element {worst}: got {out.flatten()[worst].item()!r}, exact {exact.flatten()[worst].item()!r}, "
        f"error {err.flatten()[worst].item():.3g} > bound {bound.flatten()[worst].item():.3g}"
    )


def run_case(
    device: str, dtype: torch.dtype, n: int, a: float, num_stale: int, with_stash: bool, seed: int = 0, offset: int = 0
):
    gen = torch.Generator().manual_seed(seed)
    # `offset` elements into a larger buffer: pointers that are not 16-byte aligned (the CUDA scalar path).
    grad = randn(n + offset, dtype, device, gen)[offset:]
    stale = [randn(n + offset, dtype, device, gen)[offset:] for _ in range(num_stale)]
    scales = [float(x) for x in torch.rand(num_stale, generator=gen, dtype=torch.float64) * 2 - 1]
    stash = torch.full((n + offset,), float("nan"), dtype=dtype, device=device)[offset:] if with_stash else None
    grad0 = grad.clone()
    stale0 = [s.clone() for s in stale]
    _C._fused_blend(grad, a, stale, scales, stash)
    if device == "cuda":
        torch.cuda.synchronize()
    check_blend(grad, grad0, a, stale, scales)
    if with_stash:
        assert torch.equal(bits(stash), bits(grad0)), "stash must be a bit-exact copy of grad before the blend"
    for s, s0 in zip(stale, stale0):
        assert torch.equal(bits(s), bits(s0)), "stale tensors are inputs only"


# ---- results -------------------------------------------------------------------------------------------------------

SIZES = [1, 7, 8, 1023, 1024, 1025, 4099, CPU_PARALLEL_GRAIN, CPU_PARALLEL_GRAIN + 1, 3 * CPU_PARALLEL_GRAIN + 5]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_sizes_and_tails(device, dtype, n, cpu_isa):
    run_case(device, dtype, n, a=0.9, num_stale=2, with_stash=True, seed=n)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_stale", [0, 1, 2, 3, 8, 9, 17])
@pytest.mark.parametrize("with_stash", [False, True], ids=["no-stash", "stash"])
def test_stale_counts(device, dtype, num_stale, with_stash, cpu_isa):
    run_case(device, dtype, 5000, a=0.9, num_stale=num_stale, with_stash=with_stash, seed=num_stale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("a", [1.0, 0.0, -0.5, 0.9])
def test_fresh_scales(device, dtype, a, cpu_isa):
    run_case(device, dtype, 3000, a=a, num_stale=1, with_stash=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("offset", [1, 3])
def test_unaligned_views(device, dtype, offset, cpu_isa):
    run_case(device, dtype, 2 * CPU_PARALLEL_GRAIN + 9, a=0.9, num_stale=3, with_stash=True, offset=offset)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_is_a_no_op(device):
    grad = torch.empty(0, device=device)
    _C._fused_blend(grad, 0.5, [torch.empty(0, device=device)], [1.0], torch.empty(0, device=device))
    assert grad.numel() == 0


@pytest.mark.parametrize("device", DEVICES)
def test_shapes_may_differ_with_equal_numel(device):
    grad = torch.ones(4, 4, device=device)
    stale = torch.arange(16.0, device=device)
    stash = torch.empty(2, 8, device=device)
    _C._fused_blend(grad, 2.0, [stale], [0.5], stash)
    assert torch.equal(grad.flatten().cpu(), 2 + 0.5 * torch.arange(16.0))
    assert torch.equal(stash.cpu(), torch.ones(2, 8))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_types_accumulate_in_float32(device, dtype, cpu_isa):
    # 1 + 8 * 2^-10: every partial sum rounds back to 1 in bfloat16/float16 arithmetic (ulp at 1: 2^-7 / 2^-10),
    # but the float32 sum 1 + 2^-7 is exact in both.
    n = 1000
    grad = torch.ones(n, dtype=dtype, device=device)
    stale = [torch.full((n,), 2.0**-10, dtype=dtype, device=device) for _ in range(8)]
    _C._fused_blend(grad, 1.0, stale, [1.0] * 8)
    assert torch.equal(grad.cpu(), torch.full((n,), 1 + 2.0**-7, dtype=dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_rounding_matches_torch(device, dtype, cpu_isa):
    # With no stale tensor, grad = round(float32(a) * float32(grad)): exactly torch's float32 product then cast,
    # so the conversions must round to nearest even as torch does (ties, overflow to inf, NaN stay NaN).
    gen = torch.Generator().manual_seed(7)
    grad = torch.randn(10000, generator=gen).mul_(300).to(dtype)
    grad[:4] = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0])
    expected = (grad.float() * torch.tensor(1.0078125 + 2.0**-12, dtype=torch.float32)).to(dtype)
    grad = grad.to(device)
    _C._fused_blend(grad, 1.0078125 + 2.0**-12, [], [])
    torch.testing.assert_close(grad.cpu(), expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_zero_fresh_scale_leaves_nonfinite_fresh_out(device, dtype):
    grad = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0] * 300, dtype=dtype, device=device)
    grad0 = grad.clone()
    stale = torch.full_like(grad, 2.0)
    stash = torch.empty_like(grad)
    _C._fused_blend(grad, 0.0, [stale], [0.25], stash)
    assert torch.equal(grad.cpu(), torch.full((1200,), 0.5, dtype=dtype))
    assert torch.equal(bits(stash), bits(grad0))


def test_no_stale_and_zero_fresh_scale_zeroes_grad():
    grad = torch.randn(3000)
    _C._fused_blend(grad, 0.0, [], [])
    assert torch.equal(grad, torch.zeros(3000))


@pytest.mark.parametrize("device", DEVICES)
def test_stale_tensors_may_alias_each_other(device):
    grad = torch.ones(5000, device=device)
    s = torch.full((5000,), 3.0, device=device)
    _C._fused_blend(grad, 1.0, [s, s, s], [1.0, 2.0, 0.5])
    assert torch.equal(grad.cpu(), torch.full((5000,), 1 + 3 * 3.5))


def test_isa_knob_rejects_unknown_names():
    with pytest.raises(
        ValueError, match=re.escape("delaycomm: setBlendCpuIsa: isa must be 'auto', 'baseline' or 'avx2', got 'sse9'")
    ):
        _C._set_blend_cpu_isa("sse9")
    assert _C._blend_cpu_isa() in ("avx2", "baseline")


# ---- CUDA streams --------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda, reason="needs a CUDA device and a delaycomm built with CUDA")
def test_cuda_runs_on_the_current_stream():
    n = 1 << 24
    side = torch.cuda.Stream()
    grad = torch.zeros(n, device="cuda")
    stale = torch.empty(n, device="cuda")
    with torch.cuda.stream(side):
        # The fill and the blend are ordered on `side` only: the result is right only if the kernel ran on it.
        side.wait_stream(torch.cuda.current_stream())
        stale.fill_(2.0)
        _C._fused_blend(grad, 1.0, [stale], [0.5])
        done = torch.cuda.Event()
        done.record()
    done.synchronize()
    assert torch.equal(grad, torch.ones(n, device="cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda, reason="needs a CUDA device and a delaycomm built with CUDA")
def test_cuda_grid_stride_covers_large_buckets():
    # More vectors than one wave of resident threads holds: every thread loops.
    run_case("cuda", torch.float32, (1 << 25) + 3, a=0.9, num_stale=1, with_stash=True)


# ---- bad input -----------------------------------------------------------------------------------------------------

PREFIX = "delaycomm: fusedBlend: "


def _bad_cases():
    f = torch.float32
    base = torch.zeros(40)
    yield (
        "non-contiguous grad",
        lambda: (torch.zeros(4, 4).t(), [], [], None),
        ValueError,
        "grad must be contiguous, got sizes [4, 4] and strides [1, 4]",
    )
    yield (
        "non-contiguous stale",
        lambda: (torch.zeros(16), [torch.zeros(32)[::2]], [1.0], None),
        ValueError,
        "stale[0] must be contiguous, got sizes [16] and strides [2]",
    )
    yield (
        "sparse grad",
        lambda: (torch.zeros(16).to_sparse(), [], [], None),
        ValueError,
        "grad must be a strided (dense) tensor, got layout Sparse",
    )
    yield (
        "integer grad",
        lambda: (torch.zeros(16, dtype=torch.int32), [], [], None),
        TypeError,
        "grad must be float32, float64, bfloat16 or float16, got int32",
    )
    yield (
        "stale dtype",
        lambda: (torch.zeros(16), [torch.zeros(16), torch.zeros(16, dtype=torch.bfloat16)], [1.0, 1.0], None),
        TypeError,
        "stale[1] must have grad's dtype float32, got bfloat16",
    )
    yield (
        "stash dtype",
        lambda: (torch.zeros(16, dtype=torch.float16), [], [], torch.zeros(16, dtype=f)),
        TypeError,
        "stash must have grad's dtype float16, got float32",
    )
    yield (
        "stale device",
        lambda: (torch.zeros(16), [torch.zeros(16, device="meta")], [1.0], None),
        ValueError,
        "stale[0] must be on grad's device cpu, got meta",
    )
    yield (
        "grad device",
        lambda: (torch.zeros(16, device="meta"), [], [], None),
        ValueError,
        "grad must be on a cpu or cuda device, got meta",
    )
    yield (
        "stale numel",
        lambda: (torch.zeros(16), [torch.zeros(15)], [1.0], None),
        ValueError,
        "stale[0] must have grad's number of elements 16, got 15 (sizes [15])",
    )
    yield (
        "stash numel",
        lambda: (torch.zeros(16), [], [], torch.zeros(4, 5)),
        ValueError,
        "stash must have grad's number of elements 16, got 20 (sizes [4, 5])",
    )
    yield (
        "scale count",
        lambda: (torch.zeros(16), [torch.zeros(16), torch.zeros(16)], [1.0], None),
        ValueError,
        "stale_scales must have one scale per stale tensor (2), got 1",
    )
    yield (
        "stale is grad",
        lambda: (base[:16], [base[:16]], [1.0], None),
        ValueError,
        "stale[0] must not overlap grad's memory (grad is written in place), got an overlapping tensor",
    )
    yield (
        "stale overlaps grad",
        lambda: (base[:16], [torch.zeros(16), base[15:31]], [1.0, 1.0], None),
        ValueError,
        "stale[1] must not overlap grad's memory (grad is written in place), got an overlapping tensor",
    )
    yield (
        "stash is grad",
        lambda: (base[:16], [], [], base[:16]),
        ValueError,
        "stash must not overlap grad's memory, got an overlapping tensor",
    )
    yield (
        "stash overlaps stale",
        lambda: (base[:16], [base[16:32]], [1.0], base[24:40]),
        ValueError,
        "stash must not overlap stale[0] (stash is written while stale tensors are read), got an overlapping tensor",
    )
    yield (
        "nan fresh scale",
        lambda: (torch.zeros(16), [], [], None, math.nan),
        ValueError,
        "fresh_scale must be finite, got nan",
    )
    yield (
        "inf stale scale",
        lambda: (torch.zeros(16), [torch.zeros(16)], [math.inf], None),
        ValueError,
        "stale_scales[0] must be finite, got inf",
    )
    yield (
        "grad requires grad",
        lambda: (torch.zeros(16, requires_grad=True), [], [], None),
        ValueError,
        "grad must not require grad (fusedBlend writes it outside autograd), got requires_grad=True",
    )
    yield (
        "stash requires grad",
        lambda: (torch.zeros(16), [], [], torch.zeros(16, requires_grad=True)),
        ValueError,
        "stash must not require grad (fusedBlend writes it outside autograd), got requires_grad=True",
    )


BAD = list(_bad_cases())


@pytest.mark.parametrize("make,exc,message", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_input_raises_clear_errors(make, exc, message):
    args = make()
    grad, stale, scales, stash = args[:4]
    fresh = args[4] if len(args) > 4 else 1.0
    before = grad.detach().clone() if grad.layout == torch.strided and grad.device.type == "cpu" else None
    with pytest.raises(exc, match="^" + re.escape(PREFIX + message) + "$"):
        _C._fused_blend(grad, fresh, stale, scales, stash)
    if before is not None and grad.numel():
        assert torch.equal(grad.detach(), before), "a rejected call must not write grad"


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda, reason="needs a CUDA device and a delaycomm built with CUDA")
def test_cuda_mixed_devices_raise():
    with pytest.raises(
        ValueError, match="^" + re.escape(PREFIX + "stale[0] must be on grad's device cuda:0, got cpu") + "$"
    ):
        _C._fused_blend(torch.zeros(16, device="cuda"), 1.0, [torch.zeros(16)], [1.0])
