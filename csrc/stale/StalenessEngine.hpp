#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "delay/Schedule.hpp"
#include "stats/OpStats.hpp"

namespace delaycomm {

// Bounded staleness with stale-gradient blending, realised as one SUM reduction of the original size (an
// all-reduce, or a reduce-scatter: the blend is elementwise, so it runs over the full reduce-scatter input and each
// rank's shard of the SUM is the shard of the blended result). Design notes: docs/staleness.md (keys, step
// calibration, the SSP gate, flush, memory bounds, reduce-scatter and FSDP2).
//
// A *key* names one stream of reductions (one DDP bucket); each call on a key is one step t. The delay schedule
// (delay/Schedule.hpp) is shared: every rank computes, for every rank r, the delay d of r's contribution at
// (key, t) locally, so all ranks agree on who is fresh and who is late with no communication. A contribution
// delayed by d arrives k = ceil(d / step) steps later; under ssp:S, k is capped at S and the rest of the delay is
// paid as waiting by the late rank before it joins the step (the SSP gate; all ranks then wait in the
// collective); asp never waits. At step t each rank pre-scales its fresh contribution (0 when its own is late,
// which is then stashed unscaled) and adds its own deferred contributions now due, in one fused kernel pass; the
// SUM reduction then yields, with n_fresh and n_stale the global counts:
//   apply: sum(fresh) + sum(due stale)
//   drop:  (N / n_fresh) sum(fresh); late contributions are not kept (counted as dropped); zeros if n_fresh = 0
//   ema:   N [(1 - alpha) mean(fresh) + alpha mean(due stale)] when stale ones are due, else (N / n_fresh) sum(fresh);
//          n_fresh = 0: N mean(due stale), or zeros when none is due.
// `average` (AVG) divides the result by N, and a result scale f (PREMUL_SUM(f), prepareScaled) multiplies it by f
// (both folded into the pre-scaling, and into flush).
//
// Keys: explicit (ddp_hook: bucket.index(); stale_allreduce(key=...)), < kIdentityKeyBase; for reductions
// inside an FSDP2 parameter group's gradient-reduction scope (stale/FsdpScope.hpp), the scope's name with the
// tensor's size and dtype (keyOfScope: a hash, >= kScopeKeyBase, the same on every rank whatever the order); or,
// for other all_reduce and reduce-scatter calls, the storage identity of the tensor (storage object, offset, size,
// dtype, device), numbered from kIdentityKeyBase in first-seen order, which is the same on every rank running the
// same program. A key defers nothing on its first step
// (DDP rebuilds its buckets after the first iteration, so storages seen once are not streams). The key table
// holds at most Options::maxKeys keys: the least recently used key with nothing pending is forgotten beyond that
// (a stream whose tensor is new storage on every call cannot be keyed; warned once).
//
// step: step_ms when configured; otherwise calibrated once, on the first key that has been called
// calibrationSteps + 1 times (which key and which call depend only on the sequence of keys, the same on every
// rank): the median of that key's calibrationSteps intervals between consecutive calls, measured on rank 0 and
// agreed through the group's store; nothing is deferred until then. Warned once when no key has calibrated after
// calibrationWarnCalls calls.
//
// Errors are raised on every rank alike, before this step changes any state: the asp max_pending overflow
// (computed from the shared schedule for every rank), and the SSP gate timeout (a gate wait longer than the
// group's timeout: every rank waits the timeout, as the collective would, then raises c10::DistBackendError).
//
// Threads: prepare(), takeFlush() and the getters take the engine's lock (the step-time agreement through the
// store and the gate wait run without it); calls on one group are serialised by c10d's ordering contract anyway.
// Memory: at most S stashed copies per key under ssp:S; under asp, max_pending per key and rank (an error beyond
// it); at most maxKeys keys.
class StalenessEngine {
 public:
  enum class Mode { kSsp, kAsp };
  enum class Policy { kApply, kDrop, kEma };

  // Explicit keys are < kIdentityKeyBase; storage-identity keys are numbered from it; scope keys (FSDP2) are
  // kScopeKeyBase + a 40-bit hash.
  static constexpr uint64_t kIdentityKeyBase = uint64_t{1} << 40;
  static constexpr uint64_t kScopeKeyBase = uint64_t{1} << 41;

