#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <c10/core/Event.h>

#include "ops/OpTable.hpp"
#include "stats/Histogram.hpp"
#include "stats/Telemetry.hpp"
#include "stats/UpdateStats.hpp"

namespace delaycomm {

// One latency histogram per size class, each allocated when its class first records (once per class and group,
// never on later calls). Threads: any; at() is lock-free once the class exists.
class SizeHistograms {
 public:
  SizeHistograms() = default;
  ~SizeHistograms();
  SizeHistograms(const SizeHistograms&) = delete;
  SizeHistograms& operator=(const SizeHistograms&) = delete;
  LogHistogram& at(int sizeClass);
  const LogHistogram* find(int sizeClass) const {
    return classes_[static_cast<size_t>(sizeClass)].load(std::memory_order_acquire);
  }
  void reset();

 private:
  std::array<std::atomic<LogHistogram*>, kSizeClasses> classes_{};
};

// What a work needs to record the latency its caller experiences (docs/profile.md, "What is recorded"): the
// size class of the call and when the call entered delaycomm (after a compute slowdown, before a host delay).
struct CallTiming {
  int sizeClass = 0;
  std::chrono::steady_clock::time_point enteredAt{};
  // delay_mode=match (docs/delay.md, "Match mode"): >= 0 when the call measures this machine's own latency, the
  // delay injected into it (what the caller experiences minus this is the machine's own); -1 otherwise.
  int64_t ownMinusNs = -1;
  // How long the rank's earlier held-back calls kept this one queued past its own release (delay/IssuerThread.hpp,
  // call order): not the call's own latency, so not recorded (the replay queues by itself: docs/profile.md).
  int64_t queuedNs = 0;
};

// Where delay_mode=match's calls report this machine's own latency (delay/LocalLatency.hpp).
class OwnLatencySink {
 public:
  virtual ~OwnLatencySink() = default;
  virtual void record(OpKind op, int sizeClass, int64_t ns) = 0;
};

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
  LogHistogram latencyNs;       // issue to completion
  LogHistogram delayNs;         // injected delay of the delayed calls
  SizeHistograms callNsBySize;  // the latency the caller experiences, per size class (successful calls)
  // delay_mode=match (docs/delay.md, "Match mode"): the calls this rank carried as the latest rank, those where
  // its own latency already reached the target (nothing added), those before its estimate was calibrated.
  std::atomic<uint64_t> matchCalls{0};
  std::atomic<uint64_t> matchNothingAdded{0};
  std::atomic<uint64_t> matchUncalibrated{0};
  // The same two per size class of the call (the telemetry's classes).
  std::array<std::atomic<uint64_t>, kSizeClasses> matchNothingAddedBySize{};
  std::array<std::atomic<uint64_t>, kSizeClasses> matchUncalibratedBySize{};
  // Per size class, the calls issued and the sum of their bytes (their mean size: the class's size_bytes in a
  // profile, docs/profile.md). A double: no sum of sizes overflows it.
  std::array<std::atomic<uint64_t>, kSizeClasses> sizedCallsBySize{};
  std::array<std::atomic<double>, kSizeClasses> bytesSumBySize{};
  // A call of `bytes` was issued: counted in its size class (two relaxed atomic adds, no lock).
  void countSize(int64_t bytes) {
    const auto c = static_cast<size_t>(std::clamp(sizeClassOf(bytes), 0, kSizeClasses - 1));
    sizedCallsBySize[c].fetch_add(1, std::memory_order_relaxed);
    bytesSumBySize[c].fetch_add(static_cast<double>(std::max<int64_t>(bytes, 0)), std::memory_order_relaxed);
  }
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
  // What DELAYCOMM_TRACE records of the call when its pair is harvested (stats/Trace.hpp, recordCudaCall).
  struct Call {
    uint64_t seq = 0;
    int64_t calledAtNs = 0;  // steady clock
    bool ok = true;          // what the caller's wait returned
  };
  void push(OpKind op, c10::Event start, c10::Event end, int sizeClass, Call call);
  // Folds every completed pair, in order, into `ops[op].latencyNs` and its size class's histogram, and records its
  // call in the DELAYCOMM_TRACE timeline when that is on.
  void harvest(std::array<OpStats, kNumOpKinds>& ops);

 private:
  struct Pair {
    OpKind op;
    c10::Event start;
    c10::Event end;
    int sizeClass;
    Call call;
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
  // A successful call completed now, as its caller sees it: records the time since call.enteredAt.
  void recordCall(OpKind kind, const CallTiming& call) {
    const auto ns = std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - call.enteredAt)
                   .count() -
               call.queuedNs);
    op(kind).callNsBySize.at(call.sizeClass).record(static_cast<double>(ns));
    if (call.ownMinusNs >= 0 && ownLatency_) {
      ownLatency_->record(kind, call.sizeClass, ns - call.ownMinusNs);
    }
  }
  // An op issued at `issuedAt` completed now, as its work saw it: its latency, and its caller's (`call`, when
  // given) when it succeeded, else an error.
  void recordCompletion(OpKind kind, std::chrono::steady_clock::time_point issuedAt,
                        const std::optional<CallTiming>& call, bool ok) {
    auto& s = op(kind);
    s.latencyNs.record(static_cast<double>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - issuedAt).count()));
    if (ok && call) {
      recordCall(kind, *call);
    }
    if (!ok) {
      s.errors.fetch_add(1, std::memory_order_relaxed);
    }
  }
  // delay_mode=match: set once, before the group's first op (DelayInjector's constructor).
  void setOwnLatencySink(std::shared_ptr<OwnLatencySink> sink) { ownLatency_ = std::move(sink); }
  // update_stats=1: set once, before the group's first op (StalenessEngine's constructor); null when off.
  void enableUpdateStats() { updates_ = std::make_unique<UpdateStats>(); }
  UpdateStats* updateStats() const { return updates_.get(); }
  // The counters and histograms as delaycomm.stats() reports them (stats/Telemetry.hpp); the staleness engine's
  // own values are left for the engine to fill. Fold the CUDA timings in first.
  GroupTelemetry telemetry() const;
  // Folds the completed GPU timings into the histograms (never blocks).
  void harvestCudaTimings() { cudaTimings_.harvest(ops_); }
  void reset();

 private:
  std::array<OpStats, kNumOpKinds> ops_;
  CudaTimings cudaTimings_;
  StalenessStats staleness_;
  HostStats host_;
  std::shared_ptr<OwnLatencySink> ownLatency_;
  std::unique_ptr<UpdateStats> updates_;
};

}  // namespace delaycomm
