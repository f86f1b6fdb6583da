// DelayBackend's routing of one op: slowdown, delay (host, CPU issuer thread, GPU sleep kernel), issue, wrap.
// The op methods (DelayBackend.cpp) check their arguments and call run().

#include <algorithm>
#include <cxxabi.h>

#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include "backend/DelayBackend.hpp"
#include "delay/DelayTimeout.hpp"
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

void DelayBackend::throwIfClosed(HostSleeper::Woke woke, OpKind op, uint64_t seq, const char* what) const {
  if (woke != HostSleeper::Woke::kClosed) {
    return;
  }
  stats_->op(op).errors.fetch_add(1, std::memory_order_relaxed);
  C10_THROW_ERROR(DistBackendError,
                  c10::str("delaycomm: ", opName(op), " (sequence number ", seq, "): the group was shut down "
                           "(destroy_process_group or abort) while this call was held back on the calling thread by ",
                           what, "; the op was not issued"));
}

void DelayBackend::applySlowdown(OpKind op, uint64_t seq, Clock::time_point deadline) {
  const int64_t last = lastReturnNs_.load(std::memory_order_relaxed);
  if (last < 0) {
    return;  // the first op: nothing measured yet
  }
  const int64_t gap = steadyNowNs() - last;
  // In double: gap x (K - 1) may not fit in int64 (a huge K), and must then saturate, not wrap.
  const double extra = static_cast<double>(gap) * (options_.slowdown - 1.0);
  if (!(extra >= 1.0)) {
    return;
  }
  const int64_t extraNs = extra >= 9.0e18 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(extra);
  const auto woke = hostSleeper_.sleepUntil(addSaturated<Clock>(Clock::now(), extraNs), deadline);
  const auto what = c10::str("the compute slowdown of ", options_.slowdown, "x (", msOf(extraNs), " ms: ",
                             options_.slowdown - 1.0, " x the ", msOf(gap), " ms since its previous op returned)");
  throwIfClosed(woke, op, seq, what.c_str());
  if (woke == HostSleeper::Woke::kDeadline) {
    stats_->op(op).errors.fetch_add(1, std::memory_order_relaxed);
    throwDelayTimeout(opName(op), seq, "the call", options_.timeout, true, c10::str("held back by ", what));
  }
  auto& h = stats_->host();
  h.slowdownCalls.fetch_add(1, std::memory_order_relaxed);
  h.slowdownNs.record(static_cast<double>(extraNs));
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

c10::intrusive_ptr<c10d::Work> DelayBackend::runDirect(OpKind op, c10::Device device, int64_t bytes,
                                                       const std::vector<at::Tensor>& outputs, IssueRef issue) {
  c10d::Backend& inner = innerFor(op, device);
  const uint64_t seq = seq_.fetch_add(1, std::memory_order_relaxed) + 1;
  auto& s = stats_->op(op);
  s.calls.fetch_add(1, std::memory_order_relaxed);
  s.bytes.fetch_add(static_cast<uint64_t>(bytes), std::memory_order_relaxed);
  const auto calledAt = Clock::now();
  auto innerWork = issueOn(inner, op, device, issue, true);
  if (!innerWork) {
    return innerWork;
  }
  return wrapIssuedCpu(std::move(innerWork), op, seq, calledAt, outputs);
}

c10::intrusive_ptr<c10d::Work> DelayBackend::wrapIssuedCpu(c10::intrusive_ptr<c10d::Work> innerWork, OpKind op,
                                                           uint64_t seq, Clock::time_point calledAt,
                                                           const std::vector<at::Tensor>& outputs) {
  c10::intrusive_ptr<c10::ivalue::Future> innerFuture;
  try {
    innerFuture = innerWork->getFuture();
  } catch (const std::exception&) {
    // Gloo's send/recv works have no future: DelayWorkCpu times them in wait().
  }
  if (innerFuture) {
    auto work = c10::make_intrusive<DirectWorkCpu>(std::move(innerWork), std::move(innerFuture), op, seq, stats_,
                                                   calledAt);
    work->watch();
    return work;
  }
  auto work = c10::make_intrusive<DelayWorkCpu>(op, seq, stats_, calledAt, outputs, options_.timeout, 0);
  work->attach(std::move(innerWork));
  return work;
}

c10::intrusive_ptr<c10d::Work> DelayBackend::runGeneral(OpKind op, c10::Device device, int64_t bytes,
                                                        const std::vector<at::Tensor>& outputs, IssueFn issue,
                                                        bool asyncOp, bool applyDelay) {
  c10d::Backend& inner = innerFor(op, device);
  const uint64_t seq = seq_.fetch_add(1, std::memory_order_relaxed) + 1;
  // Every wait this call adds on the calling thread (slowdown, host delay) ends by the group's timeout.
  const auto callDeadline = addSaturated<Clock>(Clock::now(), options_.timeout);
  const bool slow = options_.slowdown > 1.0;
  // Slowdown measures the time between ops from the moment each returns to its caller (or fails).
  struct ReturnStamp {
    std::atomic<int64_t>* last;
    ~ReturnStamp() {
      if (last) last->store(steadyNowNs(), std::memory_order_relaxed);
    }
  } stamp{slow ? &lastReturnNs_ : nullptr};
  if (slow) {
    applySlowdown(op, seq, callDeadline);
  }

  auto& s = stats_->op(op);
  s.calls.fetch_add(1, std::memory_order_relaxed);
  s.bytes.fetch_add(static_cast<uint64_t>(bytes), std::memory_order_relaxed);

  // The stale path consumes the schedule itself (as staleness, not as network delay).
  const int64_t delayNs = applyDelay ? delayNsFor(op, seq) : 0;
  if (delayNs > 0) {
    s.delayedCalls.fetch_add(1, std::memory_order_relaxed);
    s.delayNs.record(static_cast<double>(delayNs));
    if (options_.delayOnHost) {
      const auto woke = hostSleeper_.sleepUntil(addSaturated<Clock>(Clock::now(), delayNs), callDeadline);
      const auto what = c10::str("an injected delay of ", msOf(delayNs), " ms (delay_where=host)");
      throwIfClosed(woke, op, seq, what.c_str());
      if (woke == HostSleeper::Woke::kDeadline) {
        s.errors.fetch_add(1, std::memory_order_relaxed);
        throwDelayTimeout(opName(op), seq, "the call", options_.timeout, true,
                          c10::str("held back on the calling thread by ", what));
      }
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
      issueWithGpuDelay(device, boundedGpuDelayNs(networkDelayNs, options_.timeout), /*joinCurrentStream=*/!asyncOp,
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
        [timings = std::weak_ptr<CudaTimings>(cudaTimings_)](OpKind k, c10::Event a, c10::Event b) {
          if (auto t = timings.lock()) {
            std::lock_guard<std::mutex> lock(t->mutex);
            t->pending.push_back(CudaPair{k, std::move(a), std::move(b)});
          }
        });
    if (coalescing_ && !inner.supportsCoalescing()) {
      coalescedWorks_.push_back(work);
    }
    return work;
  }

  const auto calledAt = Clock::now();
  auto work = c10::make_intrusive<DelayWorkCpu>(op, seq, stats_, calledAt, outputs, options_.timeout,
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
          addSaturated<Clock>(calledAt, networkDelayNs),
          [this, innerPtr, op, device, issue, work]() mutable {
            try {
              auto w = issueOn(*innerPtr, op, device, issue, false);
              TORCH_CHECK(w, "delaycomm: ", opName(op), ": the inner backend returned no work");
              work->attach(std::move(w));
            } catch (const abi::__forced_unwind&) {
              throw;  // the thread is being cancelled or exits (e.g. at interpreter exit): never swallow it
            } catch (...) {
              work->fail(std::current_exception());
            }
          },
          [work](std::exception_ptr error) { work->fail(error); },
          // Still held back at the call time + the group's timeout: the work fails with the timeout error.
          addSaturated<Clock>(calledAt, options_.timeout), [work] { work->expire(); });
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
