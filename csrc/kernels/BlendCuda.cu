// CUDA kernels of fusedBlend (contract in Blend.hpp, launcher in BlendCudaLaunch.hpp).
//
// NOTE: no ATen or torch headers here (they cost minutes of nvcc per file); the dispatcher in Blend.cpp passes raw
// pointers and the current stream.
//
// The vector kernel moves 16 bytes per load and store (ld/st.global.v4) from every stream (grad, each stale
// tensor, stash), in a grid-stride loop sized to one wave of resident blocks, each thread loading kUnroll
// vectors of every input before it computes, so that enough bytes are in flight to reach the copy bandwidth.
// A scalar kernel serves pointers that are not 16-byte aligned (e.g. views at odd storage offsets); the vector
// kernel finishes the < 16-byte tail itself.

#include "kernels/BlendCudaLaunch.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace delaycomm::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 2;
constexpr int kVecBytes = 16;

template <typename T>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};

__device__ __forceinline__ float toAcc(float x) {
  return x;
}
__device__ __forceinline__ double toAcc(double x) {
  return x;
}
__device__ __forceinline__ float toAcc(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float toAcc(__half x) {
  return __half2float(x);
}

template <typename T>
__device__ __forceinline__ T fromAcc(typename Acc<T>::type x);
template <>
__device__ __forceinline__ float fromAcc<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ double fromAcc<double>(double x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 fromAcc<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half fromAcc<__half>(float x) {
  return __float2half_rn(x);
}

template <typename T>
struct Params {
  using A = typename Acc<T>::type;
  T* grad;
  T* stash;
  const T* stale[kMaxStalePerLaunch];
  A staleScales[kMaxStalePerLaunch];
  A freshScale;
  bool withFresh;  // freshScale != 0: grad's old values enter the sum
  int numStale;
  int64_t numel;
};

// One element, any stale count: the scalar path and the vector kernel's tail.
template <typename T>
__device__ __forceinline__ void blendOne(const Params<T>& p, int64_t j) {
  using A = typename Acc<T>::type;
  const T g = p.grad[j];
  if (p.stash != nullptr) {
    p.stash[j] = g;
  }
  A acc = p.withFresh ? p.freshScale * toAcc(g) : A(0);
  for (int i = 0; i < p.numStale; ++i) {
    acc += p.staleScales[i] * toAcc(p.stale[i][j]);
  }
  p.grad[j] = fromAcc<T>(acc);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) blendScalarKernel(Params<T> p) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < p.numel; j += stride) {
    blendOne(p, j);
  }
}

// NS (= p.numStale) is a template argument so that the loads of every stale vector are unrolled into registers.
template <typename T, int NS>
__global__ void __launch_bounds__(kThreads) blendVectorKernel(Params<T> p) {
  using A = typename Acc<T>::type;
  constexpr int kElems = kVecBytes / sizeof(T);
  const int64_t numVec = p.numel / kElems;
  const bool readGrad = p.withFresh || p.stash != nullptr;
  const uint4* grad = reinterpret_cast<const uint4*>(p.grad);
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads * kUnroll;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x; base < numVec;
       base += step) {
    uint4 g[kUnroll] = {};
    uint4 s[kUnroll][NS > 0 ? NS : 1];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = base + static_cast<int64_t>(u) * kThreads;
      if (v < numVec) {
        if (readGrad) {
          g[u] = grad[v];
        }
#pragma unroll
        for (int i = 0; i < NS; ++i) {
          s[u][i] = __ldg(reinterpret_cast<const uint4*>(p.stale[i]) + v);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = base + static_cast<int64_t>(u) * kThreads;
      if (v >= numVec) {
        continue;
      }
      if (p.stash != nullptr) {
        // Streaming store: the stash is read again steps later, not soon.
        __stcs(reinterpret_cast<uint4*>(p.stash) + v, g[u]);
      }
      A acc[kElems];
      if (p.withFresh) {
        T x[kElems];
        memcpy(x, &g[u], kVecBytes);
#pragma unroll
        for (int k = 0; k < kElems; ++k) {
          acc[k] = p.freshScale * toAcc(x[k]);
        }
      } else {
#pragma unroll
        for (int k = 0; k < kElems; ++k) {
          acc[k] = A(0);
        }
      }
#pragma unroll
      for (int i = 0; i < NS; ++i) {
        T x[kElems];
        memcpy(x, &s[u][i], kVecBytes);
#pragma unroll
        for (int k = 0; k < kElems; ++k) {
          acc[k] += p.staleScales[i] * toAcc(x[k]);
        }
      }
      T out[kElems];
#pragma unroll
      for (int k = 0; k < kElems; ++k) {
        out[k] = fromAcc<T>(acc[k]);
      }
      uint4 o;
      memcpy(&o, out, kVecBytes);
      reinterpret_cast<uint4*>(p.grad)[v] = o;
    }
  }
  // The tail of fewer than kElems elements.
  const int64_t tail = p.numel - numVec * kElems;
  if (blockIdx.x == 0 && threadIdx.x < tail) {
    blendOne(p, numVec * kElems + threadIdx.x);
  }
}

