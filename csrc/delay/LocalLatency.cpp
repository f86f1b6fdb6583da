#include "delay/LocalLatency.hpp"

#include <algorithm>
#include <cmath>

namespace delaycomm {

namespace {
const double kLogBase = std::log(LatencyEstimate::kBase);
}  // namespace

void LatencyEstimate::record(int64_t ns) {
  const double v = static_cast<double>(ns);
  int b = 0;
  if (v > kMinNs) {
    b = std::min(kBuckets - 1, static_cast<int>(std::log(v / kMinNs) / kLogBase));
  }
  buckets_[static_cast<size_t>(b)].fetch_add(1, std::memory_order_relaxed);
  total_.fetch_add(1, std::memory_order_relaxed);
}

int64_t LatencyEstimate::quantileNs(double q) const {
  const uint64_t n = total_.load(std::memory_order_relaxed);
  if (n < kMinSamples) {
    return -1;
  }
  // Bucket b holds [kMinNs kBase^b, kMinNs kBase^(b+1)); the quantile is interpolated geometrically within it.
  const double want = std::clamp(q, 0.0, 1.0) * static_cast<double>(n);
  double seen = 0.0;
  for (int b = 0; b < kBuckets; ++b) {
    const double c = static_cast<double>(buckets_[static_cast<size_t>(b)].load(std::memory_order_relaxed));
    if (c > 0.0 && seen + c >= want) {
      const double frac = std::clamp((want - seen) / c, 0.0, 1.0);
      return static_cast<int64_t>(kMinNs * std::exp((b + frac) * kLogBase));
    }
    seen += c;
  }
  // Counts recorded while scanning: the largest bucket with anything in it.
  for (int b = kBuckets - 1; b >= 0; --b) {
    if (buckets_[static_cast<size_t>(b)].load(std::memory_order_relaxed) > 0) {
      return static_cast<int64_t>(kMinNs * std::exp((b + 1) * kLogBase));
    }
  }
  return -1;
}

LocalLatency::~LocalLatency() {
  for (auto& e : estimates_) {
    delete e.load(std::memory_order_acquire);
  }
}

LatencyEstimate& LocalLatency::at(OpKind op, int sizeClass) {
  auto& slot = estimates_[static_cast<size_t>(op) * kSizeClasses + static_cast<size_t>(sizeClass)];
  LatencyEstimate* e = slot.load(std::memory_order_acquire);
  if (e != nullptr) {
    return *e;
  }
  auto* fresh = new LatencyEstimate();
  if (slot.compare_exchange_strong(e, fresh, std::memory_order_acq_rel)) {
    return *fresh;
  }
  delete fresh;  // another thread won; e holds its estimate
  return *e;
}

}  // namespace delaycomm
