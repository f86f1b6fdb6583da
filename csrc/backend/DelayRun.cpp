// DelayBackend's one helper behind every op (run(), DelayBackend.hpp): the fast path, and the general path that
// hands the op to the delay injector (delay/DelayInjector.hpp), times CUDA ops and keeps coalescing windows.
// The op methods (DelayBackend.cpp) check their arguments and call run().

#include <algorithm>

#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include "backend/DelayBackend.hpp"

namespace delaycomm {

int64_t DelayBackend::delayNsFor(OpKind op, uint64_t seq, int64_t bytes) const {
  return injector_->delayNsFor(op, seq, bytes);
}

c10::intrusive_ptr<c10d::Work> DelayBackend::issueOn(c10d::Backend& inner, OpKind op, c10::Device device,
                                                     IssueRef issue, bool countErrors) {
  auto& s = stats_->op(op);
  try {
    return issue(inner);
  } catch (const c10::Error& e) {
    if (countErrors) {
      s.errors.fetch_add(1, std::memory_order_relaxed);
    }
    const std::string msg = e.what_without_backtrace();
    if (msg.find("does not support") != std::string::npos) {
      TORCH_CHECK(false, "Backend delaycomm does not support ", opName(op), " on ", device.type(),
                  " tensors: its inner backend ", inner.getBackendName(), " says: ", msg);
    }
    throw;
  } catch (...) {
    if (countErrors) {
      s.errors.fetch_add(1, std::memory_order_relaxed);
    }
    throw;
  }
}

uint64_t DelayBackend::admit(OpKind op, int64_t bytes, uint64_t* drawSeq) {
  const uint64_t seq = seq_.fetch_add(1, std::memory_order_relaxed) + 1;
  const bool p2p = op == OpKind::kSend || op == OpKind::kRecv || op == OpKind::kRecvAnysource;
  const uint64_t collective = p2p ? 0 : collectiveSeq_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (drawSeq) {
    *drawSeq = p2p ? seq : collective;
  }
  auto& s = stats_->op(op);
  s.calls.fetch_add(1, std::memory_order_relaxed);
  s.bytes.fetch_add(static_cast<uint64_t>(bytes), std::memory_order_relaxed);
  s.countSize(bytes);  // the class's mean size (docs/profile.md, size_bytes)
  return seq;
}

c10::intrusive_ptr<c10d::Work> DelayBackend::runDirect(OpKind op, c10::Device device, int64_t bytes,
                                                       const std::vector<at::Tensor>& outputs, IssueRef issue) {
  c10d::Backend& inner = innerFor(op, device);
  const uint64_t seq = admit(op, bytes);
  const auto calledAt = Clock::now();
  auto innerWork = issueOn(inner, op, device, issue, true);
  if (!innerWork) {
    return innerWork;
  }
  return wrapIssuedCpu(std::move(innerWork), op, seq, calledAt, outputs, CallTiming{sizeClassOf(bytes), calledAt});
}

c10::intrusive_ptr<c10d::Work> DelayBackend::wrapIssuedCpu(c10::intrusive_ptr<c10d::Work> innerWork, OpKind op,
                                                           uint64_t seq, Clock::time_point calledAt,
                                                           const std::vector<at::Tensor>& outputs,
                                                           const CallTiming& call) {
  c10::intrusive_ptr<c10::ivalue::Future> innerFuture;
  try {
    innerFuture = innerWork->getFuture();
  } catch (const std::exception&) {
    // Gloo's send/recv works have no future: DeferredWorkCpu times them in wait().
  }
  if (innerFuture) {
    auto work = c10::make_intrusive<DirectWorkCpu>(std::move(innerWork), std::move(innerFuture), op, seq, stats_,
                                                   calledAt, call);
    work->watch();
    return work;
  }
  auto work = c10::make_intrusive<DeferredWorkCpu>(op, seq, stats_, calledAt, outputs, injector_->timeout(), 0, call);
  work->attach(std::move(innerWork));
  return work;
}

c10::intrusive_ptr<c10d::Work> DelayBackend::runGeneral(OpKind op, c10::Device device, int64_t bytes,
                                                        const std::vector<at::Tensor>& outputs, IssueFn issue,
                                                        bool asyncOp, bool applyDelay) {
  c10d::Backend& inner = innerFor(op, device);
  uint64_t drawSeq = 0;
  const uint64_t seq = admit(op, bytes, &drawSeq);

  std::optional<c10::Event> cudaStart;
  if (device.is_cuda() && options_.timeCuda) {
    cudaStart.emplace(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
  }
  // After the waits on the calling thread: join the coalescing window, start the GPU timing.
  auto afterWaits = [&] {
    if (coalescing_ && inner.supportsCoalescing() &&
        std::find(coalescingInners_.begin(), coalescingInners_.end(), &inner) == coalescingInners_.end()) {
      inner.startCoalescing();
      coalescingInners_.push_back(&inner);
    }
    if (cudaStart) {
      c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
      cudaStart->record(impl.getStream(device));
    }
  };
  DelayInjector::Issued issued;
  if (injector_->engaged()) {
    const std::function<void()> hook = afterWaits;
    c10d::Backend* innerPtr = &inner;
    issued = injector_->run(DelayInjector::Op{op, seq, device, asyncOp, applyDelay, &outputs, &hook, bytes, drawSeq},
                            [this, innerPtr, op, device, issue = std::move(issue)](bool onCaller) mutable {
                              return issueOn(*innerPtr, op, device, issue, onCaller);
                            });
  } else {
    afterWaits();
    issued.calledAt = Clock::now();
    issued.enteredAt = issued.calledAt;
    issued.work = issueOn(inner, op, device, issue, true);
  }

  c10::intrusive_ptr<c10d::Work> work;
  if (device.is_cuda()) {
    stats_->harvestCudaTimings();
    if (!issued.work) {  // an inner backend inside its own coalescing window may return no work
      return issued.work;
    }
    work = c10::make_intrusive<TimedWorkCuda>(std::move(issued.work), op, seq, stats_, std::move(cudaStart), device,
                                              sizeClassOf(bytes), issued.calledAt);
  } else if (issued.heldBack) {
    work = std::move(issued.work);
  } else {
    if (!issued.work) {
      return issued.work;
    }
    work = wrapIssuedCpu(std::move(issued.work), op, seq, issued.calledAt, outputs,
                         CallTiming{sizeClassOf(bytes), issued.enteredAt, issued.observe});
  }
  if (coalescing_ && !inner.supportsCoalescing()) {
    coalescedWorks_.push_back(work);
  }
  return work;
}

}  // namespace delaycomm
