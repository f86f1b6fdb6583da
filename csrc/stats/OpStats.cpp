#include "stats/OpStats.hpp"

#include <algorithm>
#include <memory>

#include "stats/Trace.hpp"

namespace delaycomm {

SizeHistograms::~SizeHistograms() {
  for (auto& c : classes_) {
    delete c.load(std::memory_order_acquire);
  }
}

LogHistogram& SizeHistograms::at(int sizeClass) {
  auto& slot = classes_[static_cast<size_t>(std::clamp(sizeClass, 0, kSizeClasses - 1))];
  LogHistogram* h = slot.load(std::memory_order_acquire);
  if (h != nullptr) {
    return *h;
  }
  auto fresh = std::make_unique<LogHistogram>();
  if (slot.compare_exchange_strong(h, fresh.get(), std::memory_order_acq_rel)) {
    return *fresh.release();
  }
  return *h;  // another thread allocated it first
}

void SizeHistograms::reset() {
  for (auto& c : classes_) {
    if (auto* h = c.load(std::memory_order_acquire)) {
      h->reset();  // kept allocated: a concurrent record() may hold it
    }
  }
}

void CudaTimings::push(OpKind op, c10::Event start, c10::Event end, int sizeClass, Call call) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.push_back(Pair{op, std::move(start), std::move(end), sizeClass, call});
}

void CudaTimings::harvest(std::array<OpStats, kNumOpKinds>& ops) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Events complete in stream order per stream; stop at the first that has not (never block).
  while (!pending_.empty() && pending_.front().end.query()) {
    auto& p = pending_.front();
    const double ms = p.start.elapsedTime(p.end);
    auto& s = ops[static_cast<int>(p.op)];
    s.latencyNs.record(ms * 1e6);
    s.callNsBySize.at(p.sizeClass).record(ms * 1e6);
    trace::recordCudaCall(opName(p.op), p.call.seq, p.call.calledAtNs, static_cast<int64_t>(ms * 1e6), p.sizeClass,
                          trace::kCudaTimed, p.call.ok);  // DELAYCOMM_TRACE
    pending_.pop_front();
  }
}

void OpStats::reset() {
  calls = 0;
  bytes = 0;
  delayedCalls = 0;
  errors = 0;
  untimed = 0;
  matchCalls = 0;
  matchNothingAdded = 0;
  matchUncalibrated = 0;
  for (auto& c : matchNothingAddedBySize) {
    c = 0;
  }
  for (auto& c : matchUncalibratedBySize) {
    c = 0;
  }
  for (auto& c : sizedCallsBySize) {
    c = 0;
  }
  for (auto& c : bytesSumBySize) {
    c = 0.0;
  }
  staleCalls = 0;
  keptFreshCalls = 0;
  latencyNs.reset();
  delayNs.reset();
  callNsBySize.reset();
}

void StalenessStats::reset() {
  steps = 0;
  fresh = 0;
  stale = 0;
  dropped = 0;
  blockedNs = 0;
  stalenessSteps.reset();
}

void HostStats::reset() {
  slowdownCalls = 0;
  slowdownNs.reset();
}

void GroupStats::reset() {
  for (auto& op : ops_) {
    op.reset();
  }
  staleness_.reset();
  host_.reset();
  if (updates_) {
    updates_->reset();
  }
}

}  // namespace delaycomm