  struct Options {
    Mode mode = Mode::kSsp;
    int64_t bound = 0;  // S of ssp:S
    Policy policy = Policy::kEma;
    double alpha = 0.1;
    double stepMs = 0.0;  // <= 0: calibrate
    int64_t maxPending = 64;
    int64_t calibrationSteps = 5;         // intervals of one key that calibrate step_ms=auto
    int64_t calibrationWarnCalls = 4096;  // warn once when no key has calibrated after this many calls
    int64_t maxKeys = 1024;               // bound of the key table
    int64_t window = 100;                 // steps of the windowed stale:fresh ratio
    double warnRatio = 0.4;
    // The group's timeout: bounds the SSP gate wait and the step-time agreement.
    std::chrono::milliseconds timeout{std::chrono::minutes(30)};
    std::string groupName;  // for messages
  };

  // What prepare() decided for one step (exposed for telemetry and tests).
  struct StepInfo {
    uint64_t key = 0;
    uint64_t step = 0;
    int64_t nFresh = 0;
    int64_t nStale = 0;
    bool mineFresh = true;
    int64_t mineDue = 0;
    int64_t blockedNs = 0;
    double freshScale = 1.0;
    // Whether the step could defer at all: false before step_ms is known and on a key's first step, when the
    // caller applies the op's delay as under bsp instead (docs/staleness.md, "Which reductions go stale").
    bool deferrable = false;
    int64_t delayNs = 0;  // this rank's delay at this step (when deferrable)
  };

  // Where the step time comes from (telemetry: stats()["staleness"]).
  struct StepSource {
    enum class Kind { kConfigured, kCalibrated, kCalibrating };
    Kind kind = Kind::kCalibrating;
    int64_t stepNs = 0;     // 0 while calibrating
    std::string key;        // the calibrating key, described (kCalibrated)
    int64_t intervals = 0;  // how many intervals the median was taken over (kCalibrated)
    uint64_t atCall = 0;    // the engine call (1-based) at which the ranks agreed (kCalibrated)
  };

  StalenessEngine(int rank, int size, Options options, const DelaySchedule* schedule,
                  c10::intrusive_ptr<c10d::Store> store, std::shared_ptr<GroupStats> stats);
  ~StalenessEngine();
  StalenessEngine(const StalenessEngine&) = delete;
  StalenessEngine& operator=(const StalenessEngine&) = delete;

  // Key of a tensor by storage identity (see above).
  uint64_t keyOf(const at::Tensor& t);
  // Key of the stream that `scope` (an FSDP2 reduction scope's name) reduces with tensors like `t`: a hash of the
  // name, size and dtype, so every rank computes the same key with no ordering assumption. scatter: the stream is
  // a reduce-scatter (flush delivers it as one).
  uint64_t keyOfScope(const std::string& scope, const at::Tensor& t, bool scatter);
  // The key keyOfScope gives (a pure function: tests and tools compute the schedule of a scope's stream with it).
  static uint64_t scopeKey(const std::string& scope, int64_t numel, c10::ScalarType dtype, bool scatter);
  // The key of a reduction of `t` issued now on the calling thread: keyOfScope inside an FSDP2 reduction scope
  // (stale/FsdpScope.hpp), else keyOf. Raises NotImplementedError for HSDP's second stale stage: a stale
  // all-reduce after a stale reduce-scatter in the same scope (docs/staleness.md, "HSDP"), on every rank alike.
  uint64_t streamKey(const at::Tensor& t, bool scatter);
  // Rewrites `t` in place into this rank's contribution to key's next step; the caller then SUM-reduces it (an
  // all-reduce). average: the stream is an AVG (the result and flush are divided by N).
  StepInfo prepare(at::Tensor& t, uint64_t key, bool average);
  // As prepare, for a stream whose result is multiplied by resultScale (1 / N for AVG, f for PREMUL_SUM(f));
  // scatter: the caller SUM-reduce-scatters `t` (the full input) and flush delivers the key by reduce-scatter.
  StepInfo prepareScaled(at::Tensor& t, uint64_t key, double resultScale, bool scatter);
  // Whether key's stream is a reduce-scatter (flush delivers its pending sum as this rank's shard).
  bool scatters(uint64_t key) const;
  // Every key with a contribution still pending anywhere, in key order, with this rank's local sum of its own
  // pending contributions (zeros when it has none) scaled as the policy delivers them when no fresh contribution
  // is present, and by the stream's result scale. SUM-reducing each tensor (all-reduce, or reduce-scatter for a
  // key that scatters(): each rank keeps its shard) delivers everything; nothing stays pending afterwards. Under
  // drop nothing is pending (late contributions left in flight are counted as dropped).
  std::vector<std::pair<uint64_t, at::Tensor>> takeFlush();
  int64_t pendingHere() const;
  int64_t pendingGlobal() const;
  double windowedRatio() const;
  StepSource stepSource() const;
  int64_t keyCount() const;
  // A key as users read it: "key 3" (explicit) or "all_reduce tensor #2 (1024 x Float on cpu)".
  std::string describeKey(uint64_t key) const;

