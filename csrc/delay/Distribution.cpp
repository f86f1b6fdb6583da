#include "delay/Distribution.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "delay/Profile.hpp"
#include "delay/Units.hpp"

namespace delaycomm {

namespace {

// Solves for the shift c in x_i = c + exp(a + b * t_i) through three points (t_i, x_i) (increasing), searching
// c in [cLo, x_1). Returns false when no c in that range fits. The log-spacing ratio
// ln((x3-c)/(x2-c)) / ln((x2-c)/(x1-c)) falls to 0 as c -> x1, so the root is bracketed when it exceeds
// R = (t3-t2)/(t2-t1) at cLo.
bool solveShift(const double t[3], const double x[3], double cLo, double* c) {
  const double r = (t[2] - t[1]) / (t[1] - t[0]);
  auto f = [&](double cc) { return std::log((x[2] - cc) / (x[1] - cc)) - r * std::log((x[1] - cc) / (x[0] - cc)); };
  double lo = cLo;
  double hi = x[0];
  if (!(f(lo) >= 0.0))
    return false;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    if (mid <= lo || mid >= hi)
      break;
    (f(mid) >= 0.0 ? lo : hi) = mid;
  }
  *c = lo;
  return true;
}

}  // namespace

double normalCdf(double z) {
  return 0.5 * std::erfc(-z / std::sqrt(2.0));
}

