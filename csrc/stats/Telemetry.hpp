#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "stats/Histogram.hpp"

namespace delaycomm {

// A group's telemetry as delaycomm.stats() reports it (docs/telemetry.md): plain values, read from the group's
// counters and histograms at one moment, in the units of the report. The bindings turn it into the dict, one
// field per key, in this order; nothing here is computed there.

// The quantiles a histogram summary reports, with their key names.
struct SummaryQuantile {
  double q;
  const char* name;
};
inline constexpr std::array<SummaryQuantile, 4> kSummaryQuantiles{
    {{0.5, "p50"}, {0.9, "p90"}, {0.99, "p99"}, {0.999, "p999"}}};

// The unit a summary reports in: `scale` converts the histogram's values into it, `suffix` ends its keys.
struct ReportUnit {
  double scale;
  const char* suffix;
};
inline constexpr ReportUnit kMicrosecondsFromNs{1e-3, "_us"};
inline constexpr ReportUnit kMillisecondsFromNs{1e-6, "_ms"};
inline constexpr ReportUnit kUnitless{1.0, ""};

// count, mean, min, the kSummaryQuantiles, max (keys: "count", "mean" + suffix, ...).
struct HistogramSummary {
  const char* suffix = "";
  uint64_t count = 0;
  double mean = 0.0;
  double min = 0.0;
  std::array<double, kSummaryQuantiles.size()> quantiles{};
  double max = 0.0;
};
HistogramSummary summarize(const LogHistogram::Snapshot& s, ReportUnit unit);
HistogramSummary summarize(const LogHistogram& h, ReportUnit unit);

// A whole histogram in nanoseconds, its empty buckets left out (what a profile is built from, docs/profile.md).
struct HistogramRecord {
  uint64_t count = 0;
  uint64_t zeros = 0;
  double sumNs = 0.0;
  double minNs = 0.0;
  double maxNs = 0.0;
  std::vector<std::pair<int, uint64_t>> buckets;  // (bucket index, count) of the buckets that counted
};

// The latency callers experienced in one size class that recorded a call (docs/profile.md, "What is recorded").
struct SizeClassTelemetry {
  uint64_t bytes = 0;  // the class's smallest size
  uint64_t calls = 0;
  HistogramSummary latency;  // us
  HistogramRecord histogram;
  // delay_mode=match: the calls of this class this rank carried with nothing added (its own latency already
  // reached the target) or before its estimate was calibrated (docs/delay.md, "Match mode").
  uint64_t matchNothingAdded = 0;
  uint64_t matchUncalibrated = 0;
  // The calls of this class the rank issued (failed ones included) and the sum of their bytes.
  uint64_t sizedCalls = 0;
  double bytesSum = 0.0;
};

// One op of the op table that was called at least once.
struct OpTelemetry {
  const char* name = "";
  uint64_t calls = 0;
  uint64_t bytes = 0;
  uint64_t errors = 0;
  uint64_t delayedCalls = 0;
  uint64_t untimed = 0;
  uint64_t staleCalls = 0;
  uint64_t keptFreshCalls = 0;
  HistogramSummary latency;  // us
  HistogramSummary delay;    // us
  std::vector<SizeClassTelemetry> bySize;
  // delay_mode=match (docs/delay.md, "Match mode"); zeros under delay_mode=add.
  uint64_t matchCalls = 0;
  uint64_t matchNothingAdded = 0;
  uint64_t matchUncalibrated = 0;
};

// The opt-in update statistics of the staleness engine (stats/UpdateStats.hpp): sums over this rank's engine steps.
struct UpdateTelemetry {
  bool enabled = false;
  uint64_t steps = 0;
  double freshSq = 0.0;      // sum of ||b||^2, b = the BSP contribution
  double sentSq = 0.0;       // sum of ||c||^2, c = the contribution sent
  double deviationSq = 0.0;  // sum of ||c - b||^2
  double scaleSum = 0.0;     // sum of ||c|| / ||b|| over the steps with b != 0
  uint64_t scaleSteps = 0;
};

// The staleness counters (docs/staleness.md). The engine's own values (from stepMs on) are filled by the engine
// (StalenessEngine::telemetry); with the engine off they stay zeros and stepSource "off".
struct StalenessTelemetry {
  uint64_t steps = 0;
  uint64_t fresh = 0;
  uint64_t stale = 0;
  uint64_t dropped = 0;
  double blockedMs = 0.0;
  double staleFreshRatio = 0.0;  // stale / fresh; 0 before any fresh arrival
  HistogramSummary staleness;    // steps
  double staleFreshRatioWindowed = 0.0;
  int64_t pendingHere = 0;
  int64_t keys = 0;
  double stepMs = 0.0;
  std::string stepSource = "off";  // "step_ms", "calibrated", "calibrating" or "off"
  std::string stepKey;
  int64_t stepIntervals = 0;
  uint64_t stepCall = 0;
  UpdateTelemetry update;
};

// The compute slowdown's blocking of the caller (slowdown=R:Kx).
struct SlowdownTelemetry {
  uint64_t calls = 0;
  HistogramSummary blocked;  // ms
};

struct GroupTelemetry {
  std::vector<OpTelemetry> ops;  // in op-table order
  StalenessTelemetry staleness;
  SlowdownTelemetry slowdown;
};

}  // namespace delaycomm
