#pragma once

#include <deque>
#include <mutex>

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include "stats/Telemetry.hpp"

namespace delaycomm {

// Opt-in (update_stats=1, DELAYCOMM_UPDATE_STATS): how far the contribution this rank sends at each step of the
// staleness engine is from the one it would send under BSP, measured where the blend has both (docs/telemetry.md,
// "Update statistics"). Per step, with b = this rank's fresh gradient times the stream's result scale (its BSP
// contribution) and c = what the fused blend wrote (the contribution it sends): ||b||^2, ||c||^2 and ||c - b||^2,
// reduced in float64, and ||c|| / ||b|| when b != 0. Per rank: the group's applied update is the SUM of every
// rank's c, so the group's deviation also has cross terms between ranks that no rank sees. Flush deliveries are
// not steps and are not counted.
//
// Cost (why it is opt-in): a copy of the bucket before the blend (the engine's) and one pass over both after it
// (CPU; a few on CUDA).
// Off, nothing exists: the engine tests one pointer per step.
// Streams (CUDA): record() reduces on the caller's current stream and copies the three sums to pinned host memory
// asynchronously on it; a step is folded into the sums once an event recorded after that copy has completed.
// Nothing here synchronises with the device or blocks on it (as the latency timings: stats/OpStats.hpp).
// Threads: any; record() is called under the engine's lock, fill() and reset() from delaycomm.stats() and
// reset_stats().
class UpdateStats {
 public:
  // `fresh`: a copy of the tensor before the blend; `sent`: the tensor after it (same device, same numel).
  void record(const at::Tensor& fresh, double resultScale, const at::Tensor& sent);
  // The sums over the steps folded so far (CUDA: those whose reduction has completed on the device).
  void fill(UpdateTelemetry& out);
  void reset();

 private:
  struct InFlight {
    at::Tensor host;  // pinned float64 [||b||^2, ||c||^2, ||c - b||^2]
    c10::Event done;
  };
  void foldLocked(const double* sums);
  void harvestLocked();

  std::mutex mutex_;
  UpdateTelemetry sums_;
  std::deque<InFlight> inFlight_;
};

}  // namespace delaycomm