// Resident blocks per multiprocessor for `kernel`, computed once per kernel.
// NOTE: cached per kernel, not per device: a process mixing GPU architectures gets the first device's figure,
// which only changes the grid size (the grid-stride loop stays correct).
template <typename Kernel>
int blocksPerSm(Kernel kernel, std::atomic<int>& cache) {
  int n = cache.load(std::memory_order_relaxed);
  if (n == 0) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, 0) != cudaSuccess || n < 1) {
      (void)cudaGetLastError();  // the query failed: clear it, fall back to one block per SM
      n = 1;
    }
    cache.store(n, std::memory_order_relaxed);
  }
  return n;
}

int64_t gridFor(int64_t items, int64_t itemsPerBlock, int residentBlocks) {
  const int64_t needed = (items + itemsPerBlock - 1) / itemsPerBlock;
  return std::max<int64_t>(1, std::min<int64_t>(needed, residentBlocks));
}

template <typename T, int NS>
cudaError_t launchVector(const Params<T>& p, int sms, cudaStream_t stream) {
  static std::atomic<int> cache{0};
  constexpr int kElems = kVecBytes / sizeof(T);
  const int64_t numVec = p.numel / kElems;
  const int64_t grid = gridFor(std::max<int64_t>(numVec, 1), int64_t{kThreads} * kUnroll,
                               blocksPerSm(blendVectorKernel<T, NS>, cache) * sms);
  blendVectorKernel<T, NS><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launchTyped(const BlendLaunchArgs& args, cudaStream_t stream) {
  using A = typename Acc<T>::type;
  Params<T> p{};
  p.grad = static_cast<T*>(args.grad);
  p.stash = static_cast<T*>(args.stash);
  for (int i = 0; i < args.numStale; ++i) {
    p.stale[i] = static_cast<const T*>(args.stale[i]);
    p.staleScales[i] = static_cast<A>(args.staleScales[i]);
  }
  p.freshScale = static_cast<A>(args.freshScale);
  p.withFresh = args.freshScale != 0.0;
  p.numStale = args.numStale;
  p.numel = args.numel;

  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % kVecBytes == 0; };
  bool vectorizable = aligned(p.grad) && (p.stash == nullptr || aligned(p.stash));
  for (int i = 0; i < p.numStale; ++i) {
    vectorizable = vectorizable && aligned(p.stale[i]);
  }
  if (!vectorizable) {
    static std::atomic<int> cache{0};
    const int64_t grid =
        gridFor(p.numel, kThreads, blocksPerSm(blendScalarKernel<T>, cache) * args.multiProcessorCount);
    blendScalarKernel<T><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(p);
    return cudaGetLastError();
  }
  const int sms = args.multiProcessorCount;
  switch (p.numStale) {
    case 0:
      return launchVector<T, 0>(p, sms, stream);
    case 1:
      return launchVector<T, 1>(p, sms, stream);
    case 2:
      return launchVector<T, 2>(p, sms, stream);
    case 3:
      return launchVector<T, 3>(p, sms, stream);
    case 4:
      return launchVector<T, 4>(p, sms, stream);
    case 5:
      return launchVector<T, 5>(p, sms, stream);
    case 6:
      return launchVector<T, 6>(p, sms, stream);
    case 7:
      return launchVector<T, 7>(p, sms, stream);
    case 8:
      return launchVector<T, 8>(p, sms, stream);
    default:
      return cudaErrorInvalidValue;
  }
  static_assert(kMaxStalePerLaunch == 8, "launchTyped's switch covers 0..kMaxStalePerLaunch");
}

}  // namespace

cudaError_t launchBlend(const BlendLaunchArgs& args, cudaStream_t stream) {
  if (args.numStale < 0 || args.numStale > kMaxStalePerLaunch || args.multiProcessorCount < 1) {
    return cudaErrorInvalidValue;
  }
  if (args.numel == 0) {
    return cudaSuccess;
  }
  switch (args.dtype) {
    case BlendDType::kFloat32:
      return launchTyped<float>(args, stream);
    case BlendDType::kFloat64:
      return launchTyped<double>(args, stream);
    case BlendDType::kBFloat16:
      return launchTyped<__nv_bfloat16>(args, stream);
    case BlendDType::kFloat16:
      return launchTyped<__half>(args, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace delaycomm::kernels::cuda
