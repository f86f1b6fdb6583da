#include "stats/Histogram.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace delaycomm {

namespace {
const double kLogBase = std::log(LogHistogram::kBase);

void atomicMin(std::atomic<double>& target, double v) {
  double cur = target.load(std::memory_order_relaxed);
  while (v < cur && !target.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

void atomicMax(std::atomic<double>& target, double v) {
  double cur = target.load(std::memory_order_relaxed);
  while (v > cur && !target.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}
}  // namespace

LogHistogram::LogHistogram() : min_(std::numeric_limits<double>::infinity()) {
  for (auto& b : buckets_) {
    b.store(0, std::memory_order_relaxed);
  }
}

int LogHistogram::bucketOf(double value) {
  if (!(value >= 1.0)) {  // also catches NaN
    return 0;
  }
  const int b = static_cast<int>(std::floor(std::log(value) / kLogBase));
  return std::clamp(b, 0, kBuckets - 1);
}

double LogHistogram::bucketValue(int bucket) {
  // Geometric midpoint of [base^b, base^(b+1)).
  return std::exp((static_cast<double>(bucket) + 0.5) * kLogBase);
}

void LogHistogram::record(double value) {
  if (std::isnan(value) || value < 0.0) {
    value = 0.0;
  }
  if (value == 0.0) {
    zeros_.fetch_add(1, std::memory_order_relaxed);
  } else {
    buckets_[bucketOf(value)].fetch_add(1, std::memory_order_relaxed);
  }
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
  atomicMin(min_, value);
  atomicMax(max_, value);
}

LogHistogram::Snapshot LogHistogram::snapshot() const {
  Snapshot s;
  s.buckets.resize(kBuckets);
  for (int i = 0; i < kBuckets; ++i) {
    s.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
  }
  s.zeros = zeros_.load(std::memory_order_relaxed);
  s.count = count_.load(std::memory_order_relaxed);
  s.sum = sum_.load(std::memory_order_relaxed);
  s.min = s.count ? min_.load(std::memory_order_relaxed) : 0.0;
  s.max = max_.load(std::memory_order_relaxed);
  return s;
}

void LogHistogram::reset() {
  for (auto& b : buckets_) {
    b.store(0, std::memory_order_relaxed);
  }
  count_.store(0);
  zeros_.store(0);
  sum_.store(0.0);
  min_.store(std::numeric_limits<double>::infinity());
  max_.store(0.0);
}

double LogHistogram::Snapshot::quantile(double q) const {
  uint64_t total = zeros;
  for (auto b : buckets) {
    total += b;
  }
  if (total == 0) {
    return 0.0;
  }
  q = std::clamp(q, 0.0, 1.0);
  // Nearest rank: the smallest value with at least ceil(q * total) values at or below it.
  const uint64_t rank = std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(q * static_cast<double>(total))));
  uint64_t seen = zeros;
  if (seen >= rank) {
    return 0.0;
  }
  for (int i = 0; i < kBuckets; ++i) {
    seen += buckets[i];
    if (seen >= rank) {
      // Never report beyond the observed extremes: the first and last buckets are clipped to min and max.
      return std::clamp(bucketValue(i), min, max);
    }
  }
  return max;
}

}  // namespace delaycomm
