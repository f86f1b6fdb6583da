#pragma once

#include <cstdint>
#include <vector>

#include "delay/Schedule.hpp"
#include "stale/StaleOptions.hpp"

namespace delaycomm {

// What every rank computes for every rank at one step of a stream, from the shared delay schedule alone (no
// communication; docs/staleness.md, "The model"): a contribution delayed by d arrives k = ceil(d / step) steps
// later; under ssp:S, k is capped at S and the rest of the delay is paid as waiting at the SSP gate.
struct StepPlan {
  std::vector<int64_t> lateness;    // k per rank (0 = fresh)
  std::vector<int64_t> gateWaitNs;  // SSP gate wait per rank
  std::vector<int64_t> delayNs;     // the injected delay per rank
  int64_t nFresh = 0;
  bool deferrable = false;  // the step can defer at all (not a stream's first step, the step time known)

  // The rank whose gate wait is the longest beyond timeoutNs, or -1 when every wait fits the timeout.
  int gateTimeoutRank(int64_t timeoutNs) const;
};

// No deferral on a stream's first step (DDP rebuilds its buckets after the first iteration) nor while stepNs is 0
// (step_ms=auto not calibrated yet).
StepPlan planStep(const DelaySchedule* schedule, uint64_t key, uint64_t step, int64_t stepNs, StalenessMode mode,
                  int64_t bound, int size);

}  // namespace delaycomm
