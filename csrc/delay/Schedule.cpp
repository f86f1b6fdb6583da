#include "delay/Schedule.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace delaycomm {

namespace {
// Far beyond any timeout (~146 years) and far from int64 overflow; only the representation is bounded, the
// distribution's tail is not capped below it.
constexpr double kMaxDelayNs = 4.6e18;

// Counter streams of the burst chains' own draws, apart from every stream a call draws from (bit 63 set).
constexpr uint64_t kBurstGapTag = 1ull << 63;
constexpr uint64_t kBurstStateTag = (1ull << 63) | (1ull << 62);
// The counter stream of delay_carrier=one's carrier draws (a key no rank has: ranks are < 2^62).
constexpr uint64_t kCarrierKey = (1ull << 63) | (1ull << 61);
// The longest refresh block: the search's cost stays O(1) expected for any block length, this only keeps the
// positions in range.
constexpr double kMaxBlock = 1e15;
}  // namespace

double DelaySchedule::minBurst(double fraction) {
  return fraction >= 1.0 ? std::numeric_limits<double>::infinity() : 1.0 / (1.0 - fraction);
}

DelaySchedule::DelaySchedule(std::shared_ptr<const DelayDistribution> distribution, double fraction, uint64_t seed,
                             std::vector<int64_t> ranks, double burst, int64_t carrierSize)
    : sampler_(std::move(distribution), seed, 0),
      fraction_(fraction),
      seed_(seed),
      ranks_(std::move(ranks)),
      carrierSize_(std::max<int64_t>(0, carrierSize)) {
  if (!sampler_.shared()) {
    throw std::invalid_argument("delaycomm: DelaySchedule: needs a parsed delay spec, got none");
  }
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    throw std::invalid_argument("delaycomm: DelaySchedule: fraction must be in [0, 1], got " +
                                std::to_string(fraction));
  }
  for (auto r : ranks_) {
    if (r < 0) {
      throw std::invalid_argument("delaycomm: DelaySchedule: ranks must be >= 0, got " + std::to_string(r));
    }
  }
  std::sort(ranks_.begin(), ranks_.end());
  ranks_.erase(std::unique(ranks_.begin(), ranks_.end()), ranks_.end());
  if (!(burst == 0.0 || (burst >= 1.0 && std::isfinite(burst)))) {
    throw std::invalid_argument(
        "delaycomm: DelaySchedule: burst must be 0 (independent draws) or a mean burst "
        "length of at least 1 call, got " +
        std::to_string(burst));
  }
  // fraction 0 or 1: every call is alike, there is nothing to correlate.
  if (burst > 0.0 && fraction > 0.0 && fraction < 1.0) {
    const double lo = minBurst(fraction);
    if (burst < lo * (1.0 - 1e-12)) {
      throw std::invalid_argument("delaycomm: DelaySchedule: a mean burst length of " + std::to_string(burst) +
                                  " calls is shorter than the mean run of independent draws at fraction " +
                                  std::to_string(fraction) + ", 1 / (1 - fraction) = " + std::to_string(lo) +
                                  " calls (bursts make runs longer, never shorter)");
    }
    burst_ = burst;
    refresh_ = std::min(1.0, 1.0 / (burst * (1.0 - fraction)));
    logStay_ = std::log1p(-refresh_);  // -inf when refresh_ = 1
    block_ = static_cast<uint64_t>(std::min(kMaxBlock, std::ceil(1.0 / refresh_)));
  }
}

bool DelaySchedule::targets(int64_t rank) const {
  return ranks_.empty() || std::binary_search(ranks_.begin(), ranks_.end(), rank);
}

uint64_t DelaySchedule::chainOf(uint64_t stream) {
  if (stream < kLoaderStream)
    return 0;  // every op kind of a group: one chain over the group's sequence numbers
  if (stream >= (1ull << 32))
    return 1;  // every staleness key: one chain over the steps
  return stream;
}

