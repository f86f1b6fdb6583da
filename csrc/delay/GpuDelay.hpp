#pragma once

#include <cstdint>
#include <functional>

#include <c10/core/Device.h>

namespace delaycomm {

// Network delay of one GPU collective (SPEC §4), host never blocked:
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
void issueWithGpuDelay(c10::Device device, int64_t ns, bool joinCurrentStream, const std::function<void()>& issue);

// Runs the sleep kernel on the current stream of `device` (benchmarks and tests of the kernel's precision).
void gpuSleepOnCurrentStream(c10::Device device, int64_t ns);

}  // namespace delaycomm
