#pragma once

#include <cstdint>
#include <string>

namespace delaycomm {

// Launches a one-thread kernel on `stream` (a cudaStream_t) that returns `ns` nanoseconds after it started, by
// the GPU's %globaltimer, sleeping in __nanosleep steps and spinning the last microseconds. Stream-ordered: work
// queued behind it on `stream` starts after it; the host does not wait. Returns "" or the CUDA error's text.
//
// NOTE: kept free of CUDA and torch headers so that the .cu compiles quickly and C++ callers need neither.
std::string launchSleepKernel(int64_t ns, void* stream);

}  // namespace delaycomm
