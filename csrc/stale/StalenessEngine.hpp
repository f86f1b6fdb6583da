#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "delay/IssuerThread.hpp"
#include "delay/Schedule.hpp"
#include "stale/Agreement.hpp"
#include "stale/EngineWaits.hpp"
#include "stale/KeyTable.hpp"
#include "stale/Owners.hpp"
#include "stale/StaleOptions.hpp"
#include "stale/StepClock.hpp"
#include "stale/StepPlan.hpp"
#include "stats/OpStats.hpp"

namespace delaycomm {

// Bounded staleness with stale-gradient blending, realised as one SUM reduction of the original size (an
// all-reduce, or a reduce-scatter: the blend is elementwise, so it runs over the full reduce-scatter input and each
// rank's shard of the SUM is the shard of the blended result). Design notes: docs/staleness.md.
//
// The engine is a short sequence over its parts (docs/staleness.md, "The parts"):
//  - the key table (stale/KeyTable.hpp): which stream a reduction belongs to, each stream's bookkeeping, bounded;
//  - the step clock (stale/StepClock.hpp): the step time, configured or calibrated and agreed by the ranks;
//  - the step plan (stale/StepPlan.hpp): who is late by how many steps, from the shared delay schedule
//    (delay/Schedule.hpp), which every rank computes for every rank with no communication;
//  - the weights (stale/Weights.hpp): the policy math, a pure function;
//  - the blend (kernels/Blend.hpp): one fused pass that pre-scales this rank's fresh contribution, stashes it when
//    it is late, and adds its own stale contributions now due; the caller then SUM-reduces the tensor;
//  - the agreement (stale/Agreement.hpp): at flush, the ranks check through the store that their bookkeeping is
//    the same before any of them issues a reduction.
//
// Errors are raised on every rank alike, before this step changes any state: the asp max_pending overflow
// (computed from the shared schedule for every rank), and the SSP gate timeout (a gate wait longer than the
// group's timeout: every rank waits the timeout, as the collective would, then raises c10::DistBackendError).
// Every wait (the gate, the agreements through the store) goes through EngineWaits (stale/EngineWaits.hpp):
// bounded by the group's current timeout, ended at once by close() and by a member of the group found gone.
//
// Threads: prepareScaled(), takeFlush() and the getters take the engine's lock; the agreements through the store
// and the gate wait run without it. Calls on one group are serialised by c10d's ordering contract anyway.
// close() (destroy_process_group, abort) may come from any thread: a caller waiting in the engine wakes at once
// and raises.
// Memory: at most S stashed copies per key under ssp:S; under asp, max_pending per key and rank (an error beyond
// it); at most maxKeys keys.
class StalenessEngine {
 public:
  static constexpr uint64_t kExplicitKeyLimit = KeyTable::kExplicitKeyLimit;
  static constexpr uint64_t kScopeKeyBase = KeyTable::kScopeKeyBase;

  // What prepareScaled() decided for one step (exposed for telemetry and tests).
  struct StepInfo {
    uint64_t key = 0;
    uint64_t step = 0;
    int64_t nFresh = 0;
    int64_t nStale = 0;
    bool mineFresh = true;
    int64_t mineDue = 0;
    int64_t blockedNs = 0;
    double freshScale = 1.0;
    // Whether the step could defer at all: false on a stream's first step and before step_ms is known, when the
    // caller applies the op's delay as under bsp instead (docs/staleness.md, "Which reductions go stale").
    bool deferrable = false;
    int64_t delayNs = 0;  // this rank's delay at this step (when deferrable)
    // For the profiler's stale spans (stats/Trace.hpp): how many steps this rank's contribution is deferred (0:
    // fresh), and the most steps late of the contributions that land at this step (0: none lands).
    int64_t mineLateness = 0;
    int64_t landedMaxSteps = 0;
  };

