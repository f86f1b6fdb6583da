#pragma once

#include <cstdint>
#include <mutex>

#include <ATen/core/Tensor.h>

#include "stats/Telemetry.hpp"

namespace delaycomm {

// Opt-in (update_stats=1, DELAYCOMM_UPDATE_STATS): how far the contribution this rank sends at each stale step is
// from the one it would send under BSP, measured where the blend reads both (docs/telemetry.md, "Update
// statistics"). Per step, with b = this rank's fresh gradient times the stream's result scale (its BSP
// contribution) and c = what the fused blend wrote (the contribution it sends): ||b||^2, ||c||^2, ||c - b||^2 and
// ||c|| / ||b||, accumulated in float64. Per rank: the group's applied update is the SUM of every rank's c, so the
// group's deviation also has cross terms between ranks that no rank sees.
//
// Cost: a copy of the bucket before the blend and three reductions after it, under the engine's lock; off (the
// default), the engine skips it with one null check per stale step.
// Threads: record() and fill() may be called from any thread.
class UpdateStats {
 public:
  // `fresh`: a copy of the tensor before the blend; `sent`: the tensor after it.
  void record(const at::Tensor& fresh, double resultScale, const at::Tensor& sent);
  void fill(UpdateTelemetry& out) const;

 private:
  mutable std::mutex mutex_;
  UpdateTelemetry sums_;
};

}  // namespace delaycomm
