#pragma once

#include <string>
#include <vector>

#include "delay/DelaySpec.hpp"

namespace delaycomm {

// Fits a delay spec to *overall* latency percentiles, when only `fraction` of the calls are delayed (docs/delay.md,
// "fit(): the mixture").
//
// The added latency of a call is 0 with probability 1 - f and D ~ G (the spec) with probability f, so its CDF is
// F(x) = (1 - f) + f G(x) for x >= 0 and its overall quantile q is G^-1(1 - (1 - q) / f) when q > 1 - f, else 0.
// Each overall target (q, x) therefore becomes the component percentile (1 - (1 - q) / f, x), which the family is
// solved through. A target of 0 is met by the undelayed calls when q <= 1 - f.
//
// Targets with x == 0 are skipped when q <= 1 - f. One remaining target: exp; two: `family` (lognormal by default);
// three: a shifted lognormal, or a generalised Pareto when the lognormal cannot reach the tail ("auto").
//
// Errors: std::invalid_argument saying why no spec can meet the targets.
struct FitTarget {
  double q;
  double seconds;
};

struct FitResult {
  std::string spec;  // e.g. "lognormal:p37.5=60ms,p98.75=400ms"
  std::string family;
  double fraction = 0.0;
  std::vector<FitTarget> component;  // the component percentiles the spec goes through
  std::vector<FitTarget> achieved;   // the overall percentiles of the mixture, computed back from the spec
};

// family: "auto", "exp", "lognormal" or "pareto".
FitResult fitMixture(const std::vector<FitTarget>& targets, double fraction, const std::string& family);

}  // namespace delaycomm
