// DelayBackend's forwards to its inner backends beyond the collectives (DelayBackend.hpp says which goes where):
// what c10d's ProcessGroupWrapper forwards to the backend it wraps, and what torch.distributed calls on a backend.

#include <c10/util/Exception.h>

#include "backend/DelayBackend.hpp"

namespace delaycomm {

void DelayBackend::setTimeout(std::chrono::milliseconds timeout) {
  TORCH_CHECK_VALUE(timeout.count() > 0, "delaycomm: setTimeout: timeout must be > 0 ms, got ", timeout.count(), " ms");
  injector_->setTimeout(timeout);
  if (stale_) {
    stale_->setTimeout(timeout);  // the SSP gate, the step_ms=auto agreement, flush's exchange
  }
  if (cpuInner_) {
    cpuInner_->setTimeout(timeout);
  }
  if (cudaInner_) {
    cudaInner_->setTimeout(timeout);
  }
}

void DelayBackend::enableCollectivesTiming() {
  if (cpuInner_) {
    cpuInner_->enableCollectivesTiming();
  }
  if (cudaInner_) {
    cudaInner_->enableCollectivesTiming();
  }
}

void DelayBackend::waitForPendingWorks() {
  if (!cudaInner_) {
    return c10d::Backend::waitForPendingWorks();  // c10d's error, naming delaycomm
  }
  cudaInner_->waitForPendingWorks();
}

c10d::ErrorType DelayBackend::getError() {
  if (!cudaInner_) {
    return c10d::Backend::getError();
  }
  return cudaInner_->getError();
}

std::shared_ptr<c10::Allocator> DelayBackend::getMemAllocator() {
  if (!cudaInner_) {
    return c10d::Backend::getMemAllocator();
  }
  return cudaInner_->getMemAllocator();
}

at::Tensor DelayBackend::allocateTensor(long size, at::TensorOptions options) {
  if (!cudaInner_ || options.device().type() != c10::DeviceType::CUDA) {
    return c10d::Backend::allocateTensor(size, options);
  }
  return cudaInner_->allocateTensor(size, options);
}

bool DelayBackend::supportsTensorAlloc(c10::DeviceIndex deviceIdx) {
  return cudaInner_ && cudaInner_->supportsTensorAlloc(deviceIdx);
}

void DelayBackend::eagerConnectSingleDevice(at::Device device) {
  if (cudaInner_ && device.is_cuda()) {
    cudaInner_->eagerConnectSingleDevice(device);
  }
}

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 12)
void DelayBackend::suspend() {
  if (!cudaInner_) {
    return c10d::Backend::suspend();
  }
  cudaInner_->suspend();
}

void DelayBackend::resume() {
  if (!cudaInner_) {
    return c10d::Backend::resume();
  }
  cudaInner_->resume();
}

std::unordered_map<std::string, uint64_t> DelayBackend::getMemoryStats() {
  if (!cudaInner_) {
    return c10d::Backend::getMemoryStats();
  }
  return cudaInner_->getMemoryStats();
}
#endif

}  // namespace delaycomm
