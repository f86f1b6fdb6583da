#pragma once

// The fused pack/blend kernel of the staleness engine (docs/staleness.md): one pass over a DDP bucket that, before its
// one SUM all-reduce, pre-scales this rank's fresh gradient, adds this rank's due stale contributions, and stashes the
// unscaled fresh gradient when this rank's own contribution is deferred. Elementwise, over `n = grad.numel()`:
//
//   stash = grad                                   (only when `stash` is given; a bit-exact copy, before the blend)
//   grad  = freshScale * grad + sum_i staleScales[i] * stale[i]
//
// Contract
// - Dtypes: float32, float64, bfloat16, float16; every tensor has grad's dtype. Accumulation is in float32 for
//   bfloat16/float16/float32 and in float64 for float64; the result is rounded to grad's dtype once (but see
//   kMaxStalePerCudaPass). Scales are given as double and used in the accumulation type.
// - freshScale == 0 excludes the fresh gradient: grad's old values are not read into the sum, so a NaN or Inf in
//   a deferred fresh gradient does not reach this step's reduction (it is still copied to `stash` as it is).
// - Any number of stale tensors, including none (then grad = freshScale * grad). On CPU any count is one pass
//   over memory. On CUDA one launch takes up to kMaxStalePerCudaPass stale tensors (pointers passed by value);
//   more are folded in by further in-place launches of up to kMaxStalePerCudaPass each. Correct for any count,
//   but for bfloat16/float16 each further launch rounds the running sum to grad's dtype once more.
// - Layout: every tensor dense, contiguous, on grad's device (same index), with grad's number of elements (shapes
//   may differ: the kernel works on the flat buffers). numel 0 is a no-op after the checks.
// - Aliasing: grad is read and written in place. stash and every stale[i] must not overlap grad, and stash must
//   not overlap any stale[i] (stale tensors may overlap each other: they are only read). Checked; overlap raises.
// - Autograd: the kernel writes through raw pointers, outside autograd, so grad and stash must not require grad.
// - Threads: stateless and reentrant; concurrent calls on disjoint tensors are safe. The CPU path runs on ATen's
//   intra-op thread pool (at::parallel_for) above kCpuParallelGrain elements and inline below it.
// - Streams (CUDA): launched on the current stream of grad's device, with no host synchronisation. The caller
//   orders the inputs on that stream (e.g. record_stream for tensors made on another stream). Every launch is
//   checked at once (cudaGetLastError); a launch failure raises c10::Error naming fusedBlend.
// - Errors: every bad argument raises c10::ValueError (Python ValueError) or c10::TypeError (wrong dtype) with
//   "delaycomm: fusedBlend: <argument> <expected>, got <actual>".

#include <cstdint>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

namespace delaycomm::kernels {

// Elements per CPU task: below this the CPU path runs on the calling thread (the pool's hand-off costs more than
// it saves on a bucket that fits in L2).
inline constexpr int64_t kCpuParallelGrain = int64_t{1} << 16;

// Stale tensors folded into one CUDA launch (their pointers and scales travel in the kernel's by-value arguments).
inline constexpr int kMaxStalePerCudaPass = 8;

// Computes the blend above in place on `grad`, after checking every argument. Dispatches on grad's device.
void fusedBlend(at::Tensor& grad, double freshScale, c10::ArrayRef<at::Tensor> stale, c10::ArrayRef<double> staleScales,
                const std::optional<at::Tensor>& stash);

namespace detail {

// The device implementations; inputs are already checked by fusedBlend.
void fusedBlendCpu(at::Tensor& grad, double freshScale, c10::ArrayRef<at::Tensor> stale,
                   c10::ArrayRef<double> staleScales, const at::Tensor* stash);

// The CPU loops' instruction set: "avx2" (AVX2+FMA+F16C, chosen at load time where the CPU has them) or "baseline".
// setBlendCpuIsa("baseline" | "avx2" | "auto") lets tests and benchmarks exercise both; not for production use.
std::string blendCpuIsa();
void setBlendCpuIsa(const std::string& isa);

#ifdef DELAYCOMM_WITH_CUDA
void fusedBlendCuda(at::Tensor& grad, double freshScale, c10::ArrayRef<at::Tensor> stale,
                    c10::ArrayRef<double> staleScales, const at::Tensor* stash);
#endif

}  // namespace detail

}  // namespace delaycomm::kernels
