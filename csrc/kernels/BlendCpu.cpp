// CPU implementation of fusedBlend (contract in Blend.hpp).
//
// One pass over memory for any number of stale tensors: the bucket is cut into tiles of kTile elements that stay
// in L1; each tile is read from grad and from every stale tensor once, accumulated in a tile-sized float buffer
// (or in place in grad when grad's dtype is the accumulation type), and written once to grad (and to stash).
//
// The tile loops are plain loops that the compiler vectorises. They are compiled twice: for the baseline ISA of
// the wheel (x86-64: SSE2) and, on x86-64, for AVX2+FMA+F16C, chosen once at run time from cpuid. The half-type
// conversions are written out (bfloat16: integer ops; float16: F16C instructions on the AVX2 path) because the
// compiler does not vectorise c10's scalar conversions: docs/kernels.md has the measurements.

#include "kernels/Blend.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DELAYCOMM_BLEND_X86 1
#include <immintrin.h>
#define DELAYCOMM_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

namespace delaycomm::kernels::detail {

namespace {

// Elements per tile: 4 KiB of float accumulators plus a tile of each input, all within L1.
constexpr int64_t kTile = 1024;

template <typename T>
using AccT = std::conditional_t<std::is_same_v<T, double>, double, float>;

// ---- conversions ------------------------------------------------------------------------------------------------

C10_ALWAYS_INLINE float bf16BitsToFloat(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even, NaN to the canonical quiet NaN: the same bits as c10::BFloat16(float).
C10_ALWAYS_INLINE uint16_t floatToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
}

#ifdef DELAYCOMM_BLEND_X86
DELAYCOMM_TARGET_AVX2 void halfToFloatF16c(const c10::Half* __restrict src, float* __restrict dst, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    _mm256_storeu_ps(dst + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j))));
  }
  for (; j < n; ++j) {
    dst[j] = _cvtsh_ss(src[j].x);
  }
}

DELAYCOMM_TARGET_AVX2 void floatToHalfF16c(const float* __restrict src, c10::Half* __restrict dst, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + j),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + j), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; j < n; ++j) {
    dst[j].x = _cvtss_sh(src[j], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
}
#endif

// src (a tile of T) -> dst (float).
template <typename T, bool kAvx2>
C10_ALWAYS_INLINE void toFloat(const T* __restrict src, float* __restrict dst, int64_t n) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    for (int64_t j = 0; j < n; ++j) {
      dst[j] = bf16BitsToFloat(src[j].x);
    }
  } else {
#ifdef DELAYCOMM_BLEND_X86
    if constexpr (kAvx2) {
      halfToFloatF16c(src, dst, n);
      return;
    }
#endif
    for (int64_t j = 0; j < n; ++j) {
      dst[j] = static_cast<float>(src[j]);
    }
  }
}

// src (float) -> dst (a tile of T), rounding to nearest even.
template <typename T, bool kAvx2>
C10_ALWAYS_INLINE void fromFloat(const float* __restrict src, T* __restrict dst, int64_t n) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    for (int64_t j = 0; j < n; ++j) {
      dst[j].x = floatToBf16Bits(src[j]);
    }
  } else {
#ifdef DELAYCOMM_BLEND_X86
    if constexpr (kAvx2) {
      floatToHalfF16c(src, dst, n);
      return;
    }
#endif
    for (int64_t j = 0; j < n; ++j) {
      dst[j] = static_cast<T>(src[j]);
    }
  }
}

// ---- tile loops (A: float or double; S: the element type read, converted inline) ----------------------------------

C10_ALWAYS_INLINE float toAcc(float x) {
  return x;
}
C10_ALWAYS_INLINE double toAcc(double x) {
  return x;
}
C10_ALWAYS_INLINE float toAcc(c10::BFloat16 x) {
  return bf16BitsToFloat(x.x);
}
C10_ALWAYS_INLINE float toAcc(c10::Half x) {
  return static_cast<float>(x);
}

