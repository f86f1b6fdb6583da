#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "delay/DelayOptions.hpp"
#include "delay/IssuerThread.hpp"
#include "delay/LocalLatency.hpp"
#include "delay/Schedule.hpp"
#include "stats/OpStats.hpp"
#include "stats/Trace.hpp"

namespace delaycomm {

// How delay_mode treats a delayed call (docs/delay.md, "Match mode"): the schedule's delay added (kAdd); matched on
// top of this machine's own latency (kMatch: CPU ops); or, under delay_mode=auto's match (DelayMode::kMatchCpu), a
// cuda op whose own latency cannot be timed on the host: the whole target, counted as uncalibrated and warned
// (kUntimed). An explicit delay_mode=match raises on a cuda op (c10::Error naming the op and the way out).
enum class MatchCall { kAdd, kMatch, kUntimed };
MatchCall matchCallFor(DelayMode mode, OpKind op, bool cuda);

// Delay injection of one group (docs/delay.md; docs/core.md): the delay schedule, the compute slowdown, the host
// delay, the CPU issuer thread and the GPU sleep kernel, behind one entry point, run(). The backend's front
// (backend/DelayBackend.hpp) calls it for every op when engaged() and skips it otherwise.
//
// Options: DelayOptions (delay/DelayOptions.hpp): the parsed spec, never its text.
//
// What run() does with op `seq` of kind k on rank r (delay d = schedule().delayNs(r, k, seq) when delay_ops
// selects k; under delay_mode=match, d = matchDelayNs(): see there):
//  - slowdown K: the calling thread first sleeps (K - 1) x the time since its previous op returned;
//  - delay_where=host: the calling thread sleeps d, then issues;
//  - network + CPU: the op goes through the issuer thread, which issues every CPU op in call order, each no earlier
//    than call time + d; the caller gets a DeferredWorkCpu at once, attached when the op is issued. An op with
//    nothing held back ahead of it is issued on the calling thread;
//  - network + GPU: a stream-ordered sleep kernel before the collective (delay/GpuDelay.hpp); the host never
//    blocks.
// Every wait on the calling thread ends by the group's timeout (then raises the timeout error of
// delay/DelayTimeout.hpp) or when the group closes (raises: the op was not issued).
//
// Threads: run() from any thread (c10d's callers); close() and abort() from any thread, the issuer's included.
class DelayInjector {
 public:
  using Options = DelayOptions;  // validated by the caller (delaycomm._config, then BackendOptions)

  // One op as the front hands it over.
  struct Op {
    OpKind kind;
    uint64_t seq;
    c10::Device device;
    bool asyncOp;     // c10d's option (false: a GPU delay is joined back into the current stream)
    bool applyDelay;  // false: the staleness engine consumed the delay already (the op still keeps call order)
    const std::vector<at::Tensor>* outputs;  // CPU: kept alive by a held-back op's work
    // Runs on the calling thread after its waits (slowdown, host delay), before the op is issued or queued (or
    // null): the front opens the inner coalescing window and starts the CUDA timing there, so that an op's GPU
    // time includes its network delay and not the host's.
    const std::function<void()>* afterWaits = nullptr;
    int64_t bytes = 0;  // the call's size (profile:FILE's distribution; match mode's size class)
    // Where the schedule draws the call (DelayBackend::admit: collectives count the group's collectives only, so
    // every rank draws a call at the same position after point-to-point calls); 0: seq.
    uint64_t drawSeq = 0;
    uint64_t at() const { return drawSeq ? drawSeq : seq; }
  };
  // Issues the op to the inner backend now and returns its work (null inside an inner coalescing window).
  // onCaller: true on the calling thread (errors count there), false on the issuer thread (the work counts them).
  using Issue = std::function<c10::intrusive_ptr<c10d::Work>(bool onCaller)>;
  struct Issued {
    c10::intrusive_ptr<c10d::Work> work;  // held back: the caller's DeferredWorkCpu; else the inner work
    bool heldBack = false;
    std::chrono::steady_clock::time_point calledAt;   // after the waits on the calling thread (latency starts)
    std::chrono::steady_clock::time_point enteredAt;  // after a slowdown, before a host delay (the caller's latency)
    int64_t observe = -1;  // delay_mode=match: the call feeds this machine's own latency, with this much injected
  };

  DelayInjector(int rank, Options options, bool issuesCpuOps, std::shared_ptr<GroupStats> stats);
  ~DelayInjector();
  DelayInjector(const DelayInjector&) = delete;
  DelayInjector& operator=(const DelayInjector&) = delete;

  // Where delay_mode=match's warnings go (Python's warnings, through the backend's hook; set before the group's
  // first op); empty: TORCH_WARN. Called on the calling thread of the op warned about.
  std::function<void(const std::string&)> onWarn;

