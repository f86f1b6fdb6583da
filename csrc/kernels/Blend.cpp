// fusedBlend: argument checks and dispatch to the CPU loops (BlendCpu.cpp) or the CUDA kernels (BlendCuda.cu).

#include "kernels/Blend.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#ifdef DELAYCOMM_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "kernels/BlendCudaLaunch.hpp"
#endif

// Every message reads "delaycomm: fusedBlend: <argument> <expected>, got <actual>".
#define DELAYCOMM_BLEND_CHECK_VALUE(cond, ...) TORCH_CHECK_VALUE(cond, "delaycomm: fusedBlend: ", __VA_ARGS__)
#define DELAYCOMM_BLEND_CHECK_TYPE(cond, ...) TORCH_CHECK_TYPE(cond, "delaycomm: fusedBlend: ", __VA_ARGS__)

namespace delaycomm::kernels {

namespace {

std::string dtypeName(c10::ScalarType t) {
  return std::string(c10::getDtypeNames(t).first);
}

bool supportedDtype(c10::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf;
}

// The checks every tensor argument shares: defined, dense, contiguous.
void checkDense(const std::string& name, const at::Tensor& t) {
  DELAYCOMM_BLEND_CHECK_VALUE(t.defined(), name, " must be a tensor, got an undefined tensor");
  DELAYCOMM_BLEND_CHECK_VALUE(t.layout() == c10::kStrided, name, " must be a strided (dense) tensor, got layout ",
                              t.layout());
  DELAYCOMM_BLEND_CHECK_VALUE(t.is_contiguous(), name, " must be contiguous, got sizes ", t.sizes(), " and strides ",
                              t.strides());
}

// The checks of stale[i] and stash: checkDense, and grad's dtype, device and number of elements.
void checkOperand(const std::string& name, const at::Tensor& t, const at::Tensor& grad) {
  checkDense(name, t);
  DELAYCOMM_BLEND_CHECK_TYPE(t.scalar_type() == grad.scalar_type(), name, " must have grad's dtype ",
                             dtypeName(grad.scalar_type()), ", got ", dtypeName(t.scalar_type()));
  DELAYCOMM_BLEND_CHECK_VALUE(t.device() == grad.device(), name, " must be on grad's device ", grad.device(), ", got ",
                              t.device());
  DELAYCOMM_BLEND_CHECK_VALUE(t.numel() == grad.numel(), name, " must have grad's number of elements ", grad.numel(),
                              ", got ", t.numel(), " (sizes ", t.sizes(), ")");
}

// Whether the byte ranges of two contiguous tensors intersect (exact for contiguous tensors).
bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) {
    return false;
  }
  const auto* a0 = static_cast<const char*>(a.const_data_ptr());
  const auto* b0 = static_cast<const char*>(b.const_data_ptr());
  const auto* a1 = a0 + a.numel() * a.element_size();
  const auto* b1 = b0 + b.numel() * b.element_size();
  return a0 < b1 && b0 < a1;
}

}  // namespace

