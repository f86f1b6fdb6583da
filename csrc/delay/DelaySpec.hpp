#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace delaycomm {

// What a delay spec's text says (docs/delay.md). Grammar (family names are case-insensitive; durations need a
// unit: ns, us, ms, s):
//
//   none
//   const:DURATION                          every delayed call waits exactly DURATION
//   exp:mean=DURATION | exp:pQ=DURATION     exponential; by its mean or by one percentile (p99=400ms: P99 is 400 ms)
//   lognormal:pQ1=D1,pQ2=D2[,pQ3=D3]        through two percentiles; a third pins the tail (shifted lognormal)
//   pareto:pQ1=D1,pQ2=D2[,pQ3=D3]           Pareto I through two percentiles; a third: generalised Pareto
//   trace:FILE                              empirical latencies, one per line with a unit (docs/delay.md)
//   profile:FILE                            per op and size class, a profile's distribution (delay/Profile.hpp)
//
// The grammar only: no file is read here. A spec that names a file (trace:, profile:) is completed by Python
// (delaycomm/_spec.py reads and checks the file once, with Python's readers) into the one parsed object, a
// DelayDistribution (delay/Distribution.hpp), which is what the sampler, the schedule and the backend get.
//
// A percentile key pQ names the quantile by its digits after the decimal point (p50 = 0.5, p99 = 0.99,
// p999 = 0.999, p05 = 0.05) or, with a dot, in percent (p99.9 = 0.999, p37.5 = 0.375).
//
// Bounds: every duration (a spec's values, a trace file's latencies) is 0 or in [kMinDelaySeconds,
// kMaxDelaySeconds]: 1 ns is the resolution of a delay, and 24 h is far beyond any group timeout while keeping
// every derived number (nanoseconds in int64, a Pareto's solved parameters) finite.
//
// Errors: std::invalid_argument with the message "delaycomm: invalid delay spec 'TEXT': WHY[; expected ...]"
// (invalidDelaySpec); Python's option check keeps the WHY part. pybind11 turns it into ValueError.
struct DelaySpec {
  enum class Family { kNone, kConst, kExp, kLognormal, kPareto, kTrace, kProfile };

  struct Percentile {
    double q;        // in (0, 1)
    double seconds;  // the requested value
  };

  Family family = Family::kNone;
  std::string text;                     // the spec as given
  double constSeconds = 0.0;            // kConst
  double expMeanSeconds = 0.0;          // kExp given by its mean (0 when given by a percentile)
  std::vector<Percentile> percentiles;  // kExp/kLognormal/kPareto, sorted by q
  std::string path;                     // kTrace, kProfile: the file, as the text names it

  bool isNone() const { return family == Family::kNone; }
  bool namesFile() const { return family == Family::kTrace || family == Family::kProfile; }
};

// The list of accepted forms, for error messages.
extern const char* const kAcceptedDelaySpecs;

inline constexpr double kMinDelaySeconds = 1e-9;     // the shortest nonzero duration (1 ns)
inline constexpr double kMaxDelaySeconds = 86400.0;  // the longest duration (24 h)

// "delaycomm: invalid delay spec 'TEXT': WHY" (TEXT quoted and escaped), the one form of every spec error.
std::invalid_argument invalidDelaySpec(std::string_view text, const std::string& why);

DelaySpec parseDelaySpec(std::string_view text);

// A duration with its unit ("12.5ms", "800us", "2s", "100ns") in seconds. `what` names the thing parsed in the
// error message. Rejects negative, non-finite and unit-less values, and values outside 0 or [1 ns, 24 h].
double parseDuration(std::string_view text, const std::string& what);

// The durations of a trace file's latency lines (delaycomm/_readers.py reads the file and hands over the lines that
// hold a latency, trimmed), in seconds, into *out: the duration grammar is this one for specs and traces alike.
// Returns -1, or the index of the first line that is not a duration, with why in *why ("is negative (a delay must
// be >= 0)").
int64_t parseDurations(const std::vector<std::string>& lines, std::vector<double>* out, std::string* why);

const char* familyName(DelaySpec::Family f);

}  // namespace delaycomm