double normalQuantile(double p) {
  if (p <= 0.0)
    return -std::numeric_limits<double>::infinity();
  if (p >= 1.0)
    return std::numeric_limits<double>::infinity();
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                             1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01, -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  const double plow = 0.02425;
  double x;
  if (p < plow) {
    const double q = std::sqrt(-2 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else if (p <= 1 - plow) {
    const double q = p - 0.5;
    const double r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  } else {
    const double q = std::sqrt(-2 * std::log1p(-p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  // Two Halley steps on Phi(x) - p bring the 1e-9 approximation to machine precision.
  for (int i = 0; i < 2; ++i) {
    const double e = normalCdf(x) - p;
    const double u = e * std::sqrt(2 * M_PI) * std::exp(x * x / 2);
    x = x - u / (1 + x * u / 2);
  }
  return x;
}

uint64_t traceDigest(const std::vector<double>& sorted) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](uint64_t x) {
    for (int k = 0; k < 8; ++k) {
      h ^= (x >> (8 * k)) & 0xffu;
      h *= 0x100000001b3ull;
    }
  };
  mix(sorted.size());
  for (double v : sorted) {
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(bits));
    mix(bits);
  }
  return h;
}

DelayDistribution::DelayDistribution(DelaySpec spec) : spec_(std::move(spec)) {}

std::shared_ptr<const DelayDistribution> DelayDistribution::parse(std::string_view text) {
  DelaySpec spec = parseDelaySpec(text);
  if (spec.namesFile()) {
    throw invalidDelaySpec(text, std::string(familyName(spec.family)) +
                                     " names a file, which delaycomm's option check reads (delaycomm/_spec.py)");
  }
  auto d = std::make_shared<DelayDistribution>(std::move(spec));
  d->solve();
  return d;
}

std::shared_ptr<const DelayDistribution> DelayDistribution::ofTrace(DelaySpec spec, std::vector<double> latencies) {
  if (spec.family != DelaySpec::Family::kTrace || latencies.empty()) {
    throw invalidDelaySpec(spec.text, "a trace distribution needs a trace:FILE spec and at least one latency");
  }
  for (const double v : latencies) {
    if (!(v >= 0.0 && v <= kMaxDelaySeconds * (1.0 + 1e-12)))
      throw invalidDelaySpec(spec.text, "a trace latency is not a delay (0 or from 1ns to 86400s)");
  }
  std::sort(latencies.begin(), latencies.end());
  auto d = std::make_shared<DelayDistribution>(std::move(spec));
  d->digest_ = traceDigest(latencies);
  d->trace_ = std::move(latencies);
  return d;
}

std::shared_ptr<const DelayDistribution> DelayDistribution::ofProfile(DelaySpec spec,
                                                                      std::shared_ptr<const DelayProfile> p) {
  if (spec.family != DelaySpec::Family::kProfile || !p) {
    throw invalidDelaySpec(spec.text, "a profile distribution needs a profile:FILE spec and its profile");
  }
  auto d = std::make_shared<DelayDistribution>(std::move(spec));
  d->digest_ = p->digest();
  d->profile_ = std::move(p);
  return d;
}

void DelayDistribution::solve() {
  using F = DelaySpec::Family;
  const auto& p = spec_.percentiles;
  switch (spec_.family) {
    case F::kNone:
      return;
    case F::kConst:
      value_ = spec_.constSeconds;
      return;
    case F::kTrace:
    case F::kProfile:
      return;
    case F::kExp:
      rate_ = p.empty() ? 1.0 / spec_.expMeanSeconds : -std::log1p(-p[0].q) / p[0].seconds;
      return;
    case F::kLognormal:
    case F::kPareto:
      break;
  }
  const bool logn = spec_.family == F::kLognormal;
  auto tOf = [logn](double q) { return logn ? normalQuantile(q) : -std::log1p(-q); };
  if (p.size() == 2) {
    c_ = 0.0;
    b_ = (std::log(p[1].seconds) - std::log(p[0].seconds)) / (tOf(p[1].q) - tOf(p[0].q));
    a_ = std::log(p[0].seconds) - b_ * tOf(p[0].q);
    return;
  }
  const double t[3] = {tOf(p[0].q), tOf(p[1].q), tOf(p[2].q)};
  const double x[3] = {p[0].seconds, p[1].seconds, p[2].seconds};
  // The two-percentile fit, as a reference point in error messages.
  const double b2 = (std::log(x[1]) - std::log(x[0])) / (t[1] - t[0]);
  const double ref = std::exp(std::log(x[0]) + b2 * (t[2] - t[0]));
  const std::string where =
      percentileKey(p[0].q) + "=" + secondsText(x[0]) + "," + percentileKey(p[1].q) + "=" + secondsText(x[1]);
  bool ok = false;
  if (logn) {
    ok = solveShift(t, x, 0.0, &c_);
    if (!ok) {
      throw invalidDelaySpec(spec_.text, "no lognormal with a shift >= 0 has " + percentileKey(p[2].q) + "=" +
                                             secondsText(x[2]) + " through " + where +
                                             ": a shift only makes the tail heavier, "
                                             "so " +
                                             percentileKey(p[2].q) + " must be at least " + secondsText(ref) +
                                             " (the plain lognormal's); give a larger value, drop it, or use pareto");
    }
  } else {
    for (int k = 0; k < 64 && !ok; ++k) {
      ok = solveShift(t, x, x[0] - x[2] * std::ldexp(1.0, k), &c_);
    }
  }
  if (ok) {
    b_ = std::log((x[1] - c_) / (x[0] - c_)) / (t[1] - t[0]);
    a_ = std::log(x[0] - c_) - b_ * t[0];
  }
  if (!logn && (!ok || c_ + std::exp(a_) < 0.0)) {
    throw invalidDelaySpec(spec_.text, "no generalised Pareto with a location >= 0 has " + percentileKey(p[2].q) + "=" +
                                           secondsText(x[2]) + " through " + where +
                                           " (the Pareto I through those two has " + percentileKey(p[2].q) + "=" +
                                           secondsText(ref) +
                                           "; a lighter tail than an exponential's is out of reach); "
                                           "give a larger value, drop it, or use lognormal");
  }
}

double DelayDistribution::quantile(double u, CallSize at) const {
  using F = DelaySpec::Family;
  u = std::clamp(u, 0.0, 1.0);
  switch (spec_.family) {
    case F::kNone:
      return 0.0;
    case F::kConst:
      return value_;
    case F::kExp:
      return -std::log1p(-u) / rate_;
    case F::kLognormal:
      return c_ + std::exp(a_ + b_ * normalQuantile(u));
    case F::kPareto:
      return c_ + std::exp(a_ + b_ * -std::log1p(-u));
    case F::kTrace: {
      const auto& v = trace_;
      if (v.size() == 1)
        return v[0];
      const double pos = u * static_cast<double>(v.size() - 1);
      const size_t i = std::min(static_cast<size_t>(pos), v.size() - 2);
      const double frac = pos - static_cast<double>(i);
      return v[i] + frac * (v[i + 1] - v[i]);
    }
    case F::kProfile:
      return profile_->quantile(u, at.op, at.bytes);
  }
  return 0.0;
}

double DelayDistribution::cdf(double x) const {
  using F = DelaySpec::Family;
  if (std::isnan(x))
    return std::numeric_limits<double>::quiet_NaN();
  switch (spec_.family) {
    case F::kNone:
      return x >= 0.0 ? 1.0 : 0.0;
    case F::kConst:
      return x >= value_ ? 1.0 : 0.0;
    case F::kExp:
      return x <= 0.0 ? 0.0 : -std::expm1(-rate_ * x);
    case F::kLognormal:
      return x <= c_ ? 0.0 : normalCdf((std::log(x - c_) - a_) / b_);
    case F::kPareto: {
      if (x <= c_)
        return 0.0;
      const double t = (std::log(x - c_) - a_) / b_;
      return t <= 0.0 ? 0.0 : -std::expm1(-t);
    }
    case F::kTrace: {
      const auto& v = trace_;
      if (x < v.front())
        return 0.0;
      if (x >= v.back())
        return 1.0;
      // v.front() <= x < v.back(), so n >= 2 and 1 <= idx <= n - 1.
      const size_t idx = std::upper_bound(v.begin(), v.end(), x) - v.begin();
      const size_t i = idx - 1;
      const double frac = (x - v[i]) / (v[i + 1] - v[i]);
      return (static_cast<double>(i) + frac) / static_cast<double>(v.size() - 1);
    }
    case F::kProfile: {
      // Every call pooled: the quantile function inverted by bisection (it is monotone).
      if (x < quantile(0.0))
        return 0.0;
      if (x >= quantile(1.0))
        return 1.0;
      double lo = 0.0, hi = 1.0;
      for (int i = 0; i < 60; ++i) {
        const double mid = 0.5 * (lo + hi);
        (quantile(mid) <= x ? lo : hi) = mid;
      }
      return lo;
    }
  }
  return 0.0;
}

double DelayDistribution::mean() const {
  using F = DelaySpec::Family;
  switch (spec_.family) {
    case F::kNone:
      return 0.0;
    case F::kConst:
      return value_;
    case F::kExp:
      return 1.0 / rate_;
    case F::kLognormal:
      return c_ + std::exp(a_ + b_ * b_ / 2);
    case F::kPareto: {
      const double shape = 1.0 / b_;
      return shape > 1.0 ? c_ + std::exp(a_) * shape / (shape - 1.0) : std::numeric_limits<double>::infinity();
    }
    case F::kTrace: {
      const auto& v = trace_;
      if (v.size() == 1)
        return v[0];
      double s = 0.0;  // the mean of the piecewise-linear quantile function: trapezoids
      for (size_t i = 0; i + 1 < v.size(); ++i)
        s += 0.5 * (v[i] + v[i + 1]);
      return s / static_cast<double>(v.size() - 1);
    }
    case F::kProfile:
      return profile_->mean();
  }
  return 0.0;
}

std::vector<std::pair<std::string, double>> DelayDistribution::parameters() const {
  using F = DelaySpec::Family;
  switch (spec_.family) {
    case F::kNone:
      return {};
    case F::kConst:
      return {{"value_s", value_}};
    case F::kExp:
      return {{"rate_per_s", rate_}, {"mean_s", 1.0 / rate_}};
    case F::kLognormal:
      return {{"mu", a_}, {"sigma", b_}, {"shift_s", c_}};
    case F::kPareto:
      return {{"scale_s", std::exp(a_)}, {"shape", 1.0 / b_}, {"shift_s", c_}, {"location_s", c_ + std::exp(a_)}};
    case F::kTrace: {
      const auto& v = trace_;
      return {{"n", static_cast<double>(v.size())}, {"min_s", v.front()}, {"max_s", v.back()}};
    }
    case F::kProfile: {
      const auto& p = *profile_;
      return {{"ops", static_cast<double>(p.ops())},
              {"size_classes", static_cast<double>(p.classes())},
              {"calls", static_cast<double>(p.calls())}};
    }
  }
  return {};
}

}  // namespace delaycomm
