#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "delay/DelaySpec.hpp"

namespace delaycomm {

class DelayProfile;

// The call a draw is for, where the distribution depends on it (profile:FILE): its op (an OpKind; -1: none) and
// its size in bytes (-1: unknown). Other families ignore it.
struct CallSize {
  int op = -1;
  int64_t bytes = -1;
};

// Inverse of the standard normal CDF, accurate to ~1e-15 (Acklam's rational approximation + two Halley steps).
double normalQuantile(double p);
double normalCdf(double z);

// The delay spec parsed once (bound as delaycomm._C.DelaySpec; docs/core.md, "Options"): what its text says
// (delay/DelaySpec.hpp), the data of a trace or a profile, its family's parameters solved, and its content digest.
// Python's option check builds it (delaycomm/_spec.py: the grammar here, a file read and checked there, once), and
// it is what crosses into the backend (DelayOptions::spec): samplers, schedules, the staleness engine and every
// rank's agreement on the options read this one object, never the text again.
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
// Errors: std::invalid_argument, "delaycomm: invalid delay spec 'TEXT': WHY" (a third percentile the family
// cannot reach, explained; a trace or a profile spec without its data).
// Threads: immutable after construction; every method is safe from any thread.
class DelayDistribution {
 public:
  // A spec that names no file (none, const, exp, lognormal, pareto).
  static std::shared_ptr<const DelayDistribution> parse(std::string_view text);
  // A trace:FILE spec and the file's latencies in seconds (any order; checked by Python: finite, in bounds).
  static std::shared_ptr<const DelayDistribution> ofTrace(DelaySpec spec, std::vector<double> latencies);
  // A profile:FILE spec and the file's profile.
  static std::shared_ptr<const DelayDistribution> ofProfile(DelaySpec spec, std::shared_ptr<const DelayProfile> p);

  double quantile(double u, CallSize at = {}) const;  // seconds; u in [0, 1]
  double cdf(double seconds) const;
  double mean() const;  // seconds; +inf for a Pareto with shape <= 1
  // The solved parameters by name (rate, a, b, c, value, n...), for describe() and docs.
  std::vector<std::pair<std::string, double>> parameters() const;

  const DelaySpec& spec() const { return spec_; }
  bool isNone() const { return spec_.isNone(); }
  // trace:FILE: the latencies, sorted (seconds); empty otherwise.
  const std::vector<double>& trace() const { return trace_; }
  // profile:FILE: the profile; null otherwise.
  const std::shared_ptr<const DelayProfile>& profile() const { return profile_; }
  // The content of a trace (FNV-1a of its sorted latencies) or a profile (DelayProfile::digest()), so that ranks
  // compare files by what they hold, not by their paths; 0 for the other families.
  uint64_t digest() const { return digest_; }

  // NOTE: public for std::make_shared; use the factories above.
  explicit DelayDistribution(DelaySpec spec);

 private:
  void solve();

  DelaySpec spec_;
  std::vector<double> trace_;
  std::shared_ptr<const DelayProfile> profile_;
  uint64_t digest_ = 0;
  double value_ = 0.0;                  // const
  double rate_ = 0.0;                   // exp, per second
  double a_ = 0.0, b_ = 0.0, c_ = 0.0;  // lognormal / pareto
};

// FNV-1a over the bit patterns of `sorted` (a trace's digest).
uint64_t traceDigest(const std::vector<double>& sorted);

}  // namespace delaycomm
