// The opt-in update statistics of the staleness engine (stats/UpdateStats.hpp; docs/telemetry.md).

#include "stats/UpdateStats.hpp"

#include <cmath>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace delaycomm {

namespace {

// One pass, no temporaries: ||b||^2, ||c||^2, ||c - b||^2 with b = scale * fresh, c = sent, in float64. Four
// independent partial sums per quantity, so that the additions do not wait on each other.
template <typename T>
void sumsCpu(const T* fresh, const T* sent, int64_t n, double scale, double* out) {
  constexpr int64_t kLanes = 4;
  double bb[kLanes] = {};
  double cc[kLanes] = {};
  double dd[kLanes] = {};
  const int64_t whole = n - n % kLanes;
  for (int64_t i = 0; i < whole; i += kLanes) {
    for (int64_t k = 0; k < kLanes; ++k) {
      const double b = scale * static_cast<double>(fresh[i + k]);
      const double c = static_cast<double>(sent[i + k]);
      bb[k] += b * b;
      cc[k] += c * c;
      dd[k] += (c - b) * (c - b);
    }
  }
  for (int64_t i = whole; i < n; ++i) {
    const double b = scale * static_cast<double>(fresh[i]);
    const double c = static_cast<double>(sent[i]);
    bb[0] += b * b;
    cc[0] += c * c;
    dd[0] += (c - b) * (c - b);
  }
  out[0] = (bb[0] + bb[1]) + (bb[2] + bb[3]);
  out[1] = (cc[0] + cc[1]) + (cc[2] + cc[3]);
  out[2] = (dd[0] + dd[1]) + (dd[2] + dd[3]);
}

}  // namespace

void UpdateStats::record(const at::Tensor& fresh, double resultScale, const at::Tensor& sent) {
  if (sent.is_cpu()) {
    const at::Tensor f = fresh.contiguous();
    const at::Tensor c = sent.contiguous();
    double sums[3];
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, c.scalar_type(), "delaycomm UpdateStats", [&] {
      sumsCpu(f.const_data_ptr<scalar_t>(), c.const_data_ptr<scalar_t>(), c.numel(), resultScale, sums);
    });
    std::lock_guard<std::mutex> lock(mutex_);
    foldLocked(sums);
    return;
  }
  // On the device, on the current stream: three float64 sums, copied to pinned host memory without a wait.
  const at::Tensor b = fresh.reshape(-1).to(at::kDouble) * resultScale;
  const at::Tensor c = sent.reshape(-1).to(at::kDouble);
  const at::Tensor d = c - b;
  const at::Tensor sums = at::stack({at::dot(b, b), at::dot(c, c), at::dot(d, d)});
  at::Tensor host = at::empty({3}, at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
  host.copy_(sums, /*non_blocking=*/true);
  c10::Event done(sums.device().type(), c10::EventFlag::PYTORCH_DEFAULT);
  c10::impl::VirtualGuardImpl impl(sums.device().type());
  done.record(impl.getStream(sums.device()));
  std::lock_guard<std::mutex> lock(mutex_);
  harvestLocked();
  inFlight_.push_back(InFlight{std::move(host), std::move(done)});
}

void UpdateStats::foldLocked(const double* sums) {
  sums_.steps++;
  sums_.freshSq += sums[0];
  sums_.sentSq += sums[1];
  sums_.deviationSq += sums[2];
  if (sums[0] > 0.0) {
    sums_.scaleSum += std::sqrt(sums[1] / sums[0]);
    sums_.scaleSteps++;
  }
}

void UpdateStats::harvestLocked() {
  // Events complete in stream order per stream; stop at the first that has not (never block).
  while (!inFlight_.empty() && inFlight_.front().done.query()) {
    foldLocked(inFlight_.front().host.const_data_ptr<double>());
    inFlight_.pop_front();
  }
}

void UpdateStats::fill(UpdateTelemetry& out) {
  std::lock_guard<std::mutex> lock(mutex_);
  harvestLocked();
  out = sums_;
  out.enabled = true;
}

void UpdateStats::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  sums_ = UpdateTelemetry{};
  inFlight_.clear();
}

}  // namespace delaycomm
