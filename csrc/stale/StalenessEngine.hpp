#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "delay/Schedule.hpp"
#include "stats/OpStats.hpp"

namespace delaycomm {

// Bounded staleness with stale-gradient blending (SPEC §5), realised as one SUM all-reduce of the original size.
//
// A *key* names one stream of reductions (one DDP bucket); each call on a key is one step t. The delay schedule
// (delay/Schedule.hpp) is shared: every rank computes, for every rank r, the delay d of r's contribution at
// (key, t) locally, so all ranks agree on who is fresh and who is late with no communication. A contribution
// delayed by d arrives k = ceil(d / step) steps later; under ssp:S, k is capped at S and the rest of the delay is
// paid as waiting by the late rank before it joins the step (all ranks then wait in the collective); asp never
// waits. At step t each rank pre-scales its fresh gradient (0 when its own contribution is late, which is then
// stashed unscaled) and adds its own deferred contributions now due, in one fused kernel pass; the SUM all-reduce
// then yields, with n_fresh and n_stale the global counts:
//   apply: sum(fresh) + sum(due stale)
//   drop:  (N / n_fresh) sum(fresh); late contributions are not kept (counted as dropped); zeros if n_fresh = 0
//   ema:   N [(1 - alpha) mean(fresh) + alpha mean(due stale)] when stale ones are due, else (N / n_fresh) sum(fresh);
//          n_fresh = 0: N mean(due stale), or zeros when none is due.
// AVG divides the SUM result by N (folded into the pre-scaling).
//
// Keys: explicit (ddp_hook: bucket.index(); stale_allreduce(key=...)) or, for plain all_reduce calls, the
// storage identity of the tensor (data pointer, size, dtype, device), numbered in first-seen order, which is the
// same on every rank. A key defers nothing until it has been seen twice: DDP rebuilds its buckets after the first
// iteration, so storages seen once are not streams.
//
// step: step_ms when configured; otherwise calibrated once: the median time between the first steps of the first
// stable key, measured on rank 0 and agreed through the store; no deferral until then.
//
// Threads: prepare() and flush() hold the engine's lock; calls on one group are serialised by c10d's ordering
// contract anyway. Memory: at most S stashed copies per key under ssp:S; under asp, max_pending per key (an
// error beyond it).
class StalenessEngine {
 public:
  enum class Mode { kSsp, kAsp };
  enum class Policy { kApply, kDrop, kEma };

  struct Options {
    Mode mode = Mode::kSsp;
    int64_t bound = 0;  // S of ssp:S
    Policy policy = Policy::kEma;
    double alpha = 0.1;
    double stepMs = 0.0;  // <= 0: calibrate
    int64_t maxPending = 64;
    int64_t calibrationSteps = 5;
    int64_t window = 100;  // steps of the windowed stale:fresh ratio
    double warnRatio = 0.4;
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
  };

  StalenessEngine(int rank, int size, Options options, const DelaySchedule* schedule,
                  c10::intrusive_ptr<c10d::Store> store, std::shared_ptr<GroupStats> stats);

  // Key of a tensor by storage identity (see above).
  uint64_t keyOf(const at::Tensor& t);
  // Rewrites `t` in place into this rank's contribution to key's next step; the caller then SUM-all-reduces it.
  StepInfo prepare(at::Tensor& t, uint64_t key, bool average);
  // Every key with a contribution still pending anywhere, in key order, with this rank's local sum of its own
  // pending contributions (zeros when it has none) scaled as the policy delivers them when no fresh contribution
  // is present. SUM-all-reducing each tensor delivers everything; nothing stays pending afterwards.
  std::vector<std::pair<uint64_t, at::Tensor>> takeFlush();
  int64_t pendingHere() const;
  int64_t pendingGlobal() const;
  double windowedRatio() const;

  // Called once when the windowed stale:fresh ratio first exceeds options.warnRatio.
  std::function<void(const std::string&)> onWarn;

 private:
  struct Pending {
    uint64_t due;
    uint64_t origin;
    at::Tensor tensor;
  };
  struct KeyState {
    uint64_t seen = 0;
    uint64_t step = 0;
    std::map<uint64_t, int64_t> arrivals;   // global: step -> contributions arriving then (from every rank)
    std::map<uint64_t, std::vector<int64_t>> arrivalStaleness;  // step -> staleness of each arrival
    std::deque<Pending> mine;              // this rank's deferred contributions, ordered by due step
    at::Tensor prototype;                  // dtype/device of the stream (no storage)
    int64_t numel = 0;                     // its size at the last step
  };

  int64_t stepNsLocked(KeyState& ks, uint64_t key);
  void recordWindow(int64_t nFresh, int64_t nStale);

  const int rank_;
  const int size_;
  const Options options_;
  const DelaySchedule* schedule_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::shared_ptr<GroupStats> stats_;

  mutable std::mutex mutex_;
  std::map<uint64_t, KeyState> keys_;
  std::unordered_map<std::string, uint64_t> identityKeys_;
  uint64_t nextIdentityKey_ = uint64_t{1} << 40;  // identity keys live above explicit ones
  int64_t stepNs_ = 0;                            // 0 = not calibrated yet
  int64_t calibrationKey_ = -1;
  std::vector<int64_t> calibrationIntervals_;
  std::chrono::steady_clock::time_point lastCalibrationCall_;
  std::deque<std::pair<int64_t, int64_t>> window_;
  int64_t windowFresh_ = 0;
  int64_t windowStale_ = 0;
  bool warned_ = false;
};

}  // namespace delaycomm
