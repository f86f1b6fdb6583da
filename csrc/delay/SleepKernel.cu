#include "delay/SleepKernel.hpp"

#include <cuda_runtime.h>

namespace delaycomm {

namespace {

__device__ __forceinline__ unsigned long long globalTimerNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void sleepKernel(unsigned long long ns) {
  const unsigned long long start = globalTimerNs();
  while (true) {
    const unsigned long long elapsed = globalTimerNs() - start;
    if (elapsed >= ns)
      break;
    const unsigned long long left = ns - elapsed;
    // __nanosleep takes at most ~1 ms and may sleep up to twice as long as asked: halve the remainder, and spin
    // through the last 2 us.
    if (left > 2000ull) {
      __nanosleep(static_cast<unsigned>(left / 2 < 1000000ull ? left / 2 : 1000000ull));
    }
  }
}

}  // namespace

std::string launchSleepKernel(int64_t ns, void* stream) {
  if (ns <= 0)
    return "";
  sleepKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<unsigned long long>(ns));
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? std::string() : std::string(cudaGetErrorString(err));
}

}  // namespace delaycomm
