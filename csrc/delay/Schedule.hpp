#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
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
    double u = 0.0;         // its draw: ns = drawNs(u, at) (StepPlace couples the draws of overlapping calls)
  };
  Latest latest(uint64_t stream, uint64_t seq, int64_t size, int64_t onlyRank = -1, CallSize at = {}) const;

  // The delay at draw position u in (0, 1) of a call `at`: the distribution's quantile, in ns (saturated).
  int64_t drawNs(double u, CallSize at = {}) const { return quantileNs(u, at); }

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

// delay_mode=match's place in the step (delay_place=step; docs/delay.md, "Replay into another job"). A profile's
// latency of a class is what A's calls of the class experienced, their wait behind the calls issued ahead of them
// in A's step included. A group's calls complete in call order (the issuer thread, then the inner backend), so in a
// replay a call issued while an earlier call is held back cannot complete before it: with a draw of its own per
// call, a call issued behind others experiences the largest of its step's targets, not its own (measured:
// bench/results/2026-12-07-vm2core-replay-queue/), its place in the step counted a second time.
//
// Overlapping calls form a run. A call issued when no earlier call is held back opens one and keeps its own draw u;
// an asynchronous call (async_op=True: DDP's buckets, FSDP's collectives) issued while one is joins it and draws at
// the run's u (the opener's). A synchronous call opens a run of its own: its caller waits for it, and in a training
// loop it comes after the caller waited for the calls before it (the metric after DDP's step), where the run's end,
// an estimate, may still be ahead; joined, it would join a run the more often the longer the run's target, and lean
// slow (measured: a broadcast after the metric, p90 +209% to +262% in 4 of 6 DDP runs,
// bench/results/2026-12-07-vm2core-jobpair-place/runs-v1/). A draw position is uniform whichever
// call's it is, so a joined call's target is still a draw of its own class's distribution, and calls of one class
// issued back to back get one target each, released in call order: each experiences its own target, not the
// largest of its step's. A call is held back until its release, call time + target - this machine's own latency
// (which match mode does not inject); the run lasts to the latest release of its calls, so that a call issued once
// the caller saw the last one complete (the next step's) opens a run of its own.
//
// What measures this machine's own latency: a call whose own target ends no earlier than every earlier call's
// (behindNs = 0). The test reads targets only, not the estimate of the own latency that the run's end uses, so
// that a wrong estimate cannot feed itself (an estimate too high would end every run at once, leave each call its
// own draw, and count a fast call's wait behind a slow one as its own latency).
//
// The draws stay a pure function of (seed, rank, stream, seq); which of them a call takes (its own or its run's)
// depends on when it was called, as this machine's own latency does, and only on the carrier's side: every rank
// still computes the same carrier for every call.
// Threads: every method from any thread (one lock).
class StepPlace {
 public:
  struct Placed {
    double u = 0.0;       // the draw position the call takes
    int64_t ns = 0;       // its target: targetNs(u)
    bool joined = false;  // issued while a call of the run was held back: u is the run's
    // How far an earlier call's target ends past this call's (0: not at all): such a call waits for it in the op,
    // so it does not measure this machine's own latency.
    int64_t behindNs = 0;
  };
  // The call issued at nowNs (ns, steady clock) whose own draw is u; targetNs(u): its target at draw position u;
  // ownNs: this machine's own latency of the call (>= 0); mayJoin: false for a synchronous call (see above).
  Placed place(int64_t nowNs, double u, const std::function<int64_t(double)>& targetNs, int64_t ownNs = 0,
               bool mayJoin = true);
  // How far an earlier call's target ends past nowNs (0: none): what a call with no delay of its own waits.
  int64_t behindNs(int64_t nowNs) const;
  // Whether a call of no own latency issued at nowNs would join the run (a call of the run is still held back).
  bool running(int64_t nowNs) const;
  // When the run's latest release is (ns; INT64_MIN: no call yet).
  int64_t endNs() const;

 private:
  mutable std::mutex mutex_;
  int64_t releaseNs_ = std::numeric_limits<int64_t>::min();  // the run's latest release
  int64_t targetNs_ = std::numeric_limits<int64_t>::min();   // every call's latest target end
  double u_ = 0.0;
};

}  // namespace delaycomm
