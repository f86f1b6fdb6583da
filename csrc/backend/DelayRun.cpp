// DelayBackend's routing of one op: slowdown, delay (host, CPU issuer thread, GPU sleep kernel), issue, wrap.
// The op methods (DelayBackend.cpp) check their arguments and call run().

#include <algorithm>

#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include "backend/DelayBackend.hpp"
#ifdef DELAYCOMM_WITH_CUDA
#include "delay/GpuDelay.hpp"
#endif

namespace delaycomm {

namespace {

int64_t steadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

}  // namespace

int64_t DelayBackend::delayNsFor(OpKind op, uint64_t seq) const {
  if (!schedule_ || !delayOp_[static_cast<int>(op)]) {
    return 0;
  }
  return schedule_->delayNs(getRank(), static_cast<uint64_t>(op), seq);
}

void DelayBackend::applySlowdown() {
  const int64_t last = lastReturnNs_.load(std::memory_order_relaxed);
  if (last < 0) {
    return;  // the first op: nothing measured yet
  }
  const int64_t gap = steadyNowNs() - last;
  const auto extra = static_cast<int64_t>(static_cast<double>(gap) * (options_.slowdown - 1.0));
  if (extra <= 0) {
    return;
  }
  sleepForPrecise(std::chrono::nanoseconds(extra));
  auto& h = stats_->host();
  h.slowdownCalls.fetch_add(1, std::memory_order_relaxed);
  h.slowdownNs.record(static_cast<double>(extra));
}

c10::intrusive_ptr<c10d::Work> DelayBackend::issueOn(c10d::Backend& inner, OpKind op, c10::Device device,
                                                     IssueFn& issue, bool countErrors) {
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

c10::intrusive_ptr<c10d::Work> DelayBackend::run(OpKind op, c10::Device device, int64_t bytes,
                                                 std::vector<at::Tensor> outputs, IssueFn issue, bool asyncOp,
                                                 bool applyDelay) {
  c10d::Backend& inner = innerFor(op, device);
  const bool slow = options_.slowdown > 1.0;
  if (slow) {
    applySlowdown();
  }
  // Slowdown measures the time between ops from the moment each returns to its caller.
  struct ReturnStamp {
    std::atomic<int64_t>* last;
    ~ReturnStamp() {
      if (last) last->store(steadyNowNs(), std::memory_order_relaxed);
    }
  } stamp{slow ? &lastReturnNs_ : nullptr};

  const uint64_t seq = seq_.fetch_add(1, std::memory_order_relaxed) + 1;
  auto& s = stats_->op(op);
  s.calls.fetch_add(1, std::memory_order_relaxed);
  s.bytes.fetch_add(static_cast<uint64_t>(bytes), std::memory_order_relaxed);

  // The stale path consumes the schedule itself (as staleness, not as network delay).
  const int64_t delayNs = applyDelay ? delayNsFor(op, seq) : 0;
  if (delayNs > 0) {
    s.delayedCalls.fetch_add(1, std::memory_order_relaxed);
    s.delayNs.record(static_cast<double>(delayNs));
    if (options_.delayOnHost) {
      sleepForPrecise(std::chrono::nanoseconds(delayNs));
    }
  }
  const int64_t networkDelayNs = options_.delayOnHost ? 0 : delayNs;

  if (coalescing_ && inner.supportsCoalescing() &&
      std::find(coalescingInners_.begin(), coalescingInners_.end(), &inner) == coalescingInners_.end()) {
    inner.startCoalescing();
    coalescingInners_.push_back(&inner);
  }

  if (device.is_cuda()) {
    std::optional<c10::Event> start;
    if (options_.timeCuda) {
      start.emplace(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
      c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
      start->record(impl.getStream(device));
    }
    c10::intrusive_ptr<c10d::Work> innerWork;
    if (networkDelayNs > 0) {
#ifdef DELAYCOMM_WITH_CUDA
      issueWithGpuDelay(device, networkDelayNs, /*joinCurrentStream=*/!asyncOp,
                        [&] { innerWork = issueOn(inner, op, device, issue, true); });
#else
      TORCH_CHECK(false, "delaycomm: ", opName(op), ": network delay on cuda tensors needs the GPU sleep kernel, "
                  "and this build of delaycomm has no CUDA sources (rebuild with nvcc, or use delay_where=host)");
#endif
    } else {
      innerWork = issueOn(inner, op, device, issue, true);
    }
    harvestCudaTimings();
    if (!innerWork) {  // an inner backend inside its own coalescing window may return no work
      return innerWork;
    }
    auto work = c10::make_intrusive<DelayWorkCuda>(
        std::move(innerWork), op, seq, stats_, std::move(start), device,
        [this](OpKind k, c10::Event a, c10::Event b) { recordCudaPair(k, std::move(a), std::move(b)); });
    if (coalescing_ && !inner.supportsCoalescing()) {
      coalescedWorks_.push_back(work);
    }
    return work;
  }

  const auto calledAt = Clock::now();
  auto work = c10::make_intrusive<DelayWorkCpu>(op, seq, stats_, calledAt, std::move(outputs), options_.timeout,
                                                networkDelayNs);
  if (coalescing_ && !inner.supportsCoalescing()) {
    coalescedWorks_.push_back(work);
  }
  if (issuer_) {
    c10::intrusive_ptr<c10d::Work> innerWork;
    bool inlined = false;
    if (networkDelayNs == 0) {
      // Nothing held back ahead of it: issue on the caller's thread (the issuer's lock keeps the call order).
      inlined = issuer_->runInlineIfIdle([&] { innerWork = issueOn(inner, op, device, issue, true); });
    }
    if (!inlined) {
      c10d::Backend* innerPtr = &inner;
      issuer_->submit(
          calledAt + std::chrono::nanoseconds(networkDelayNs),
          [this, innerPtr, op, device, issue, work]() mutable {
            try {
              auto w = issueOn(*innerPtr, op, device, issue, false);
              TORCH_CHECK(w, "delaycomm: ", opName(op), ": the inner backend returned no work");
              work->attach(std::move(w));
            } catch (...) {
              work->fail(std::current_exception());
            }
          },
          [work](std::exception_ptr error) { work->fail(error); });
      return work;
    }
    if (!innerWork) {
      return innerWork;
    }
    work->attach(std::move(innerWork));
    return work;
  }
  auto innerWork = issueOn(inner, op, device, issue, true);
  if (!innerWork) {
    return innerWork;
  }
  work->attach(std::move(innerWork));
  return work;
}

}  // namespace delaycomm
