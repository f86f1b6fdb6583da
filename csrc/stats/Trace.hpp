#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/macros/Macros.h>

#include "stats/ProfilerContext.hpp"

namespace delaycomm::trace {

// What delaycomm shows in torch.profiler traces (docs/telemetry.md, "In a profiler trace").
//
// 1. The caller's profiler state, carried to the thread that issues its op. torch.profiler records on the threads
//    it was enabled on: its callbacks are thread-local (at::RecordFunctionTLS) and its state hangs off the thread's
//    debug info (c10::ThreadLocalDebugInfo, PROFILER_STATE). An op that delaycomm's issuer thread issues later
//    (delay/IssuerThread.hpp) would otherwise leave no trace: the inner backend's own event (gloo:all_reduce) is
//    recorded by the thread that issues it. c10d and autograd carry the whole at::ThreadLocalState across threads;
//    delaycomm carries the profiler's part only: the rest (grad mode, Python dispatch and torch-function modes,
//    saved-tensor hooks) would run user code on delaycomm's own threads, and the inner backend needs none of it.
//    That part is trace::ProfilerContext (stats/ProfilerContext.hpp), captured and applied by IssuerThread.
//
// 2. delaycomm's own spans (user annotations, RecordScope::USER_SCOPE, as torch.profiler.record_function's):
//    "delaycomm:delay" (an injected delay), "delaycomm:stale ..." (a staleness decision). Their arguments (kwinputs)
//    appear in the trace's "args" when the profiler records shapes (record_shapes=True), as every op's inputs do.
//
// Arguments are integers, strings and bools: the trace writer prints a whole double as "5." (not JSON), so times are
// integer microseconds (delay_us).
//
// Cost with no profiler active: one check of the RecordFunction callbacks (at::getStepCallbacksUnlessEmpty, as
// torch's own RECORD_FUNCTION), nothing allocated, no argument built.

using SpanArgs = std::unordered_map<std::string, c10::IValue>;

// One user-annotation span in the active profiler's trace (see 2.): begun by begin(), ended by end() or the
// destructor, from any thread (as c10d's works end theirs on the thread that completes them). Empty, and free,
// when no profiler listens on the calling thread at begin().
class Span {
 public:
  Span() = default;
  // `fill(SpanArgs&)` adds the arguments; it runs only when a profiler listens.
  template <typename Fill>
  static Span begin(const char* name, Fill&& fill) {
    auto callbacks = at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE);
    if (C10_LIKELY(!callbacks)) {
      return {};
    }
    SpanArgs args;
    fill(args);
    return start(std::move(*callbacks), name, args);
  }
  // A span that ends at once: a decision, marked where it was taken.
  template <typename Fill>
  static void mark(const char* name, Fill&& fill) {
    begin(name, std::forward<Fill>(fill)).end();
  }
  void end() { rf_.reset(); }
  bool active() const { return static_cast<bool>(rf_); }

 private:
  static Span start(at::StepCallbacks&& callbacks, const char* name, const SpanArgs& args);
  std::unique_ptr<at::RecordFunction> rf_;
};

// 3. The job's timeline without the profiler (DELAYCOMM_TRACE, docs/telemetry.md "Timeline"): a bounded ring of
//    records, one per call (from the call to its completion), per injected delay or wait behind one (from the call
//    to the op's issue) and per stale decision, that Python writes as a Chrome trace-event file per rank
//    (delaycomm/timeline.py). Process-wide: one process is one rank under torchrun, and every delaycomm group of
//    the process records into it once enabled. The newest `capacity` records are kept; older ones are counted as
//    dropped. Off (the default), a record costs one relaxed atomic load.
struct TraceRecord {
  enum Kind : uint8_t { kCall, kDelay, kStale };
  Kind kind = kCall;
  const char* name = "";  // static: the op's name (a call), or the span's
  const char* op = "";    // static: the op's name
  const char* why = "";   // static: why a reduction was kept fresh (or "")
  int64_t startNs = 0;    // steady clock
  int64_t durNs = 0;
  uint64_t seq = 0;
  uint64_t thread = 0;  // the recording thread's id (hashed)
  // Integer arguments, named by the kind (delaycomm/timeline.py): call: size class bytes, ok (1, 0; -1: unknown),
  // device (0: CPU, 1: CUDA), how a CUDA call's duration was measured (kCudaTimed / kCudaUntimed); delay: delay ns,
  // carrier rank, size class bytes; stale: stream, deferred steps, landed, landed max steps, delay ns (seq: the
  // stream's step).
  std::array<int64_t, 5> args{};
};

