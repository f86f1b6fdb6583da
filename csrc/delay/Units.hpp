#pragma once

#include <cstdint>
#include <string>

namespace delaycomm {

// The one set of formatters of durations and percentiles for delaycomm's messages and the specs it writes
// (fit()). Each writes what the delay-spec grammar reads back (delay/DelaySpec.hpp).

// A percentile key that names quantile q (0 < q < 1): in percent, with up to 10 decimals ("p50", "p99.9",
// "p37.5"), and "p05" rather than "p5" below 10 percent (the grammar reads p5 as 0.5).
std::string percentileKey(double q);

// Seconds with a unit: s from 1 s, ms from 1 ms, us below; `digits` significant digits ("745.762ms", "2s").
std::string secondsText(double seconds, int digits = 6);

// Milliseconds in a nanosecond count, without a unit, for messages that say "ms" after it: 3 significant digits
// below 1 s, 6 from 1 s, never in exponent form ("0.5", "12.3", "30000").
std::string msText(int64_t ns);

}  // namespace delaycomm