  // One stream that flush delivers: this rank's local sum of its own pending contributions (zeros when it has
  // none), flat (the stream's numel elements, the same shape on every rank), scaled as the policy delivers them when
  // no fresh contribution is present and by the stream's result scale. SUM-reducing `local` (all-reduce;
  // reduce-scatter when `scatter`: each rank keeps its shard) delivers it. consumer: the parameters it lands on
  // (stale/Owners.hpp; -1 for an explicit key); name: the recognised stream's name (empty for an explicit key).
  struct FlushStream {
    uint64_t key;
    at::Tensor local;
    bool scatter;
    int64_t consumer = -1;
    std::string name;
    // stale_check: this rank's fresh gradients of the steps taken so far, unscaled, in float64 (reduced as `local`
    // is: their sum is what bsp would have delivered). `local` is undefined when only the reference is delivered.
    at::Tensor reference;
  };

  // What admit() decided for one recognised gradient reduction.
  struct Admission {
    uint64_t key = 0;
    bool admitted = false;  // false: kept fresh by the runtime check (GradientRecognizer::Reason::kNotConsumed)
    bool mayDefer = false;  // the stream has passed its probation: this step may defer
    std::string detail;     // when the check first failed: the stream and what it had deferred, for the warning
  };

  // options: validated by delaycomm._config (the engine asserts what it relies on), timeout and groupName set.
  StalenessEngine(int rank, int size, StalenessOptions options, const DelaySchedule* schedule,
                  c10::intrusive_ptr<c10d::Store> store, std::shared_ptr<GroupStats> stats);
  ~StalenessEngine();
  StalenessEngine(const StalenessEngine&) = delete;
  StalenessEngine& operator=(const StalenessEngine&) = delete;

  const StalenessOptions& options() const { return options_; }

  // The key of the recognised stream `name` (stale/Recognition.hpp: a DDP bucket, an FSDP parameter group, named
  // by its owner) reduced with tensors like `t`, and the runtime check of that stream (docs/staleness.md, "The
  // runtime check"): since its last reduction, an optimizer step must have consumed every parameter of `consumer`
  // (stale/Owners.hpp), unless `shadow` (a joined rank's shadow of DDP's backward pass: no optimizer runs there).
  // A stream that fails is kept fresh from then on; one that has passed fewer than probationCalls times defers
  // nothing yet. Every rank decides alike: the check reads the program's sequence of reductions and optimizer steps.
  Admission admit(const std::string& name, const at::Tensor& t, bool scatter, int64_t consumer, bool shadow);
  // Explicit keys (< kExplicitKeyLimit) need no lookup; the table creates their stream at their first step.
  static uint64_t scopeKey(const std::string& scope, int64_t numel, c10::ScalarType dtype, bool scatter) {
    return KeyTable::scopeKey(scope, numel, dtype, scatter);
  }

  // Rewrites `t` in place into this rank's contribution to key's next step; the caller then SUM-reduces it.
  // resultScale: the stream's result is multiplied by it (1 / N for AVG, f for PREMUL_SUM(f)); scatter: the caller
  // SUM-reduce-scatters `t` (the full input) and flush delivers the key by reduce-scatter.
  // mayDefer: false while a recognised stream is on probation (admit()): the step pays its delay as under bsp.
  StepInfo prepareScaled(at::Tensor& t, uint64_t key, double resultScale, bool scatter, bool mayDefer = true);

  // flush (collective: every rank calls it at the same point). First the ranks agree through the store that their
  // stale bookkeeping is the same (the same sequence of stale reductions, the same streams pending): when it is
  // not, every rank raises the same error and nothing changes (docs/staleness.md, "Divergence"). Then returns every
  // stream with a contribution still pending anywhere, in key order (the same streams on every rank); nothing stays
  // pending afterwards. Under drop nothing is pending (late contributions left in flight are counted as dropped).
  std::vector<FlushStream> takeFlush();

  // destroy_process_group / abort: every wait of the engine (the SSP gate, waiting out a gate timeout, the
  // step_ms=auto agreement, flush's exchange) ends at once and raises; later waits raise at once; the other
  // members' peer watches see this rank go (stale/EngineWaits.hpp). Idempotent.
  void close() { waits_.close(); }
  // c10d's setTimeout (group.set_timeout): bounds the engine's waits that start after it.
  void setTimeout(std::chrono::milliseconds timeout) { waits_.setTimeout(timeout); }

