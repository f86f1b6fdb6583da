#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace delaycomm {

class DelayProfile;

// A parsed delay distribution spec (docs/delay.md). Grammar (family names are case-insensitive; durations need a
// unit: ns, us, ms, s):
//
//   none
//   const:DURATION                          every delayed call waits exactly DURATION
//   exp:mean=DURATION | exp:pQ=DURATION     exponential; by its mean or by one percentile (p99=400ms: P99 is 400 ms)
//   lognormal:pQ1=D1,pQ2=D2[,pQ3=D3]        through two percentiles; a third pins the tail (shifted lognormal)
//   pareto:pQ1=D1,pQ2=D2[,pQ3=D3]           Pareto I through two percentiles; a third: generalised Pareto
//   trace:FILE                              empirical latencies, one per line with a unit (see parseTraceFile)
//   profile:FILE                            per op and size class, a profile's distribution (delay/Profile.hpp)
//
// A percentile key pQ names the quantile by its digits after the decimal point (p50 = 0.5, p99 = 0.99,
// p999 = 0.999, p05 = 0.05) or, with a dot, in percent (p99.9 = 0.999, p37.5 = 0.375).
//
// Bounds: every duration (a spec's values, a trace file's latencies) is 0 or in [kMinDelaySeconds,
// kMaxDelaySeconds]: 1 ns is the resolution of a delay, and 24 h is far beyond any group timeout while keeping
// every derived number (nanoseconds in int64, a Pareto's solved parameters) finite. A trace file is a regular file
// of at most kMaxTraceBytes.
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
  std::string text;                                  // the spec as given
  double constSeconds = 0.0;                         // kConst
  double expMeanSeconds = 0.0;                       // kExp given by its mean (0 when given by a percentile)
  std::vector<Percentile> percentiles;               // kExp/kLognormal/kPareto, sorted by q
  std::string tracePath;                             // kTrace
  std::shared_ptr<const std::vector<double>> trace;  // kTrace: sorted latencies in seconds
  uint64_t traceDigest = 0;  // kTrace: FNV-1a of the sorted latencies (compares files by content, not by path)
  std::string profilePath;   // kProfile
  std::shared_ptr<const DelayProfile> profile;  // kProfile: loaded and validated (its digest is its content)

  bool isNone() const { return family == Family::kNone; }
};

// The list of accepted forms, for error messages.
extern const char* const kAcceptedDelaySpecs;

inline constexpr double kMinDelaySeconds = 1e-9;            // the shortest nonzero duration (1 ns)
inline constexpr double kMaxDelaySeconds = 86400.0;         // the longest duration (24 h)
inline constexpr size_t kMaxTraceBytes = size_t{64} << 20;  // the largest trace file (64 MiB)

// "delaycomm: invalid delay spec 'TEXT': WHY" (TEXT quoted and escaped), the one form of every spec error.
std::invalid_argument invalidDelaySpec(std::string_view text, const std::string& why);

DelaySpec parseDelaySpec(std::string_view text);

// A duration with its unit ("12.5ms", "800us", "2s", "100ns") in seconds. `what` names the thing parsed in the
// error message. Rejects negative, non-finite and unit-less values, and values outside 0 or [1 ns, 24 h].
double parseDuration(std::string_view text, const std::string& what);

// Loads a trace file: one latency per line with a unit; blank lines and lines starting with '#' are ignored;
// at least one latency. Only a regular file of at most kMaxTraceBytes is read (a FIFO or a device is refused
// without blocking or reading it). Errors name the file, the first bad line by number and what is wrong with it
// ("delaycomm: trace file 'PATH' line N: ..."). Returns the latencies sorted, in seconds.
std::vector<double> parseTraceFile(const std::string& path);

// Reads the regular file at `path` (at most kMaxTraceBytes) into *data; returns "" or why it cannot ("NAME
// cannot be opened: ..."). The file is opened non-blocking (a FIFO without a writer would block open()) and
// checked with fstat before anything is read; at most kMaxTraceBytes + 1 bytes are read, so a file that grows is
// refused too.
std::string readSmallFile(const std::string& name, const std::string& path, std::string* data);

// FNV-1a over the bit patterns of `sorted` (the digest stored in DelaySpec::traceDigest).
uint64_t traceDigest(const std::vector<double>& sorted);

// User text made printable for a message: quoted, quotes and control characters escaped, bytes that are not
// UTF-8 escaped as \xNN (so the message stays valid UTF-8), shortened after 80 characters.
std::string quoted(std::string_view s);

const char* familyName(DelaySpec::Family f);

}  // namespace delaycomm
