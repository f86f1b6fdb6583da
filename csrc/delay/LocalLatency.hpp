#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "ops/OpTable.hpp"
#include "stats/OpStats.hpp"

namespace delaycomm {

// delay_mode=match's online estimate of this machine's own latency per (op, size class) (docs/delay.md, "Match
// mode"): what the caller experiences (GroupStats::recordCall: from the call until it sees the call complete)
// minus the delay this rank injected, observed on the calls that no other rank held back.
//
// One estimate is a log-bucket histogram (ratio 1.04 from 100 ns to ~52 s; a quantile is interpolated within its
// bucket) that forgets: every kHalvingEvery observations every bucket's weight is halved, so an
// observation weighs half as much kHalvingEvery observations later, and the estimate follows a machine whose load
// changes (the counts sum to between kHalvingEvery and 2 kHalvingEvery once the first halving is past). It
// answers nothing (-1) before kMinSamples observations: until then delay_mode=match adds the whole target, as
// delay_mode=add would.
//
// Threads: record() from any thread (the caller's, Gloo's), quantileNs() from any thread; lock-free (a record that
// races with a halving may escape it). The estimates of one group are
// allocated on first use.
class LatencyEstimate {
 public:
  static constexpr int kBuckets = 512;
  static constexpr double kBase = 1.04;
  static constexpr double kMinNs = 100.0;
  static constexpr uint64_t kMinSamples = 16;
  static constexpr uint64_t kHalvingEvery = 512;

  void record(int64_t ns);
  // The q-quantile in ns of the weighted observations, or -1 while fewer than kMinSamples were recorded.
  int64_t quantileNs(double q) const;
  // An observation counts in the mean as at most this many times the median (meanNs()).
  static constexpr double kOutlierCap = 4.0;

  // The weighted mean in ns (each bucket at its geometric middle, at most kOutlierCap x the median's), or -1 while
  // fewer than kMinSamples were recorded.
  int64_t meanNs() const { return meanOf(kMinSamples); }
  // The smallest observation in ns (its bucket's lower edge; -1 with none): the provisional estimate before
  // calibration, low on purpose (a first call's set-up or queueing must not cancel the delays of the next ones).
  int64_t smallestNs() const;
  // Observations recorded over the estimate's life (not forgotten by the halvings).
  uint64_t count() const { return total_.load(std::memory_order_relaxed); }

 private:
  void halve();
  int64_t meanOf(uint64_t minSamples) const;

  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
  std::atomic<uint64_t> total_{0};
};

class LocalLatency : public OwnLatencySink {
 public:
  LocalLatency() = default;
  ~LocalLatency() override;
  LocalLatency(const LocalLatency&) = delete;
  LocalLatency& operator=(const LocalLatency&) = delete;

  // The estimate of (op, size class) (size classes: stats/Histogram.hpp's sizeClassOf).
  LatencyEstimate& at(OpKind op, int sizeClass);
  // Before (op, size class) is calibrated: a provisional own latency, so that a call is not delayed by the whole
  // target (long by this machine's own latency): the smallest observation of the class, else the 10th percentile of
  // the op's nearest smaller calibrated class (a smaller call takes no longer), else -1. Both are low estimates: a
  // call before calibration may come out a little long, never short by an outlier.
  int64_t provisionalNs(OpKind op, int sizeClass) const;
  void record(OpKind op, int sizeClass, int64_t ns) override { at(op, sizeClass).record(ns); }

 private:
  std::array<std::atomic<LatencyEstimate*>, kNumOpKinds * kSizeClasses> estimates_{};
};

}  // namespace delaycomm