// The chain (docs/delay.md, "Bursts"): at each position, with probability lambda the state is refreshed (drawn
// anew: delayed with probability `fraction`), otherwise it stays. Then P(delayed -> not) = lambda (1 - fraction)
// = 1 / burst and P(not -> delayed) = lambda fraction, a two-state Markov chain with stationary fraction
// `fraction`; position 0 is always a refresh, so every position is in the stationary distribution. The state at
// t is the draw of the last refresh at or before t, found without visiting earlier calls: positions are cut into
// blocks of ~1/lambda, and a block's refreshes are generated backwards from its end by geometric gaps (by
// memorylessness the same as one Bernoulli(lambda) per position). Expected cost: ~1 refresh skipped in t's block
// and ~1.6 blocks visited, whatever t.
uint64_t DelaySchedule::lastRefresh(uint64_t rank, uint64_t chain, uint64_t t) const {
  if (refresh_ >= 1.0)
    return t;
  uint64_t b = t / block_;
  for (;;) {
    const uint64_t start = b * block_;
    uint64_t pos = start + block_ - 1;  // candidate: the block's last position
    for (uint64_t i = 0;; ++i) {
      const double u = counterUniforms(seed_, rank, kBurstGapTag | (chain << 40) | i, b).first;
      // Geometric gap G >= 0 with P(G >= j) = (1 - lambda)^j.
      const double g = std::floor(std::log(u) / logStay_);
      if (!(g <= static_cast<double>(pos - start)))
        break;  // no (further) refresh in this block
      pos -= static_cast<uint64_t>(g);
      if (pos <= t)
        return pos;
      if (pos == start)
        break;
      --pos;
    }
    if (b == 0)
      return 0;
    --b;
  }
}

bool DelaySchedule::burstState(int64_t rank, uint64_t chain, uint64_t t) const {
  const uint64_t r = static_cast<uint64_t>(rank);
  const uint64_t s = lastRefresh(r, chain, t);
  return counterUniforms(seed_, r, kBurstStateTag | chain, s).first < fraction_;
}

bool DelaySchedule::selected(int64_t rank, uint64_t stream, uint64_t seq, double uSelect) const {
  if (burst_ > 0.0)
    return burstState(rank, chainOf(stream), seq);
  return uSelect < fraction_;
}

int64_t DelaySchedule::quantileNs(double u, CallSize at) const {
  const double ns = sampler_.quantile(u, at) * 1e9;
  return static_cast<int64_t>(std::llround(std::min(ns, kMaxDelayNs)));
}

int64_t DelaySchedule::carrier(uint64_t stream, uint64_t seq) const {
  // Only the group's streams have ranks that take part in one call: the op kinds and the staleness keys.
  if (carrierSize_ <= 0 || !(stream < kLoaderStream || stream >= (1ull << 32)))
    return -1;
  int64_t n = 0;
  if (ranks_.empty()) {
    n = carrierSize_;
  } else {
    n = std::lower_bound(ranks_.begin(), ranks_.end(), carrierSize_) - ranks_.begin();
  }
  if (n <= 0)
    return -1;
  const double u = counterUniforms(seed_, kCarrierKey, stream, seq).first;  // in [0, 1)
  const int64_t i = std::min<int64_t>(n - 1, static_cast<int64_t>(u * static_cast<double>(n)));
  return ranks_.empty() ? i : ranks_[static_cast<size_t>(i)];
}

bool DelaySchedule::delayed(int64_t rank, uint64_t stream, uint64_t seq) const {
  if (!active() || !targets(rank))
    return false;
  const int64_t c = carrier(stream, seq);
  if (c >= 0 && c != rank)
    return false;  // one carrier per call, and it is another rank
  return selected(rank, stream, seq, counterUniforms(seed_, static_cast<uint64_t>(rank), stream, seq).second);
}

