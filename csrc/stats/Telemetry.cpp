#include "stats/Telemetry.hpp"

#include "stats/OpStats.hpp"

namespace delaycomm {

HistogramSummary summarize(const LogHistogram::Snapshot& s, ReportUnit unit) {
  HistogramSummary out;
  out.suffix = unit.suffix;
  out.count = s.count;
  out.mean = s.mean() * unit.scale;
  out.min = s.min * unit.scale;
  for (size_t i = 0; i < kSummaryQuantiles.size(); ++i) {
    out.quantiles[i] = s.quantile(kSummaryQuantiles[i].q) * unit.scale;
  }
  out.max = s.max * unit.scale;
  return out;
}

HistogramSummary summarize(const LogHistogram& h, ReportUnit unit) {
  return summarize(h.snapshot(), unit);
}

namespace {

HistogramRecord recordOf(const LogHistogram::Snapshot& s) {
  HistogramRecord r;
  r.count = s.count;
  r.zeros = s.zeros;
  r.sumNs = s.sum;
  r.minNs = s.min;
  r.maxNs = s.max;
  for (int i = 0; i < LogHistogram::kBuckets; ++i) {
    if (const uint64_t n = s.buckets[static_cast<size_t>(i)]; n != 0) {
      r.buckets.emplace_back(i, n);
    }
  }
  return r;
}

std::vector<SizeClassTelemetry> bySizeOf(const SizeHistograms& classes, const OpStats& op) {
  std::vector<SizeClassTelemetry> out;
  for (int c = 0; c < kSizeClasses; ++c) {
    const LogHistogram* h = classes.find(c);
    if (h == nullptr) {
      continue;
    }
    const auto s = h->snapshot();
    if (s.count == 0) {
      continue;
    }
    out.push_back({sizeClassBytes(c), s.count, summarize(s, kMicrosecondsFromNs), recordOf(s),
                   op.matchNothingAddedBySize[static_cast<size_t>(c)].load(),
                   op.matchUncalibratedBySize[static_cast<size_t>(c)].load(),
                   op.sizedCallsBySize[static_cast<size_t>(c)].load(),
                   op.bytesSumBySize[static_cast<size_t>(c)].load()});
  }
  return out;
}

OpTelemetry opTelemetry(const char* name, uint64_t calls, const OpStats& s) {
  OpTelemetry t;
  t.name = name;
  t.calls = calls;
  t.bytes = s.bytes.load();
  t.errors = s.errors.load();
  t.delayedCalls = s.delayedCalls.load();
  t.untimed = s.untimed.load();
  t.staleCalls = s.staleCalls.load();
  t.keptFreshCalls = s.keptFreshCalls.load();
  t.latency = summarize(s.latencyNs, kMicrosecondsFromNs);
  t.delay = summarize(s.delayNs, kMicrosecondsFromNs);
  t.bySize = bySizeOf(s.callNsBySize, s);
  t.matchCalls = s.matchCalls.load();
  t.matchNothingAdded = s.matchNothingAdded.load();
  t.matchUncalibrated = s.matchUncalibrated.load();
  return t;
}

}  // namespace

GroupTelemetry GroupStats::telemetry() const {
  GroupTelemetry t;
  for (const auto& row : opTable()) {
    const auto& s = op(row.kind);
    const uint64_t calls = s.calls.load();
    if (calls == 0) {
      continue;  // never called: left out
    }
    t.ops.push_back(opTelemetry(row.name, calls, s));
  }
  auto& st = t.staleness;
  st.steps = staleness_.steps.load();
  st.fresh = staleness_.fresh.load();
  st.stale = staleness_.stale.load();
  st.dropped = staleness_.dropped.load();
  st.blockedMs = static_cast<double>(staleness_.blockedNs.load()) * 1e-6;
  st.staleFreshRatio = st.fresh ? static_cast<double>(st.stale) / static_cast<double>(st.fresh) : 0.0;
  st.staleness = summarize(staleness_.stalenessSteps, kUnitless);
  if (updates_) {
    updates_->fill(st.update);
  }
  t.slowdown.calls = host_.slowdownCalls.load();
  t.slowdown.blocked = summarize(host_.slowdownNs, kMillisecondsFromNs);
  return t;
}

}  // namespace delaycomm
