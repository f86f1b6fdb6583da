#pragma once

#include <cstdint>
#include <vector>

#include "delay/Sampler.hpp"

namespace delaycomm {

// The delay schedule of a group: for any rank r, stream k and sequence number t, whether r's call is delayed and
// by how much. A pure function of (seed, r, k, t) and the options: every rank can compute every rank's schedule
// locally, with no communication (the staleness engine relies on it).
//
// Streams name independent sequences of draws:
//   [0, kLoaderStream)           one per op kind of a group (OpKind), t = the group's sequence number;
//   kLoaderStream                DelayedLoader batches, t = the batch index;
//   kSimulatorStream             the offline simulator's network delays;
//   keyStream(key)               a reduction key of the staleness engine, t = its step.
//
// Threads: immutable after construction; safe from any thread.
class DelaySchedule {
 public:
  static constexpr uint64_t kLoaderStream = 1ull << 16;
  // Reserved for the offline simulator (python -m delaycomm.sim), so its draws never collide with a group's.
  static constexpr uint64_t kSimulatorStream = kLoaderStream + 1;
  static constexpr uint64_t keyStream(uint64_t key) { return (1ull << 32) | key; }

  // fraction in [0, 1]; ranks: the delayed ranks, empty = all.
  DelaySchedule(DelaySpec spec, double fraction, uint64_t seed, std::vector<int64_t> ranks);

  // Whether rank's call (stream, seq) is delayed (Bernoulli(fraction) draw, and rank targeted).
  bool delayed(int64_t rank, uint64_t stream, uint64_t seq) const;
  // Its delay in nanoseconds (0 when not delayed); `at`: the call, for a distribution that depends on it.
  int64_t delayNs(int64_t rank, uint64_t stream, uint64_t seq, CallSize at = {}) const;

  bool targets(int64_t rank) const;
  bool active() const { return fraction_ > 0.0 && !sampler_.isNone(); }
  double fraction() const { return fraction_; }
  const DelaySampler& sampler() const { return sampler_; }
  const std::vector<int64_t>& ranks() const { return ranks_; }

 private:
  DelaySampler sampler_;
  double fraction_;
  uint64_t seed_;
  std::vector<int64_t> ranks_;  // sorted; empty = all
};

}  // namespace delaycomm