int64_t DelaySchedule::delayNs(int64_t rank, uint64_t stream, uint64_t seq, CallSize at, bool ownDraw) const {
  if (!active() || !targets(rank))
    return 0;
  if (!ownDraw) {
    const int64_t c = carrier(stream, seq);
    if (c >= 0 && c != rank)
      return 0;  // one carrier per call, and it is another rank
  }
  const auto [uDelay, uSelect] = counterUniforms(seed_, static_cast<uint64_t>(rank), stream, seq);
  if (!selected(rank, stream, seq, uSelect))
    return 0;
  return quantileNs(uDelay, at);
}

DelaySchedule::Latest DelaySchedule::latest(uint64_t stream, uint64_t seq, int64_t size, int64_t onlyRank,
                                            CallSize at) const {
  Latest out;
  if (!active())
    return out;
  int64_t m = 0;
  double best = -1.0;
  auto consider = [&](int64_t r) {
    ++m;
    const auto [uDelay, uSelect] = counterUniforms(seed_, static_cast<uint64_t>(r), stream, seq);
    // The quantile function is non-decreasing: the largest draw has the largest delay (ties: the lowest rank).
    if (uDelay > best && selected(r, stream, seq, uSelect)) {
      best = uDelay;
      out.rank = r;
    }
  };
  if (onlyRank >= 0) {
    if (targets(onlyRank))
      consider(onlyRank);
  } else if (carrierSize_ > 0) {
    // One carrier per call: the largest delay of the call is the carrier's (m = 1).
    const int64_t c = carrier(stream, seq);
    if (c >= 0 && c < size)
      consider(c);
  } else if (ranks_.empty()) {
    for (int64_t r = 0; r < size; ++r)
      consider(r);
  } else {
    for (const int64_t r : ranks_) {
      if (r < size)
        consider(r);
    }
  }
  if (out.rank < 0)
    return out;
  out.ns = quantileNs(best, at);
  out.u = best;
  // P(largest delay <= x) = prod over the m ranks of P(d_r <= x) = ((1 - f) + f G(x))^m, and G(x) = u at the
  // largest delay x = G^-1(u); exact also within an atom of G (const) since the draws order the tie.
  out.quantile = std::pow((1.0 - fraction_) + fraction_ * best, static_cast<double>(m));
  return out;
}

namespace {

// nowNs + ns, saturated: a delay of "never" stays in the future instead of wrapping into the past.
int64_t saturatedEnd(int64_t nowNs, int64_t ns) {
  ns = std::max<int64_t>(0, ns);
  return ns > std::numeric_limits<int64_t>::max() - nowNs ? std::numeric_limits<int64_t>::max() : nowNs + ns;
}

}  // namespace

StepPlace::Placed StepPlace::place(int64_t nowNs, double u, const std::function<int64_t(double)>& targetNs,
                                   int64_t ownNs, bool mayJoin) {
  std::lock_guard<std::mutex> lock(mutex_);
  Placed out;
  const int64_t own = std::max<int64_t>(0, ownNs);
  out.joined = mayJoin && nowNs < releaseNs_;
  out.u = out.joined ? u_ : u;
  out.ns = targetNs(out.u);
  if (!out.joined) {
    u_ = u;  // this call opens a run
  }
  const int64_t release = saturatedEnd(nowNs, out.ns - own);
  releaseNs_ = out.joined ? std::max(releaseNs_, release) : release;
  const int64_t target = saturatedEnd(nowNs, out.ns);
  if (targetNs_ > target) {
    out.behindNs = targetNs_ - target;
  }
  targetNs_ = std::max(targetNs_, target);
  return out;
}

int64_t StepPlace::behindNs(int64_t nowNs) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return targetNs_ > nowNs ? targetNs_ - nowNs : 0;
}

bool StepPlace::running(int64_t nowNs) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return nowNs < releaseNs_;
}

int64_t StepPlace::endNs() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return releaseNs_;
}

}  // namespace delaycomm
