#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "delay/Sampler.hpp"

namespace delaycomm {

// The delay schedule of a group: for any rank r, stream k and sequence number t, whether r's call is delayed and
// by how much. A pure function of (seed, r, k, t) and the options: every rank can compute every rank's schedule
// locally, with no communication (the staleness engine and delay_mode=match rely on it).
//
// Streams name independent sequences of draws:
//   [0, kLoaderStream)           one per op kind of a group (OpKind), t = the group's sequence number;
//   kLoaderStream                DelayedLoader batches, t = the batch index;
//   kSimulatorStream             the offline simulator's network delays;
//   keyStream(key)               a reduction key of the staleness engine, t = its step.
//
// Which calls are delayed (docs/delay.md, "Bursts"): with burst = 0 each call independently, with probability
// `fraction`; with a mean burst length B >= minBurst(fraction) calls, a two-state Markov chain per rank whose
// stationary fraction of delayed calls is `fraction` and whose runs of delayed calls have a geometric length of
// mean B. The chain is shared by the streams of one kind of axis (chainOf()): every op kind of a group (so a slow
// rank is slow for all its ops), every staleness key (so all of a step's buckets are late together). Its state at
// t is computed in O(1) expected time, without iterating over earlier calls (see Schedule.cpp).
//
// Threads: immutable after construction; safe from any thread.
class DelaySchedule {
 public:
  static constexpr uint64_t kLoaderStream = 1ull << 16;
  // Reserved for the offline simulator (python -m delaycomm.sim), so its draws never collide with a group's.
  static constexpr uint64_t kSimulatorStream = kLoaderStream + 1;
  static constexpr uint64_t keyStream(uint64_t key) { return (1ull << 32) | key; }

  // The shortest mean burst length for `fraction`: 1 / (1 - fraction) calls, which is the mean run length of
  // independent draws (a shorter one would make delayed calls avoid each other). +inf for fraction 1.
  static double minBurst(double fraction);

  // fraction in [0, 1]; ranks: the delayed ranks, empty = all; burst: the mean burst length in calls, 0 = calls
  // are delayed independently, else >= minBurst(fraction) (std::invalid_argument otherwise).
  // distribution: the parsed spec (never null; a none spec makes the schedule inactive).
  // carrierSize > 0 (delay_carrier=one, docs/delay.md "One carrier per call"): on every call of a group stream
  // (the op kinds, the staleness keys) one targeted rank below carrierSize, drawn from the schedule, is the only
  // one that may be delayed; every rank computes the same carrier. 0: every targeted rank draws its own delay.
  DelaySchedule(std::shared_ptr<const DelayDistribution> distribution, double fraction, uint64_t seed,
                std::vector<int64_t> ranks, double burst = 0.0, int64_t carrierSize = 0);

  // Whether rank's call (stream, seq) is delayed (the rank is targeted, and its draw or its burst state says so).
  bool delayed(int64_t rank, uint64_t stream, uint64_t seq) const;
  // Its delay in nanoseconds (0 when not delayed); `at`: the call, for a distribution that depends on it.
  // ownDraw: the rank's own draw even under one carrier per call (point-to-point ops: their peer is not the group).
  int64_t delayNs(int64_t rank, uint64_t stream, uint64_t seq, CallSize at = {}, bool ownDraw = false) const;
  // delay_carrier=one: the call's carrier (a targeted rank below carrierSize), or -1 when the schedule has no
  // single carrier for this stream (delay_carrier=all, the loader's and the simulator's streams, no rank targeted).
  int64_t carrier(uint64_t stream, uint64_t seq) const;
  int64_t carrierSize() const { return carrierSize_; }

  // The latest rank of a call (delay_mode=match; docs/delay.md, "Match mode"): among the targeted ranks below
  // `size` (or `onlyRank` alone when >= 0), the delayed one with the largest quantile draw, which has the largest
  // delay. `quantile` is where that delay lies in the distribution of the call's largest delay over those ranks,
  // ((1 - fraction) + fraction * u)^m for m ranks: what delay_mode=match couples the local latency with.
  struct Latest {
    int64_t rank = -1;      // -1: no rank is delayed on this call
    int64_t ns = 0;         // its delay (the schedule's), = delayNs(rank, stream, seq)
    double quantile = 0.0;  // in (0, 1)
  };
  Latest latest(uint64_t stream, uint64_t seq, int64_t size, int64_t onlyRank = -1, CallSize at = {}) const;

  bool targets(int64_t rank) const;
  bool active() const { return fraction_ > 0.0 && !sampler_.isNone(); }
  double fraction() const { return fraction_; }
  double burst() const { return burst_; }
  const DelaySampler& sampler() const { return sampler_; }
  const std::vector<int64_t>& ranks() const { return ranks_; }

  // The burst chain's state of `rank` at position t of chain `chain` (exposed for tests; needs burst > 0).
  bool burstState(int64_t rank, uint64_t chain, uint64_t t) const;
  // The chain that stream `stream` reads: 0 for the op kinds, 1 for every staleness key, else one per stream.
  static uint64_t chainOf(uint64_t stream);

 private:
  bool selected(int64_t rank, uint64_t stream, uint64_t seq, double uSelect) const;
  int64_t quantileNs(double u, CallSize at) const;
  // The last refresh of the chain at or before t (position 0 is always one).
  uint64_t lastRefresh(uint64_t key, uint64_t chain, uint64_t t) const;

  DelaySampler sampler_;
  double fraction_;
  uint64_t seed_;
  std::vector<int64_t> ranks_;  // sorted; empty = all
  double burst_ = 0.0;          // 0: independent draws
  int64_t carrierSize_ = 0;     // delay_carrier=one: the group's size; 0: every targeted rank draws
  double refresh_ = 1.0;        // the chain's per-step refresh probability lambda = 1 / (burst (1 - fraction))
  double logStay_ = 0.0;        // ln(1 - lambda)
  uint64_t block_ = 1;          // the block length of the refresh search, ~1 / lambda
};

}  // namespace delaycomm
