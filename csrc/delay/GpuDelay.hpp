#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>

#include <c10/core/Device.h>

namespace delaycomm {

// Network delay of one GPU collective (docs/delay.md, "GPU network delay"), host never blocked:
//   1. an event on the caller's current stream, awaited by a side stream (the op's data dependency);
//   2. the sleep kernel on the side stream (delay `ns`);
//   3. `issue` runs with the side stream as the current stream, so the inner NCCL backend, which makes its own
//      stream wait on the current stream, starts the collective after the sleep.
// The caller's current stream does not wait for the sleep: compute on it is held back only through its real
// dependency on the collective's result (work.wait() makes it wait for the NCCL stream, as without delay).
// joinCurrentStream (for ops called with async_op=False): recent ProcessGroupNCCL runs such an op on the current
// stream itself (the side stream here) and its caller never waits on a work, so the caller's current stream is made
// to wait for the side stream after the op: what follows on it sees the delayed result, as without delay.
// Side streams come from torch's pool, one per call in turn, so the delays of consecutive ops overlap as on CPU.
//
// Available when built with CUDA (DELAYCOMM_WITH_CUDA); the caller checks.
// `ns` must be bounded by the caller (boundedGpuDelayNs): nothing can stop a kernel once it sleeps.
void issueWithGpuDelay(c10::Device device, int64_t ns, bool joinCurrentStream, const std::function<void()>& issue);

// How long the sleep kernel may hold a GPU collective back: the injected delay, but never more than the group's
// timeout + kGpuDelayGrace. The host never waits for the kernel, but the stream does, and so does everything queued
// behind it: the caller's current stream (joinCurrentStream), the NCCL stream, a device synchronize at exit. An
// unbounded sleep (a delay of 1e300 ms saturates at 292 years) would hold all of them for ever, past the NCCL
// watchdog's abort. Bounded, a delay longer than the timeout is a timeout: ProcessGroupNCCL times each work from
// its creation (before the sleep), so the collective, which cannot finish before the kernel does, is still
// incomplete when its timeout passes, and the watchdog raises its own timeout error (the one a slow network
// gives); kGpuDelayGrace leaves the watchdog, which polls every ~100 ms, the time to see it before the kernel ends.
inline constexpr std::chrono::milliseconds kGpuDelayGrace{1000};
inline int64_t boundedGpuDelayNs(int64_t ns, std::chrono::milliseconds timeout) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t capMs = timeout.count() > kMax / 1000000 - kGpuDelayGrace.count()
                            ? kMax / 1000000
                            : timeout.count() + kGpuDelayGrace.count();
  return std::min(ns, capMs * 1000000);
}

// Runs the sleep kernel on the current stream of `device` (benchmarks and tests of the kernel's precision).
void gpuSleepOnCurrentStream(c10::Device device, int64_t ns);

}  // namespace delaycomm
