#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>

#include <c10/core/Event.h>

#include "ops/OpTable.hpp"
#include "stats/Histogram.hpp"

namespace delaycomm {

// Telemetry of one op type in one group. All members are updated lock-free from any thread.
struct OpStats {
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> delayedCalls{0};
  std::atomic<uint64_t> errors{0};
  std::atomic<uint64_t> untimed{0};  // GPU works destroyed before anyone waited on them
  // Staleness (docs/staleness.md, "Which reductions go stale"): calls whose own contribution was made stale
  // (deferred: also counted in delayedCalls), and calls kept fresh, delayed as under bsp, because they are not
  // data-parallel gradient reductions.
  std::atomic<uint64_t> staleCalls{0};
  std::atomic<uint64_t> keptFreshCalls{0};
  LogHistogram latencyNs;  // issue to completion
  LogHistogram delayNs;    // injected delay of the delayed calls
  void reset();
};

// Staleness telemetry of one group (SSP engine): arrivals, drops and how late they were.
struct StalenessStats {
  std::atomic<uint64_t> steps{0};
  std::atomic<uint64_t> fresh{0};
  std::atomic<uint64_t> stale{0};
  std::atomic<uint64_t> dropped{0};
  std::atomic<uint64_t> blockedNs{0};
  LogHistogram stalenessSteps;  // staleness (in steps) of each stale arrival
  void reset();
};

// Host-side blocking of one group's caller (slowdown=R:Kx): how often and how long it was made to wait.
struct HostStats {
  std::atomic<uint64_t> slowdownCalls{0};
  LogHistogram slowdownNs;
  void reset();
};

// GPU event pairs of one group's CUDA works (start before the op, end where the caller synchronised with it),
// waiting to be folded into the ops' latency histograms. Owned by the group's stats, which every work shares, so
// that a work waited for after its group was destroyed still has somewhere to put its pair.
// Threads: any; harvesting never blocks (it stops at the first pair whose end has not completed).
class CudaTimings {
 public:
  void push(OpKind op, c10::Event start, c10::Event end);
  // Folds every completed pair, in order, into `ops[op].latencyNs`.
  void harvest(std::array<OpStats, kNumOpKinds>& ops);

 private:
  struct Pair {
    OpKind op;
    c10::Event start;
    c10::Event end;
  };
  std::mutex mutex_;
  std::deque<Pair> pending_;
};

class GroupStats {
 public:
  OpStats& op(OpKind kind) { return ops_[static_cast<int>(kind)]; }
  const OpStats& op(OpKind kind) const { return ops_[static_cast<int>(kind)]; }
  StalenessStats& staleness() { return staleness_; }
  const StalenessStats& staleness() const { return staleness_; }
  HostStats& host() { return host_; }
  const HostStats& host() const { return host_; }
  CudaTimings& cudaTimings() { return cudaTimings_; }
  // Folds the completed GPU timings into the histograms (never blocks).
  void harvestCudaTimings() { cudaTimings_.harvest(ops_); }
  void reset();

 private:
  std::array<OpStats, kNumOpKinds> ops_;
  CudaTimings cudaTimings_;
  StalenessStats staleness_;
  HostStats host_;
};

}  // namespace delaycomm
