#include "delay/LocalLatency.hpp"

#include <algorithm>
#include <cmath>

namespace delaycomm {

namespace {
const double kLogBase = std::log(LatencyEstimate::kBase);
// What one observation adds to its bucket: a count in units of 2^-16 observation, so that halving (rounded down)
// forgets no more than that of a bucket, where halving counts of whole observations would erase every bucket
// holding one, the sparse tail first.
constexpr uint64_t kWeight = uint64_t{1} << 16;
}  // namespace

void LatencyEstimate::record(int64_t ns) {
  const double v = static_cast<double>(ns);
  int b = 0;
  if (v > kMinNs) {
    b = std::min(kBuckets - 1, static_cast<int>(std::log(v / kMinNs) / kLogBase));
  }
  buckets_[static_cast<size_t>(b)].fetch_add(kWeight, std::memory_order_relaxed);
  if ((total_.fetch_add(1, std::memory_order_relaxed) + 1) % kHalvingEvery == 0) {
    halve();  // by the recorder of every kHalvingEvery-th observation: one thread per halving
  }
}

void LatencyEstimate::halve() {
  for (auto& bucket : buckets_) {
    uint64_t c = bucket.load(std::memory_order_relaxed);
    while (c > 0 && !bucket.compare_exchange_weak(c, c / 2, std::memory_order_relaxed)) {
    }
  }
}

int64_t LatencyEstimate::quantileNs(double q) const {
  if (total_.load(std::memory_order_relaxed) < kMinSamples) {
    return -1;
  }
  // One snapshot of the weights (records and halvings may run meanwhile); bucket b holds [kMinNs kBase^b,
  // kMinNs kBase^(b+1)), and the quantile is interpolated geometrically within it.
  std::array<uint64_t, kBuckets> counts;
  double n = 0.0;
  for (int b = 0; b < kBuckets; ++b) {
    counts[static_cast<size_t>(b)] = buckets_[static_cast<size_t>(b)].load(std::memory_order_relaxed);
    n += static_cast<double>(counts[static_cast<size_t>(b)]);
  }
  if (n <= 0.0) {
    return -1;
  }
  const double want = std::clamp(q, 0.0, 1.0) * n;
  double seen = 0.0;
  for (int b = 0; b < kBuckets; ++b) {
    const double c = static_cast<double>(counts[static_cast<size_t>(b)]);
    if (c > 0.0 && seen + c >= want) {
      const double frac = std::clamp((want - seen) / c, 0.0, 1.0);
      return static_cast<int64_t>(kMinNs * std::exp((b + frac) * kLogBase));
    }
    seen += c;
  }
  return -1;  // unreachable: the last bucket with a count reaches n
}

int64_t LatencyEstimate::meanOf(uint64_t minSamples) const {
  if (total_.load(std::memory_order_relaxed) < std::max<uint64_t>(minSamples, 1)) {
    return -1;
  }
  std::array<double, kBuckets> counts;
  double n = 0.0;
  for (int b = 0; b < kBuckets; ++b) {
    counts[static_cast<size_t>(b)] =
        static_cast<double>(buckets_[static_cast<size_t>(b)].load(std::memory_order_relaxed));
    n += counts[static_cast<size_t>(b)];
  }
  if (n <= 0.0) {
    return -1;
  }
  // The median's bucket, then every observation counted at most kOutlierCap x the median: a call that waited for a
  // late peer (ranks starting their loops apart, a rank descheduled) or paid a first use (Gloo's buffers of a new
  // size) is not this machine's own latency, and one of them among 16 observations moved the mean by its whole
  // size / 16 (measured: bench/results/2026-12-07-vm2core-replay-queue/, README).
  double seen = 0.0;
  int medianBucket = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += counts[static_cast<size_t>(b)];
    if (seen >= 0.5 * n) {
      medianBucket = b;
      break;
    }
  }
  const double cap = kOutlierCap * kMinNs * std::exp((medianBucket + 0.5) * kLogBase);
  double sum = 0.0;
  for (int b = 0; b < kBuckets; ++b) {
    sum += counts[static_cast<size_t>(b)] * std::min(cap, kMinNs * std::exp((b + 0.5) * kLogBase));
  }
  return static_cast<int64_t>(sum / n);
}

LocalLatency::~LocalLatency() {
  for (auto& e : estimates_) {
    delete e.load(std::memory_order_acquire);
  }
}

int64_t LocalLatency::provisionalNs(OpKind op, int sizeClass) const {
  const auto find = [&](int c) {
    return estimates_[static_cast<size_t>(op) * kSizeClasses + static_cast<size_t>(c)].load(std::memory_order_acquire);
  };
  if (const LatencyEstimate* e = find(sizeClass)) {
    const int64_t own = e->smallestNs();
    if (own >= 0) {
      return own;
    }
  }
  for (int c = sizeClass - 1; c >= 0; --c) {
    if (const LatencyEstimate* e = find(c)) {
      const int64_t own = e->quantileNs(0.1);
      if (own >= 0) {
        return own;
      }
    }
  }
  return -1;
}

int64_t LatencyEstimate::smallestNs() const {
  if (total_.load(std::memory_order_relaxed) == 0) {
    return -1;
  }
  for (int b = 0; b < kBuckets; ++b) {
    if (buckets_[static_cast<size_t>(b)].load(std::memory_order_relaxed) > 0) {
      return static_cast<int64_t>(kMinNs * std::exp(b * kLogBase));
    }
  }
  return -1;  // every weight halved away: nothing to go by
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