// acc = a * fresh (+ b0 * s0), where fresh == nullptr means acc already holds the fresh values (in place).
// a == 0 leaves the fresh values out of the sum (Blend.hpp).
template <typename A, typename S>
C10_ALWAYS_INLINE void tileFirst(A* __restrict acc, const S* __restrict fresh, A a, const S* __restrict s0, A b0,
                                 int64_t n) {
  if (a != A(0) && fresh == nullptr) {
    if (s0 != nullptr) {
      for (int64_t j = 0; j < n; ++j) {
        acc[j] = a * acc[j] + b0 * toAcc(s0[j]);
      }
    } else {
      for (int64_t j = 0; j < n; ++j) {
        acc[j] = a * acc[j];
      }
    }
  } else if (a != A(0)) {
    if (s0 != nullptr) {
      for (int64_t j = 0; j < n; ++j) {
        acc[j] = a * toAcc(fresh[j]) + b0 * toAcc(s0[j]);
      }
    } else {
      for (int64_t j = 0; j < n; ++j) {
        acc[j] = a * toAcc(fresh[j]);
      }
    }
  } else if (s0 != nullptr) {
    for (int64_t j = 0; j < n; ++j) {
      acc[j] = b0 * toAcc(s0[j]);
    }
  } else {
    std::fill(acc, acc + n, A(0));
  }
}

// acc += b0 * s0 + b1 * s1: two stale tensors per pass over the (L1-resident) accumulator.
template <typename A, typename S>
C10_ALWAYS_INLINE void tileAdd2(A* __restrict acc, const S* __restrict s0, A b0, const S* __restrict s1, A b1,
                                int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    acc[j] += b0 * toAcc(s0[j]) + b1 * toAcc(s1[j]);
  }
}

template <typename A, typename S>
C10_ALWAYS_INLINE void tileAdd1(A* __restrict acc, const S* __restrict s0, A b0, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    acc[j] += b0 * toAcc(s0[j]);
  }
}

template <typename T>
struct RangeArgs {
  T* grad;
  T* stash;
  const std::vector<const T*>* stale;
  const std::vector<AccT<T>>* scales;
  AccT<T> freshScale;
};

// Blends elements [begin, end), tile by tile. float/double: the accumulator is grad's tile itself. bfloat16 (and
// float16 on the baseline path): inputs are converted inline into a float accumulator tile. float16 on the AVX2
// path: the F16C conversions are calls, so each input tile is converted into an L1-resident float buffer first.
template <typename T, bool kAvx2>
C10_ALWAYS_INLINE void blendRange(const RangeArgs<T>& r, int64_t begin, int64_t end) {
  using A = AccT<T>;
  constexpr bool kNative = std::is_same_v<T, A>;
  constexpr bool kBuffered = std::is_same_v<T, c10::Half> && kAvx2;
  using S = std::conditional_t<kBuffered, float, T>;  // the element type the tile loops read
  alignas(64) float accBuf[kNative ? 1 : kTile];
  alignas(64) float s0Buf[kBuffered ? kTile : 1];
  alignas(64) float s1Buf[kBuffered ? kTile : 1];
  const auto& stale = *r.stale;
  const auto& scales = *r.scales;
  const size_t ns = stale.size();
  for (int64_t lo = begin; lo < end; lo += kTile) {
    const int64_t n = std::min(kTile, end - lo);
    T* g = r.grad + lo;
    if (r.stash != nullptr) {
      std::memcpy(r.stash + lo, g, static_cast<size_t>(n) * sizeof(T));
    }
    // Stale tile i, read as S.
    auto staleTile = [&](size_t i, float* buf) -> const S* {
      if constexpr (kBuffered) {
        toFloat<T, kAvx2>(stale[i] + lo, buf, n);
        return buf;
      } else {
        return stale[i] + lo;
      }
    };
    A* acc;
    const S* fresh = nullptr;
    if constexpr (kNative) {
      acc = g;
    } else if constexpr (kBuffered) {
      acc = accBuf;
      if (r.freshScale != A(0)) {
        toFloat<T, kAvx2>(g, acc, n);
      }
    } else {
      acc = accBuf;
      fresh = g;
    }
    tileFirst<A, S>(acc, fresh, r.freshScale, ns > 0 ? staleTile(0, s0Buf) : nullptr, ns > 0 ? scales[0] : A(0), n);
    size_t i = ns > 0 ? 1 : 0;
    for (; i + 1 < ns; i += 2) {
      const S* s0 = staleTile(i, s0Buf);
      const S* s1 = staleTile(i + 1, s1Buf);
      tileAdd2<A, S>(acc, s0, scales[i], s1, scales[i + 1], n);
    }
    if (i < ns) {
      tileAdd1<A, S>(acc, staleTile(i, s0Buf), scales[i], n);
    }
    if constexpr (!kNative) {
      fromFloat<T, kAvx2>(acc, g, n);
    }
  }
}

