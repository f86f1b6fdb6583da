#include "delay/GpuDelay.hpp"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/core/DeviceGuard.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include "delay/SleepKernel.hpp"

namespace delaycomm {

void issueWithGpuDelay(c10::Device device, int64_t ns, bool joinCurrentStream, const std::function<void()>& issue) {
  c10::cuda::CUDAGuard deviceGuard(device);
  const auto current = c10::cuda::getCurrentCUDAStream(device.index());
  const auto side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  at::cuda::CUDAEvent ready;
  ready.record(current);
  ready.block(side);
  const std::string err = launchSleepKernel(ns, side.stream());
  TORCH_CHECK(err.empty(), "delaycomm: launching the GPU delay kernel (", ns, " ns) on ", device, " failed: ", err);
  {
    c10::cuda::CUDAStreamGuard streamGuard(side);
    issue();
  }
  if (joinCurrentStream) {
    at::cuda::CUDAEvent done;
    done.record(side);
    done.block(current);
  }
}

void gpuSleepOnCurrentStream(c10::Device device, int64_t ns) {
  c10::cuda::CUDAGuard deviceGuard(device);
  const auto current = c10::cuda::getCurrentCUDAStream(device.index());
  const std::string err = launchSleepKernel(ns, current.stream());
  TORCH_CHECK(err.empty(), "delaycomm: launching the GPU delay kernel (", ns, " ns) on ", device, " failed: ", err);
}

}  // namespace delaycomm