void fusedBlend(at::Tensor& grad, double freshScale, c10::ArrayRef<at::Tensor> stale, c10::ArrayRef<double> staleScales,
                const std::optional<at::Tensor>& stash) {
  checkDense("grad", grad);
  DELAYCOMM_BLEND_CHECK_TYPE(supportedDtype(grad.scalar_type()),
                             "grad must be float32, float64, bfloat16 or float16, got ", dtypeName(grad.scalar_type()));
  DELAYCOMM_BLEND_CHECK_VALUE(grad.is_cpu() || grad.is_cuda(), "grad must be on a cpu or cuda device, got ",
                              grad.device());
  DELAYCOMM_BLEND_CHECK_VALUE(!grad.requires_grad(),
                              "grad must not require grad (fusedBlend writes it outside autograd), got "
                              "requires_grad=True");
  DELAYCOMM_BLEND_CHECK_VALUE(std::isfinite(freshScale), "fresh_scale must be finite, got ", freshScale);
  DELAYCOMM_BLEND_CHECK_VALUE(stale.size() == staleScales.size(), "stale_scales must have one scale per stale tensor (",
                              stale.size(), "), got ", staleScales.size());
  for (size_t i = 0; i < stale.size(); ++i) {
    const std::string name = "stale[" + std::to_string(i) + "]";
    checkOperand(name, stale[i], grad);
    DELAYCOMM_BLEND_CHECK_VALUE(std::isfinite(staleScales[i]), "stale_scales[", i, "] must be finite, got ",
                                staleScales[i]);
    DELAYCOMM_BLEND_CHECK_VALUE(!overlaps(stale[i], grad), name,
                                " must not overlap grad's memory (grad is written in place), got an overlapping "
                                "tensor");
  }
  const at::Tensor* stashPtr = nullptr;
  if (stash.has_value()) {
    const at::Tensor& s = *stash;
    checkOperand("stash", s, grad);
    DELAYCOMM_BLEND_CHECK_VALUE(!s.requires_grad(),
                                "stash must not require grad (fusedBlend writes it outside autograd), got "
                                "requires_grad=True");
    DELAYCOMM_BLEND_CHECK_VALUE(!overlaps(s, grad), "stash must not overlap grad's memory, got an overlapping tensor");
    for (size_t i = 0; i < stale.size(); ++i) {
      DELAYCOMM_BLEND_CHECK_VALUE(!overlaps(s, stale[i]), "stash must not overlap stale[", i,
                                  "] (stash is written while stale tensors are read), got an overlapping tensor");
    }
    stashPtr = &s;
  }
  if (grad.numel() == 0) {
    return;
  }
  if (grad.is_cpu()) {
    detail::fusedBlendCpu(grad, freshScale, stale, staleScales, stashPtr);
    return;
  }
#ifdef DELAYCOMM_WITH_CUDA
  detail::fusedBlendCuda(grad, freshScale, stale, staleScales, stashPtr);
#else
  DELAYCOMM_BLEND_CHECK_VALUE(false, "grad is on ", grad.device(),
                              " but this build of delaycomm has no CUDA kernels (it was built CPU-only), got a "
                              "CUDA tensor");
#endif
}

#ifdef DELAYCOMM_WITH_CUDA
namespace detail {

static_assert(kMaxStalePerCudaPass == cuda::kMaxStalePerLaunch, "Blend.hpp and BlendCudaLaunch.hpp disagree");

void fusedBlendCuda(at::Tensor& grad, double freshScale, c10::ArrayRef<at::Tensor> stale,
                    c10::ArrayRef<double> staleScales, const at::Tensor* stash) {
  const c10::cuda::CUDAGuard guard(grad.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(grad.get_device()).stream();
  cuda::BlendLaunchArgs args;
  switch (grad.scalar_type()) {
    case at::kFloat:
      args.dtype = cuda::BlendDType::kFloat32;
      break;
    case at::kDouble:
      args.dtype = cuda::BlendDType::kFloat64;
      break;
    case at::kBFloat16:
      args.dtype = cuda::BlendDType::kBFloat16;
      break;
    case at::kHalf:
      args.dtype = cuda::BlendDType::kFloat16;
      break;
    default:
      TORCH_INTERNAL_ASSERT(false, "fusedBlendCuda: dtype passed the checks but has no kernel");
  }
  args.grad = grad.mutable_data_ptr();
  args.numel = grad.numel();
  args.multiProcessorCount = at::cuda::getDeviceProperties(grad.get_device())->multiProcessorCount;
  // Up to kMaxStalePerCudaPass stale tensors per launch: the first launch applies freshScale and writes the stash,
  // each further one adds the next stale tensors to grad in place (freshScale 1).
  size_t next = 0;
  bool first = true;
  while (first || next < stale.size()) {
    const size_t count = std::min(stale.size() - next, static_cast<size_t>(kMaxStalePerCudaPass));
    args.freshScale = first ? freshScale : 1.0;
    args.stash = first && stash != nullptr ? stash->mutable_data_ptr() : nullptr;
    args.numStale = static_cast<int>(count);
    for (size_t i = 0; i < count; ++i) {
      args.stale[i] = stale[next + i].const_data_ptr();
      args.staleScales[i] = staleScales[next + i];
    }
    const cudaError_t err = cuda::launchBlend(args, stream);
    TORCH_CHECK(err == cudaSuccess, "delaycomm: fusedBlend: CUDA launch failed on ", grad.device(), " (", count,
                " stale tensors from stale[", next, "], dtype ", dtypeName(grad.scalar_type()), ", ", grad.numel(),
                " elements): ", cudaGetErrorString(err));
    next += count;
    first = false;
  }
}

}  // namespace detail
#endif

}  // namespace delaycomm::kernels
