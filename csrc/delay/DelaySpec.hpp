#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace delaycomm {

// A parsed delay distribution spec (SPEC §3, §4). Grammar (family names are case-insensitive; durations need a
// unit: ns, us, ms, s):
//
//   none
//   const:DURATION                          every delayed call waits exactly DURATION
//   exp:mean=DURATION | exp:pQ=DURATION     exponential; by its mean or by one percentile (p99=400ms: P99 is 400 ms)
//   lognormal:pQ1=D1,pQ2=D2[,pQ3=D3]        through two percentiles; a third pins the tail (shifted lognormal)
//   pareto:pQ1=D1,pQ2=D2[,pQ3=D3]           Pareto I through two percentiles; a third: generalised Pareto
//   trace:FILE                              empirical latencies, one per line with a unit (see parseTraceFile)
//
// A percentile key pQ names the quantile by its digits after the decimal point (p50 = 0.5, p99 = 0.99,
// p999 = 0.999, p05 = 0.05) or, with a dot, in percent (p99.9 = 0.999, p37.5 = 0.375).
//
// Errors: std::invalid_argument whose message names the spec, says what is wrong and what is accepted
// (pybind11 turns it into ValueError).
struct DelaySpec {
  enum class Family { kNone, kConst, kExp, kLognormal, kPareto, kTrace };

  struct Percentile {
    double q;        // in (0, 1)
    double seconds;  // the requested value
  };

  Family family = Family::kNone;
  std::string text;                     // the spec as given
  double constSeconds = 0.0;            // kConst
  double expMeanSeconds = 0.0;          // kExp given by its mean (0 when given by a percentile)
  std::vector<Percentile> percentiles;  // kExp/kLognormal/kPareto, sorted by q
  std::string tracePath;                // kTrace
  std::shared_ptr<const std::vector<double>> trace;  // kTrace: sorted latencies in seconds

  bool isNone() const { return family == Family::kNone; }
};

// The list of accepted forms, for error messages.
extern const char* const kAcceptedDelaySpecs;

DelaySpec parseDelaySpec(std::string_view text);

// A duration with its unit ("12.5ms", "800us", "2s", "100ns") in seconds. `what` names the thing parsed in the
// error message. Rejects negative, non-finite and unit-less values.
double parseDuration(std::string_view text, const std::string& what);

// Loads a trace file: one latency per line with a unit; blank lines and lines starting with '#' are ignored;
// at least one latency. Errors name the file and the line. Returns the latencies sorted, in seconds.
std::vector<double> parseTraceFile(const std::string& path);

const char* familyName(DelaySpec::Family f);

}  // namespace delaycomm
