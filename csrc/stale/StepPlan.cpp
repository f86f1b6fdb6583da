// One step's plan from the shared schedule (stale/StepPlan.hpp).

#include "stale/StepPlan.hpp"

namespace delaycomm {

namespace {

// ceil(d / step) for d, step > 0, without the overflow of (d + step - 1) / step near INT64_MAX.
int64_t stepsOf(int64_t d, int64_t stepNs) {
  return d / stepNs + (d % stepNs != 0 ? 1 : 0);
}

}  // namespace

StepPlan planStep(const DelaySchedule* schedule, uint64_t key, uint64_t step, int64_t stepNs, StalenessMode mode,
                  int64_t bound, int size) {
  const auto n = static_cast<size_t>(size);
  StepPlan plan;
  plan.lateness.assign(n, 0);
  plan.gateWaitNs.assign(n, 0);
  plan.delayNs.assign(n, 0);
  const bool canDefer = step >= 1 && stepNs > 0 && schedule != nullptr && schedule->active();
  plan.deferrable = canDefer;
  for (size_t r = 0; r < n; ++r) {
    int64_t k = 0;
    if (canDefer) {
      const int64_t d = schedule->delayNs(static_cast<int64_t>(r), DelaySchedule::keyStream(key), step);
      plan.delayNs[r] = d;
      if (d > 0) {
        k = stepsOf(d, stepNs);
        if (mode == StalenessMode::kSsp && k > bound) {
          // k > S means d > S * step, so the product does not overflow.
          plan.gateWaitNs[r] = d - bound * stepNs;
          k = bound;
        }
      }
    }
    plan.lateness[r] = k;
    if (k == 0) {
      ++plan.nFresh;
    }
  }
  return plan;
}

int StepPlan::gateTimeoutRank(int64_t timeoutNs) const {
  int late = -1;
  for (size_t r = 0; r < gateWaitNs.size(); ++r) {
    if (gateWaitNs[r] > timeoutNs && (late < 0 || gateWaitNs[r] > gateWaitNs[static_cast<size_t>(late)])) {
      late = static_cast<int>(r);
    }
  }
  return late;
}

}  // namespace delaycomm