class TraceLog {
 public:
  // The process's log, or null while DELAYCOMM_TRACE is off (the one check on the hot path).
  static TraceLog* active() { return active_.load(std::memory_order_relaxed); }
  // Turns the process's log on with room for `capacity` records (once; a later call may only grow it).
  static TraceLog& enable(size_t capacity);

  void record(TraceRecord r);
  // The records kept, oldest first, and how many were dropped to keep the newest.
  std::vector<TraceRecord> snapshot(uint64_t* dropped) const;
  size_t capacity() const;
  // steady clock ns -> Unix epoch ns (the clock every rank's file shares, for merging).
  static int64_t epochOffsetNs();
  static int64_t nowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

 private:
  explicit TraceLog(size_t capacity) : ring_(capacity) {}
  static std::atomic<TraceLog*> active_;
  mutable std::mutex mutex_;
  std::vector<TraceRecord> ring_;
  uint64_t written_ = 0;  // records ever written; ring_[written_ % capacity] is the next slot
};

// A CUDA call's timing (call args[3]): its duration is the GPU's, between the CUDA events around it, or unknown.
enum CudaCallTiming : int64_t { kCudaUntimed = 0, kCudaTimed = 1 };

// A call, from its call time to its completion (the works' completion, DeferredWork.hpp / DelayWork.hpp).
void recordCallTo(TraceLog& log, const char* op, uint64_t seq, std::chrono::steady_clock::time_point calledAt, bool ok,
                  int sizeClass);
inline void recordCall(const char* op, uint64_t seq, std::chrono::steady_clock::time_point calledAt, bool ok,
                       int sizeClass) {
  if (TraceLog* log = TraceLog::active(); C10_UNLIKELY(log != nullptr)) {
    recordCallTo(*log, op, seq, calledAt, ok, sizeClass);
  }
}

// A CUDA call (DelayWork.hpp, TimedWorkCuda): its completion is on the GPU, so it is recorded where the group's
// telemetry harvests the CUDA events around it (CudaTimings::harvest, never a host sync), with `durNs` the GPU's
// time between them (from the start event, recorded on the current stream right before the op, to the end event,
// recorded where the caller synchronised with it), placed at the call time `calledAtNs` (steady clock) on the
// host's clock: the GPU's own clock is not on it. A call whose events were never both recorded (a work dropped
// without a wait, or time_cuda=0) is recorded with `timing` kCudaUntimed and no duration. `ok`: what the caller's
// wait returned; unknown (args[1] = -1) for a work nobody waited on.
void recordCudaCallTo(TraceLog& log, const char* op, uint64_t seq, int64_t calledAtNs, int64_t durNs, int sizeClass,
                      CudaCallTiming timing, std::optional<bool> ok);
inline void recordCudaCall(const char* op, uint64_t seq, int64_t calledAtNs, int64_t durNs, int sizeClass,
                           CudaCallTiming timing, std::optional<bool> ok) {
  if (TraceLog* log = TraceLog::active(); C10_UNLIKELY(log != nullptr)) {
    recordCudaCallTo(*log, op, seq, calledAtNs, durNs, sizeClass, timing, ok);
  }
}

}  // namespace delaycomm::trace
