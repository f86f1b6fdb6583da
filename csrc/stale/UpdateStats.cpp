// The opt-in update statistics of the staleness engine (stale/UpdateStats.hpp; docs/telemetry.md).

#include "stale/UpdateStats.hpp"

#include <cmath>

#include <ATen/ATen.h>

namespace delaycomm {

void UpdateStats::record(const at::Tensor& fresh, double resultScale, const at::Tensor& sent) {
  const at::Tensor b = fresh.to(at::kDouble).mul_(resultScale);
  const at::Tensor c = sent.to(at::kDouble);
  const double freshSq = b.square().sum().item<double>();
  const double sentSq = c.square().sum().item<double>();
  const double deviationSq = (c - b).square().sum().item<double>();
  std::lock_guard<std::mutex> lock(mutex_);
  sums_.steps++;
  sums_.freshSq += freshSq;
  sums_.sentSq += sentSq;
  sums_.deviationSq += deviationSq;
  if (freshSq > 0.0) {
    sums_.scaleSum += std::sqrt(sentSq / freshSq);
    sums_.scaleSteps++;
  }
}

void UpdateStats::fill(UpdateTelemetry& out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  out = sums_;
  out.enabled = true;
}

}  // namespace delaycomm
