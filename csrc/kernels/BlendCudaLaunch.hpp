#pragma once

// The launcher of the CUDA blend kernel (BlendCuda.cu). Deliberately free of ATen and torch headers, so that the
// .cu compiles in seconds: the dispatcher (Blend.cpp) checks the tensors and passes raw pointers, the element
// count, a dtype tag and the stream it got from ATen.

#include <cstdint>

#include <cuda_runtime_api.h>

namespace delaycomm::kernels::cuda {

enum class BlendDType : int { kFloat32 = 0, kFloat64 = 1, kBFloat16 = 2, kFloat16 = 3 };

// Stale tensors per launch; Blend.hpp's kMaxStalePerCudaPass mirrors it (checked by a static_assert there).
inline constexpr int kMaxStalePerLaunch = 8;

struct BlendLaunchArgs {
  void* grad = nullptr;                        // read and written in place
  void* stash = nullptr;                       // nullptr: no stash
  const void* stale[kMaxStalePerLaunch] = {};  // the first numStale are used
  double staleScales[kMaxStalePerLaunch] = {};
  int numStale = 0;         // 0..kMaxStalePerLaunch
  double freshScale = 1.0;  // 0: grad's old values are left out of the sum
  int64_t numel = 0;
  BlendDType dtype = BlendDType::kFloat32;
  int multiProcessorCount = 1;  // sizes the grid-stride grid
};

// Enqueues one blend pass on `stream` and returns the launch status (cudaGetLastError right after the launch;
// cudaSuccess when numel is 0 and nothing is launched). Never synchronises.
cudaError_t launchBlend(const BlendLaunchArgs& args, cudaStream_t stream);

}  // namespace delaycomm::kernels::cuda
