#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "delay/DelaySpec.hpp"

namespace delaycomm {

// Counter-based randomness: two independent uniforms in (0, 1) that are a pure function of
// (seed, rank, stream, seq). Philox4x32-10 (Salmon et al., SC'11) keyed by a 64-bit hash of (seed, rank), with
// the 128-bit counter (seq, stream). No state, so any thread, any process, any rank can compute any rank's draw.
//   first:  the quantile draw of a delay;
//   second: the Bernoulli draw that decides whether a call is delayed (delay_fraction).
std::pair<double, double> counterUniforms(uint64_t seed, uint64_t rank, uint64_t stream, uint64_t seq);

// Philox4x32-10 itself (exposed for tests).
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// Inverse of the standard normal CDF, accurate to ~1e-15 (Acklam's rational approximation + two Halley steps).
double normalQuantile(double p);
double normalCdf(double z);

// The call a draw is for, where the distribution depends on it (profile:FILE): its op (an OpKind; -1: none) and
// its size in bytes (-1: unknown). Other families ignore it.
struct CallSize {
  int op = -1;
  int64_t bytes = -1;
};

// One delay distribution (a parsed DelaySpec with its parameters solved) and its deterministic samples.
//
// Families (x(u) is the quantile function, u in (0, 1)):
//   const      x = v
//   exp        x = -ln(1 - u) / rate, rate = -ln(1 - q) / x_q   (exp:p99=400ms: rate = ln(100) / 400 ms)
//   lognormal  x = c + exp(a + b * Phi^-1(u)), c = 0 for two percentiles, c >= 0 solved for three
//   pareto     x = c + exp(a + b * (-ln(1 - u))): for c = 0 this is Pareto I with scale e^a and shape 1/b;
//              for three percentiles c is solved (a generalised Pareto with location c + e^a >= 0)
//   trace      linear interpolation between the sorted values at positions u * (n - 1)
//   profile    the call's (op, size class) distribution of the profile (delay/Profile.hpp: interpolation
//              between size classes, the fallback for an op the profile lacks); without a call, every call pooled
// The tail is never capped.
//
// Errors: std::invalid_argument (a third percentile the family cannot reach, explained).
// Threads: immutable after construction; every method is safe from any thread.
class DelaySampler {
 public:
  explicit DelaySampler(DelaySpec spec, uint64_t seed = 0, uint64_t rank = 0);

  // The delay in seconds of draw (stream, seq) for this sampler's (seed, rank).
  double sample(uint64_t stream, uint64_t seq) const { return sampleFor(rank_, stream, seq); }
  // The delay in seconds of draw (stream, seq) for any rank under this sampler's seed.
  double sampleFor(uint64_t rank, uint64_t stream, uint64_t seq, CallSize at = {}) const;
  double quantile(double u, CallSize at = {}) const;  // seconds; u in [0, 1]
  double cdf(double seconds) const;
  double mean() const;  // seconds; +inf for a Pareto with shape <= 1

  const DelaySpec& spec() const { return spec_; }
  uint64_t seed() const { return seed_; }
  uint64_t rank() const { return rank_; }
  bool isNone() const { return spec_.isNone(); }
  // The solved parameters by name (rate, a, b, c, value, n...), for describe() and docs.
  std::vector<std::pair<std::string, double>> parameters() const;

 private:
  void solve();

  DelaySpec spec_;
  uint64_t seed_;
  uint64_t rank_;
  double value_ = 0.0;                  // const
  double rate_ = 0.0;                   // exp, per second
  double a_ = 0.0, b_ = 0.0, c_ = 0.0;  // lognormal / pareto
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

}  // namespace delaycomm