  // Whether anything configured acts on this rank's ops (a delay that targets it, or a slowdown).
  bool engaged() const { return engaged_; }
  // The delay schedule of the group (every rank's, for the staleness engine); null when no delay is configured.
  const DelaySchedule* schedule() const { return schedule_.get(); }
  bool delays(OpKind op) const { return delayOp_[static_cast<int>(op)]; }
  // The delay of op `seq` of kind `op` (of `bytes`; -1: unknown) on this rank in the schedule, in ns (0: not
  // delayed). Under delay_mode=match the injected delay is matchDelayNs()'s instead.
  int64_t delayNsFor(OpKind op, uint64_t seq, int64_t bytes = -1) const;
  // CPU ops queued in (or being issued by) the issuer thread.
  size_t pending() const { return issuer_ ? issuer_->pending() : 0; }
  // The group's timeout: bounds every wait of run() and a held-back op's expiry. setTimeout() (c10d's, from any
  // thread) applies to the ops called after it.
  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(timeoutMs_.load(std::memory_order_relaxed));
  }
  void setTimeout(std::chrono::milliseconds timeout) { timeoutMs_.store(timeout.count(), std::memory_order_relaxed); }

  // The one entry point (see above).
  Issued run(const Op& op, Issue issue);

  // destroy_process_group: wakes every caller sleeping on the host (their calls raise), issues every held-back op
  // at once, in order, and joins the issuer thread. Never waits out a delay. Idempotent.
  void close();
  // abort: as close(), but the held-back ops fail instead of being issued.
  void abort();

 private:
  void applySlowdown(OpKind op, uint64_t seq, std::chrono::steady_clock::time_point deadline);
  void throwIfClosed(HostSleeper::Woke woke, OpKind op, uint64_t seq, const char* what) const;
  Issued issueCpu(const Op& op, Issue& issue, int64_t networkDelayNs, std::chrono::steady_clock::time_point calledAt,
                  std::chrono::steady_clock::time_point enteredAt, int64_t observe);
  // delay_mode=match: the delay this rank injects into op `op` (docs/delay.md, "Match mode"). The schedule names
  // the call's latest rank and its delay T (every rank computes the same); that rank alone injects
  // max(0, T - L), L = the mean of its own latency (local_), and the others inject nothing (their call
  // waits for it). Sets *observe (else -1) to the injected delay when no other rank holds the call back: what
  // the caller then experiences beyond it is this machine's own latency, which feeds local_.
  // untimed: a call whose own latency match mode cannot time (cuda, under delay_mode=auto): the whole target,
  // counted as uncalibrated, nothing observed.
  int64_t matchDelayNs(const Op& op, int64_t* observe, bool untimed);
  void warn(const std::string& message) const;
  // The profiler span of an op's injected delay or queueing (stats/Trace.hpp; docs/telemetry.md): named `name`,
  // with the op, its sequence number, size class, drawn delay and carrier rank; empty when no profiler listens.
  trace::Span delaySpan(const char* name, const Op& op, int64_t delayNs) const;
  // DELAYCOMM_TRACE's record of the same hold, begun at `since` (its duration is set when it ends: endHold());
  // null when the timeline is off.
  std::optional<trace::TraceRecord> holdRecord(const char* name, const Op& op, int64_t delayNs,
                                               std::chrono::steady_clock::time_point since) const;
  static void endHold(std::optional<trace::TraceRecord>& record);
  // The rank whose delay holds the call back longest (every rank computes the same); -1: none.
  int64_t carrierOf(const Op& op) const;
  void noteFallback(OpKind op) const;  // profile:FILE: warns once that an op the profile lacks draws from others
  // profile:FILE: warns once per op that a call of a size far from the op's classes draws from its kind's.
  void noteKindFallback(OpKind op, int64_t bytes) const;

  const int rank_;
  const Options options_;
  const std::shared_ptr<GroupStats> stats_;
  std::unique_ptr<DelaySchedule> schedule_;
  // delay_mode=match: this machine's own latency per (op, size class); shared with the group's stats, through
  // which the works feed it (GroupStats::recordCall). Null under delay_mode=add.
  std::shared_ptr<LocalLatency> local_;
  // delay_mode=match, delay_place=step: the run of overlapping calls whose draw a call joins (delay/Schedule.hpp);
  // null otherwise.
  std::unique_ptr<StepPlace> place_;
  std::array<bool, kNumOpKinds> delayOp_{};
  std::unique_ptr<IssuerThread> issuer_;   // CPU network delay only
  HostSleeper hostSleeper_;                // host delay and slowdown; closed by close() and abort()
  std::atomic<int64_t> lastReturnNs_{-1};  // slowdown: when the previous op returned to its caller
  // delay_mode=match: a target shorter than the own latency was warned about, per (op, size class).
  std::array<std::atomic<bool>, kNumOpKinds * kSizeClasses> nothingAddedWarned_{};
  std::array<std::atomic<bool>, kNumOpKinds * kSizeClasses> uncalibratedWarned_{};
  std::array<std::atomic<bool>, kNumOpKinds> untimedWarned_{};  // cuda ops under delay_mode=auto's match
  // profile:FILE: what an op the profile lacks draws from (DelayProfile::fallbackOf), warned once per op.
  std::array<std::string, kNumOpKinds> fallbackNote_{};
  mutable std::array<std::atomic<bool>, kNumOpKinds> fallbackWarned_{};
  mutable std::array<std::atomic<bool>, kNumOpKinds> kindFallbackWarned_{};
  std::atomic<int64_t> timeoutMs_;  // timeout(); options_.timeout until setTimeout()
  bool engaged_ = false;
};

}  // namespace delaycomm
