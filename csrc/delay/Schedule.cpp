#include "delay/Schedule.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace delaycomm {

namespace {
// Far beyond any timeout (~146 years) and far from int64 overflow; only the representation is bounded, the
// distribution's tail is not capped below it.
constexpr double kMaxDelayNs = 4.6e18;
}  // namespace

DelaySchedule::DelaySchedule(DelaySpec spec, double fraction, uint64_t seed, std::vector<int64_t> ranks)
    : sampler_(std::move(spec), seed, 0), fraction_(fraction), seed_(seed), ranks_(std::move(ranks)) {
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
}

bool DelaySchedule::targets(int64_t rank) const {
  return ranks_.empty() || std::binary_search(ranks_.begin(), ranks_.end(), rank);
}

bool DelaySchedule::delayed(int64_t rank, uint64_t stream, uint64_t seq) const {
  if (!active() || !targets(rank))
    return false;
  return counterUniforms(seed_, static_cast<uint64_t>(rank), stream, seq).second < fraction_;
}

int64_t DelaySchedule::delayNs(int64_t rank, uint64_t stream, uint64_t seq, CallSize at) const {
  if (!active() || !targets(rank))
    return 0;
  const auto [uDelay, uSelect] = counterUniforms(seed_, static_cast<uint64_t>(rank), stream, seq);
  if (!(uSelect < fraction_))
    return 0;
  const double ns = sampler_.quantile(uDelay, at) * 1e9;
  return static_cast<int64_t>(std::llround(std::min(ns, kMaxDelayNs)));
}

}  // namespace delaycomm