template <typename T>
void blendRangeBaseline(const RangeArgs<T>& r, int64_t begin, int64_t end) {
  blendRange<T, false>(r, begin, end);
}

#ifdef DELAYCOMM_BLEND_X86
template <typename T>
DELAYCOMM_TARGET_AVX2 void blendRangeAvx2(const RangeArgs<T>& r, int64_t begin, int64_t end) {
  blendRange<T, true>(r, begin, end);
}
#endif

bool cpuHasAvx2() {
#ifdef DELAYCOMM_BLEND_X86
  static const bool has =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return has;
#else
  return false;
#endif
}

// 1: AVX2 path, 0: baseline path. Starts at the best the CPU has; tests and benchmarks may force the baseline.
std::atomic<int>& isaChoice() {
  static std::atomic<int> choice{cpuHasAvx2() ? 1 : 0};
  return choice;
}

}  // namespace

std::string blendCpuIsa() {
  return isaChoice().load(std::memory_order_relaxed) == 1 ? "avx2" : "baseline";
}

void setBlendCpuIsa(const std::string& isa) {
  if (isa == "auto") {
    isaChoice().store(cpuHasAvx2() ? 1 : 0);
  } else if (isa == "baseline") {
    isaChoice().store(0);
  } else if (isa == "avx2") {
    TORCH_CHECK_VALUE(cpuHasAvx2(),
                      "delaycomm: setBlendCpuIsa: isa 'avx2' needs a CPU with AVX2, FMA and F16C, "
                      "got a CPU without them");
    isaChoice().store(1);
  } else {
    TORCH_CHECK_VALUE(false, "delaycomm: setBlendCpuIsa: isa must be 'auto', 'baseline' or 'avx2', got '", isa, "'");
  }
}

void fusedBlendCpu(at::Tensor& grad, double freshScale, c10::ArrayRef<at::Tensor> stale,
                   c10::ArrayRef<double> staleScales, const at::Tensor* stash) {
  const int64_t n = grad.numel();
  const bool avx2 = isaChoice().load(std::memory_order_relaxed) == 1;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, grad.scalar_type(), "fusedBlendCpu", [&] {
    using A = AccT<scalar_t>;
    std::vector<const scalar_t*> stalePtrs;
    std::vector<A> scales;
    stalePtrs.reserve(stale.size());
    scales.reserve(stale.size());
    for (size_t i = 0; i < stale.size(); ++i) {
      stalePtrs.push_back(stale[i].const_data_ptr<scalar_t>());
      scales.push_back(static_cast<A>(staleScales[i]));
    }
    const RangeArgs<scalar_t> r{grad.mutable_data_ptr<scalar_t>(),
                                stash != nullptr ? stash->mutable_data_ptr<scalar_t>() : nullptr, &stalePtrs, &scales,
                                static_cast<A>(freshScale)};
    at::parallel_for(0, n, kCpuParallelGrain, [&](int64_t begin, int64_t end) {
#ifdef DELAYCOMM_BLEND_X86
      if (avx2) {
        blendRangeAvx2<scalar_t>(r, begin, end);
        return;
      }
#endif
      blendRangeBaseline<scalar_t>(r, begin, end);
    });
  });
}

}  // namespace delaycomm::kernels::detail