  // Called with each one-time warning (stale:fresh ratio, calibration that cannot happen, unkeyable streams).
  std::function<void(const std::string&)> onWarn;

 private:
  // A tensor's storage identity. `storage` is the StorageImpl (kept from reuse by a weak reference, see
  // KeyState::storageRef), not the data pointer: the allocator may hand a freed buffer's address to a new tensor on
  // one rank and not on another, while a new storage object is new on every rank.
  struct Identity {
    const void* storage;
    int64_t offset;
    int64_t numel;
    c10::ScalarType dtype;
    c10::Device device;
    bool operator==(const Identity& o) const {
      return storage == o.storage && offset == o.offset && numel == o.numel && dtype == o.dtype && device == o.device;
    }
  };
  struct IdentityHash {
    size_t operator()(const Identity& id) const;
  };
  struct Pending {
    uint64_t due;
    uint64_t origin;
    at::Tensor tensor;
  };
  struct Arrival {
    int rank;
    int64_t staleness;
  };
  struct KeyState {
    uint64_t seen = 0;
    uint64_t step = 0;
    std::map<uint64_t, std::vector<Arrival>> arrivals;  // global: step -> contributions arriving then
    std::vector<int64_t> pendingOf;                     // global: contributions of each rank in flight (not under drop)
    std::deque<Pending> mine;                           // this rank's deferred contributions, ordered by due step
    at::Tensor prototype;                               // dtype/device of the stream (no storage)
    int64_t numel = 0;                                  // its size at the last step
    double resultScale = 1.0;          // the stream's result scale (last step): 1, 1 / N (AVG), f (PREMUL_SUM)
    bool scatter = false;              // a reduce-scatter stream (last step)
    std::string scope;                 // set for scope keys: the FSDP2 scope's name
    std::optional<Identity> identity;  // set for storage-identity keys
    // Holds the StorageImpl's memory (not its data) so that no other storage gets its address while the key lives.
    std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> storageRef;
    std::list<uint64_t>::iterator lru;  // position in lru_
    // step_ms=auto: this key's intervals between consecutive calls (until one key has calibrationSteps).
    std::chrono::steady_clock::time_point lastCall;
    std::vector<int64_t> intervals;
  };
  struct Proposal {
    uint64_t key;
    std::string keyText;
    uint64_t call;
    int64_t medianNs;
    int64_t intervals;
    int64_t attempt;
  };
  // What every rank computes for every rank at one step, before any state changes.
  struct Plan {
    std::vector<int64_t> k;       // lateness in steps per rank (0 = fresh)
    std::vector<int64_t> waitNs;  // SSP gate wait per rank
    std::vector<int64_t> delayNs;
    int64_t nFresh = 0;
    bool deferrable = false;
  };

  KeyState& touchLocked(uint64_t key, const at::Tensor& t);
  void evictLocked(std::string* warning);
  std::optional<Proposal> calibrationLocked(KeyState& ks, uint64_t key, std::string* warning);
  int64_t agreeOnStep(const Proposal& proposal);
  Plan planLocked(uint64_t key, uint64_t step, int64_t stepNs) const;
  void checkPendingLocked(const KeyState& ks, uint64_t key, uint64_t step, const Plan& plan) const;
  std::string describeKeyLocked(uint64_t key) const;
  const char* opTextLocked(uint64_t key) const;
  void recordWindow(int64_t nFresh, int64_t nStale);
  double windowedRatioLocked() const;
  [[noreturn]] void throwGateTimeout(uint64_t key, uint64_t step, int late, const Plan& plan, int64_t stepNs) const;

  const int rank_;
  const int size_;
  const Options options_;
  const DelaySchedule* schedule_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::shared_ptr<GroupStats> stats_;

  mutable std::mutex mutex_;
  std::map<uint64_t, KeyState> keys_;
  std::list<uint64_t> lru_;  // keys by last call, least recent first
  std::unordered_map<Identity, uint64_t, IdentityHash> identityKeys_;
  uint64_t nextIdentityKey_ = kIdentityKeyBase;  // identity keys live above explicit ones
  uint64_t calls_ = 0;
  int64_t stepNs_ = 0;        // 0 = not calibrated yet
  bool calibrating_ = false;  // a proposal is being agreed on (prepare of the calibrating call is in progress)
  int64_t calibrationAttempts_ = 0;
  StepSource source_;
  std::deque<std::pair<int64_t, int64_t>> window_;
  int64_t windowFresh_ = 0;
  int64_t windowStale_ = 0;
  bool warnedRatio_ = false;
  bool warnedUnengaged_ = false;  // the one warning that staleness cannot engage (calibration or keys)
};

}  // namespace delaycomm
