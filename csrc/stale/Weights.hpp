#pragma once

#include <cstdint>

#include "stale/StaleOptions.hpp"

namespace delaycomm {

// The policy math of one step (docs/staleness.md, "The model"): how this rank scales its fresh contribution and
// each of its own stale contributions now due, so that one SUM reduction over the ranks yields, with N ranks and
// n_fresh and n_stale the global counts of the step:
//   apply: sum(fresh) + sum(due stale)
//   drop:  (N / n_fresh) sum(fresh); late contributions are not kept; zeros if n_fresh = 0
//   ema:   N [(1 - alpha) mean(fresh) + alpha mean(due stale)] when stale ones are due, else (N / n_fresh) sum(fresh);
//          n_fresh = 0: N mean(due stale), or zeros when none is due,
// times the stream's result scale (1; 1 / N for AVG; f for PREMUL_SUM(f)).
// Pure functions of their arguments: every rank computes every rank's weights alike.
struct BlendWeights {
  double fresh = 0.0;  // this rank's fresh contribution (0 when its own is late)
  double stale = 0.0;  // each of this rank's due stale contributions (0 under drop: none is kept)
};

// mineFresh: this rank's contribution is fresh at this step.
BlendWeights stepWeights(StalePolicy policy, double alpha, int64_t size, int64_t nFresh, int64_t nStale, bool mineFresh,
                         double resultScale);

// The scale flush gives this rank's pending contributions of a stream with `pendingGlobal` contributions in flight
// over all ranks: as a step delivers due contributions when no fresh one is present (ema: N / pendingGlobal), times
// the stream's result scale.
double flushScale(StalePolicy policy, int64_t size, int64_t pendingGlobal, double resultScale);

}  // namespace delaycomm