  int64_t pendingHere() const;
  int64_t pendingGlobal() const;
  double windowedRatio() const;
  StepSource stepSource() const;
  int64_t keyCount() const;
  // The engine's part of the group's staleness telemetry (stats/Telemetry.hpp): the windowed ratio, the pending
  // contributions, the keys, the step time and where it came from.
  void telemetry(StalenessTelemetry& out) const;
  // A key as users read it: "key 3" (explicit) or "'<stream>' (all_reduce 1024 x Float on cpu)".
  std::string describeKey(uint64_t key) const;

  // Called with each one-time warning (stale:fresh ratio, calibration that cannot happen, unkeyable streams), on the
  // calling thread, never under the engine's lock.
  std::function<void(const std::string&)> onWarn;

 private:
  using Warnings = std::vector<std::string>;

  // The parts of prepareScaled, in order (each under the lock unless said otherwise).
  int64_t stepTimeLocked(std::unique_lock<std::mutex>& lock, uint64_t key, const at::Tensor& t, Warnings& warnings);
  void checkStepLocked(const KeyTable::Stream& stream, const at::Tensor& t, uint64_t key, const StepPlan& plan,
                       std::unique_lock<std::mutex>& lock, Warnings& warnings);
  // Advances the stream's bookkeeping by one step; returns the arrivals due now.
  std::vector<KeyTable::Arrival> advanceLocked(KeyTable::Stream& stream, const at::Tensor& t, const StepPlan& plan,
                                               double resultScale, bool scatter);
  // The rule (docs/staleness.md): resolves a recognised stream's last reduction by its parameters' fates.
  bool resolveLocked(KeyTable::Stream& stream, const std::vector<owners::Fate>& fates);
  void discardDeferredLocked(KeyTable::Stream& stream, uint64_t origin, bool all, const owners::Ranges& skipped);
  void resolveAtFlushLocked(uint64_t key, KeyTable::Stream& stream);
  std::vector<FlushStream> withReferencesLocked(std::vector<FlushStream> out);
  void recordLocked(int64_t nFresh, const std::vector<KeyTable::Arrival>& arriving, Warnings& warnings);
  // The SSP gate (no lock): waits waitNs, or raises when the group closes meanwhile.
  void waitAtGate(uint64_t key, uint64_t step, int64_t waitNs, const char* op, const std::string& keyText);
  // Sleeps at the gate until `until` (no lock); raises when the group closes or (if `endWhenGone`) a member is
  // found gone meanwhile.
  void sleepAtGate(SteadyClock::time_point until, const char* op, uint64_t step, const std::string& keyText,
                   bool endWhenGone = true);

  void emit(Warnings& warnings) const;
  [[noreturn]] void throwGateTimeout(uint64_t key, uint64_t step, int late, const StepPlan& plan, int64_t stepNs,
                                     std::chrono::milliseconds timeout) const;
  [[noreturn]] void throwClosed(const char* op, uint64_t step, const std::string& keyText) const;
  [[noreturn]] void throwGone(const char* op, uint64_t step, const std::string& keyText) const;
  double windowedRatioLocked() const;

  const int rank_;
  const int size_;
  const StalenessOptions options_;
  const DelaySchedule* schedule_;
  std::shared_ptr<GroupStats> stats_;
  EngineWaits waits_;  // before agreement_, which waits through it
  StoreAgreement agreement_;

  mutable std::mutex mutex_;
  KeyTable keys_;
  StepClock clock_;
  SequenceDigest digest_;
  uint64_t calls_ = 0;
  uint64_t flushes_ = 0;
  std::deque<std::pair<int64_t, int64_t>> window_;  // (fresh, stale) of the last `window` steps
  int64_t windowFresh_ = 0;
  int64_t windowStale_ = 0;
  bool warnedRatio_ = false;
  bool warnedUnengaged_ = false;  // the one warning that staleness cannot engage (calibration or keys)
};

}  // namespace delaycomm
