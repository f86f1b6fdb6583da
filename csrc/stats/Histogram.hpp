#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <vector>

namespace delaycomm {

// Size classes of the per-size telemetry and of profiles (docs/profile.md): class 0 holds calls of 0 bytes,
// class k >= 1 holds [2^(k-1), 2^k) bytes.
inline constexpr int kSizeClasses = 64;
inline int sizeClassOf(int64_t bytes) {
  return bytes <= 0 ? 0 : 64 - __builtin_clzll(static_cast<uint64_t>(bytes));
}
inline uint64_t sizeClassBytes(int sizeClass) {  // the smallest size of the class
  return sizeClass <= 0 ? 0 : uint64_t{1} << (sizeClass - 1);
}

// A log-bucket histogram of non-negative values (latencies in nanoseconds, staleness in steps).
//
// Threads: record() is lock-free and may be called from any thread (the caller, Gloo's worker threads, the
// issuer thread); snapshot() may run concurrently and sees a consistent-enough view for reporting.
//
// Accuracy: bucket i holds [kBase^i, kBase^(i+1)) and reports its geometric midpoint, so any quantile is within
// sqrt(kBase) - 1 < 1% relative error of a value in the same bucket (<= 2% is required: docs/delay.md, "Telemetry").
// Values below 1 fall into bucket 0, which reports 0 for exact zeros (counted separately) and 1 otherwise.
class LogHistogram {
 public:
  static constexpr double kBase = 1.02;
  static constexpr int kBuckets = 1700;  // 1.02^1700 ~ 4e14: 4.6 days in ns.

  struct Snapshot {
    uint64_t count = 0;
    uint64_t zeros = 0;
    double sum = 0.0;
    double min = 0.0;
    double max = 0.0;
    std::vector<uint64_t> buckets;  // kBuckets entries

    // Quantile q in [0, 1] by nearest rank over the buckets; 0 when empty.
    double quantile(double q) const;
    double mean() const { return count ? sum / static_cast<double>(count) : 0.0; }
  };

  LogHistogram();
  void record(double value);
  Snapshot snapshot() const;
  void reset();

  static int bucketOf(double value);
  static double bucketValue(int bucket);

 private:
  std::array<std::atomic<uint64_t>, kBuckets> buckets_;
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> zeros_{0};
  std::atomic<double> sum_{0.0};
  std::atomic<double> min_;
  std::atomic<double> max_{0.0};
};

}  // namespace delaycomm
