#include "stats/OpStats.hpp"

namespace delaycomm {

void CudaTimings::push(OpKind op, c10::Event start, c10::Event end) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.push_back(Pair{op, std::move(start), std::move(end)});
}

void CudaTimings::harvest(std::array<OpStats, kNumOpKinds>& ops) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Events complete in stream order per stream; stop at the first that has not (never block).
  while (!pending_.empty() && pending_.front().end.query()) {
    auto& p = pending_.front();
    const double ms = p.start.elapsedTime(p.end);
    ops[static_cast<int>(p.op)].latencyNs.record(ms * 1e6);
    pending_.pop_front();
  }
}

void OpStats::reset() {
  calls = 0;
  bytes = 0;
  delayedCalls = 0;
  errors = 0;
  untimed = 0;
  staleCalls = 0;
  keptFreshCalls = 0;
  latencyNs.reset();
  delayNs.reset();
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
}

}  // namespace delaycomm
