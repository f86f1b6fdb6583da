#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "delay/Distribution.hpp"

namespace delaycomm {

// Counter-based randomness: two independent uniforms in (0, 1) that are a pure function of
// (seed, rank, stream, seq). Philox4x32-10 (Salmon et al., SC'11) keyed by a 64-bit hash of (seed, rank), with
// the 128-bit counter (seq, stream). No state, so any thread, any process, any rank can compute any rank's draw.
//   first:  the quantile draw of a delay;
//   second: the Bernoulli draw that decides whether a call is delayed (delay_fraction).
std::pair<double, double> counterUniforms(uint64_t seed, uint64_t rank, uint64_t stream, uint64_t seq);

// Philox4x32-10 itself (exposed for tests).
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// One delay distribution's deterministic samples: draw (stream, seq) of (seed, rank) is the distribution's quantile
// at the first of counterUniforms(seed, rank, stream, seq), so any thread, process or rank computes any rank's.
// Threads: immutable after construction; every method is safe from any thread.
class DelaySampler {
 public:
  explicit DelaySampler(std::shared_ptr<const DelayDistribution> distribution, uint64_t seed = 0, uint64_t rank = 0);

  // The delay in seconds of draw (stream, seq) for this sampler's (seed, rank).
  double sample(uint64_t stream, uint64_t seq) const { return sampleFor(rank_, stream, seq); }
  // The delay in seconds of draw (stream, seq) for any rank under this sampler's seed.
  double sampleFor(uint64_t rank, uint64_t stream, uint64_t seq, CallSize at = {}) const;
  double quantile(double u, CallSize at = {}) const { return distribution_->quantile(u, at); }
  double cdf(double seconds) const { return distribution_->cdf(seconds); }
  double mean() const { return distribution_->mean(); }
  std::vector<std::pair<std::string, double>> parameters() const { return distribution_->parameters(); }

  const DelayDistribution& distribution() const { return *distribution_; }
  const std::shared_ptr<const DelayDistribution>& shared() const { return distribution_; }
  const DelaySpec& spec() const { return distribution_->spec(); }
  uint64_t seed() const { return seed_; }
  uint64_t rank() const { return rank_; }
  bool isNone() const { return distribution_->isNone(); }

 private:
  std::shared_ptr<const DelayDistribution> distribution_;
  uint64_t seed_;
  uint64_t rank_;
};

// A sampler as DelaySampler.describe() and parse_delay_spec() report it (docs/delay.md).
struct SamplerDescription {
  std::string spec;
  std::string family;
  std::vector<std::pair<std::string, double>> parameters;  // the solved parameters (DelaySampler::parameters())
  std::vector<DelaySpec::Percentile> requested;            // the spec's percentiles, as given
  // profile:FILE and trace:FILE: "profile" or "trace", the file, and its content's digest (16 hex digits, for the
  // ranks' agreement on the configuration); "" otherwise.
  std::string source;
  std::string sourcePath;
  std::string sourceDigest;
  std::vector<std::pair<std::string, double>> percentiles;  // ("p50_s", seconds), ...; empty for none
  double mean = 0.0;                                        // seconds
  uint64_t seed = 0;
  uint64_t rank = 0;
};
SamplerDescription describeSampler(const DelaySampler& s);
// A digest as 16 hex digits.
std::string digestText(uint64_t digest);

}  // namespace delaycomm
