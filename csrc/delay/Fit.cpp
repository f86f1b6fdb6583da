#include "delay/Fit.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "delay/Sampler.hpp"
#include "delay/Units.hpp"

namespace delaycomm {

namespace {

// The spec's values keep 15 significant digits: parsed back, they are the component's to the last digit or two.
constexpr int kSpecDigits = 15;

[[noreturn]] void cannot(const std::string& why) {
  throw std::invalid_argument("delaycomm.fit: cannot meet the targets: " + why);
}

std::string specText(const std::string& family, const std::vector<FitTarget>& comp) {
  std::string s = family + ":";
  for (size_t i = 0; i < comp.size(); ++i) {
    if (i > 0)
      s += ',';
    s += percentileKey(comp[i].q) + "=" + secondsText(comp[i].seconds, kSpecDigits);
  }
  return s;
}

}  // namespace

FitResult fitMixture(const std::vector<FitTarget>& targetsIn, double f, const std::string& family) {
  if (!(f > 0.0 && f <= 1.0)) {
    cannot("fraction must be in (0, 1], got " + std::to_string(f));
  }
  if (family != "auto" && family != "exp" && family != "lognormal" && family != "pareto") {
    throw std::invalid_argument("delaycomm.fit: family must be one of 'auto', 'exp', 'lognormal', 'pareto', got '" +
                                family + "'");
  }
  std::vector<FitTarget> targets = targetsIn;
  std::sort(targets.begin(), targets.end(), [](const auto& a, const auto& b) { return a.q < b.q; });
  std::vector<FitTarget> comp;
  for (size_t i = 0; i < targets.size(); ++i) {
    const auto& t = targets[i];
    if (!(t.q > 0.0 && t.q < 1.0) || !(t.seconds >= 0.0) || !std::isfinite(t.seconds)) {
      cannot(percentileKey(t.q) + "=" + std::to_string(t.seconds) +
             "s is not a percentile in (0, 100) with a finite value >= 0");
    }
    if (i > 0 && !(t.seconds > targets[i - 1].seconds)) {
      cannot(percentileKey(t.q) + " must be greater than " + percentileKey(targets[i - 1].q));
    }
    const double undelayed = 1.0 - f;
    if (t.q <= undelayed) {
      if (t.seconds == 0.0)
        continue;
      char buf[320];
      std::snprintf(buf, sizeof(buf),
                    "with fraction=%g, %.4g%% of the calls are not delayed, so the overall %s is the undelayed "
                    "latency (0 added), not %s; %s > 0 needs fraction > %g (or leave %s out)",
                    f, undelayed * 100.0, percentileKey(t.q).c_str(), secondsText(t.seconds).c_str(),
                    percentileKey(t.q).c_str(), 1.0 - t.q, percentileKey(t.q).c_str());
      cannot(buf);
    }
    if (t.seconds == 0.0) {
      cannot("an overall " + percentileKey(t.q) + " of 0 needs fraction <= " + std::to_string(1.0 - t.q));
    }
    comp.push_back({1.0 - (1.0 - t.q) / f, t.seconds});
  }
  if (comp.empty())
    cannot("no target above 0 is left to fit (give p99, or p50 with fraction > 0.5)");

  std::vector<std::string> families;
  if (comp.size() == 1) {
    if (family != "auto" && family != "exp") {
      cannot(family + " needs two percentiles above the undelayed share; only " + percentileKey(targets.back().q) +
             " is (use family='exp', or give another percentile)");
    }
    families = {"exp"};
  } else if (family == "exp") {
    cannot("exp has one parameter; it cannot meet " + std::to_string(comp.size()) + " percentiles");
  } else if (family == "auto") {
    families =
        comp.size() == 3 ? std::vector<std::string>{"lognormal", "pareto"} : std::vector<std::string>{"lognormal"};
  } else {
    families = {family};
  }
  std::string reasons;
  for (const auto& fam : families) {
    FitResult r;
    r.family = fam;
    r.fraction = f;
    r.component = comp;
    r.spec = specText(fam, comp);
    try {
      DelaySampler sampler(DelayDistribution::parse(r.spec));
      for (const auto& t : targets) {
        const double qc = 1.0 - (1.0 - t.q) / f;
        r.achieved.push_back({t.q, qc > 0.0 ? sampler.quantile(qc) : 0.0});
      }
      return r;
    } catch (const std::invalid_argument& e) {
      reasons += (reasons.empty() ? "" : "; ") + std::string(e.what());
    }
  }
  cannot(reasons);
}

}  // namespace delaycomm
