// Telemetry (stats/Telemetry.hpp): the dict of delaycomm.stats() (docs/telemetry.md), and the histogram itself
// for tests.

#include <memory>
#include <string>

#include <pybind11/stl.h>

#include "bindings/Bindings.hpp"
#include "ops/OpTable.hpp"
#include "stats/Histogram.hpp"
#include "stats/Trace.hpp"

namespace delaycomm::bindings {

namespace {

py::dict summaryDict(const HistogramSummary& s) {
  const std::string unit = s.suffix;
  py::dict d;
  d["count"] = s.count;
  d[py::str("mean" + unit)] = s.mean;
  d[py::str("min" + unit)] = s.min;
  for (size_t i = 0; i < kSummaryQuantiles.size(); ++i) {
    d[py::str(kSummaryQuantiles[i].name + unit)] = s.quantiles[i];
  }
  d[py::str("max" + unit)] = s.max;
  return d;
}

py::dict histogramDict(const HistogramRecord& h) {
  py::list buckets;
  for (const auto& [index, count] : h.buckets) {
    buckets.append(py::make_tuple(index, count));
  }
  py::dict d;
  d["base"] = LogHistogram::kBase;
  d["unit"] = "ns";
  d["count"] = h.count;
  d["zeros"] = h.zeros;
  d["sum_ns"] = h.sumNs;
  d["min_ns"] = h.minNs;
  d["max_ns"] = h.maxNs;
  d["buckets"] = buckets;
  return d;
}

py::dict opDict(const OpTelemetry& op) {
  py::dict d;
  d["calls"] = op.calls;
  d["bytes"] = op.bytes;
  d["errors"] = op.errors;
  d["delayed_calls"] = op.delayedCalls;
  d["untimed"] = op.untimed;
  d["stale_calls"] = op.staleCalls;
  d["kept_fresh_calls"] = op.keptFreshCalls;
  d["latency"] = summaryDict(op.latency);
  d["delay"] = summaryDict(op.delay);
  py::list bySize;
  for (const auto& c : op.bySize) {
    py::dict size;
    size["bytes"] = c.bytes;
    size["calls"] = c.calls;
    size["latency"] = summaryDict(c.latency);
    size["histogram"] = histogramDict(c.histogram);
    py::dict sizeMatch;
    sizeMatch["nothing_added"] = c.matchNothingAdded;
    sizeMatch["uncalibrated"] = c.matchUncalibrated;
    size["match"] = sizeMatch;
    py::dict sizes;  // the calls issued in the class and their bytes: the class's size in a profile (docs/profile.md)
    sizes["calls"] = c.sizedCalls;
    sizes["sum_bytes"] = c.bytesSum;
    size["sizes"] = sizes;
    bySize.append(size);
  }
  d["by_size"] = bySize;
  py::dict match;
  match["calls"] = op.matchCalls;
  match["nothing_added"] = op.matchNothingAdded;
  match["uncalibrated"] = op.matchUncalibrated;
  d["match"] = match;
  return d;
}

py::dict stalenessDict(const StalenessTelemetry& st) {
  py::dict d;
  d["steps"] = st.steps;
  d["fresh"] = st.fresh;
  d["stale"] = st.stale;
  d["dropped"] = st.dropped;
  d["blocked_ms"] = st.blockedMs;
  d["stale_fresh_ratio"] = st.staleFreshRatio;
  d["staleness"] = summaryDict(st.staleness);
  d["stale_fresh_ratio_windowed"] = st.staleFreshRatioWindowed;
  d["pending_here"] = st.pendingHere;
  d["keys"] = st.keys;
  d["step_ms"] = st.stepMs;
  d["step_source"] = st.stepSource;
  d["step_key"] = st.stepKey;
  d["step_intervals"] = st.stepIntervals;
  d["step_call"] = st.stepCall;
  const UpdateTelemetry& u = st.update;
  py::dict update;
  update["enabled"] = u.enabled;
  update["steps"] = u.steps;
  update["fresh_sq"] = u.freshSq;
  update["sent_sq"] = u.sentSq;
  update["deviation_sq"] = u.deviationSq;
  update["deviation"] = u.freshSq > 0.0 ? py::object(py::float_(u.deviationSq / u.freshSq)) : py::object(py::none());
  update["scale"] = u.scaleSteps > 0 ? py::object(py::float_(u.scaleSum / static_cast<double>(u.scaleSteps)))
                                     : py::object(py::none());
  d["update"] = update;
  return d;
}

}  // namespace

py::dict telemetryDict(const GroupTelemetry& t) {
  py::dict ops;
  for (const auto& op : t.ops) {
    ops[op.name] = opDict(op);
  }
  py::dict slowdown;
  slowdown["calls"] = t.slowdown.calls;
  slowdown["blocked"] = summaryDict(t.slowdown.blocked);
  py::dict out;
  out["ops"] = ops;
  out["staleness"] = stalenessDict(t.staleness);
  out["slowdown"] = slowdown;
  return out;
}

// DELAYCOMM_TRACE (stats/Trace.hpp): turn the process's timeline on, read it back (delaycomm/timeline.py).
void bindTrace(py::module_& m) {
  m.def(
      "_trace_enable", [](size_t capacity) { return trace::TraceLog::enable(capacity).capacity(); },
      py::arg("capacity"), "Turn the process's DELAYCOMM_TRACE log on (its capacity in records; returns it).");
  m.def(
      "_trace_records",
      []() {
        py::dict out;
        trace::TraceLog* log = trace::TraceLog::active();
        uint64_t dropped = 0;
        const auto records = log ? log->snapshot(&dropped) : std::vector<trace::TraceRecord>{};
        static constexpr const char* kKinds[] = {"call", "delay", "stale"};
        py::list rows;
        for (const auto& r : records) {
          rows.append(py::make_tuple(kKinds[r.kind], r.name, r.op, r.why, r.startNs, r.durNs, r.seq, r.thread,
                                     py::make_tuple(r.args[0], r.args[1], r.args[2], r.args[3], r.args[4])));
        }
        out["records"] = rows;
        out["dropped"] = dropped;
        out["capacity"] = log ? log->capacity() : 0;
        out["epoch_offset_ns"] = trace::TraceLog::epochOffsetNs();
        return out;
      },
      "The DELAYCOMM_TRACE records kept (oldest first), how many were dropped, and the steady-to-epoch clock offset.");
  // The record a CUDA call leaves (trace::recordCudaCall, as CudaTimings::harvest and TimedWorkCuda make it), for
  // the tests of its shape on a machine without a GPU.
  m.def(
      "_trace_record_cuda_call",
      [](const std::string& op, uint64_t seq, int64_t calledAtNs, int64_t durNs, int64_t bytes, bool timed,
         std::optional<bool> ok) {
        OpKind kind{};
        TORCH_CHECK(opFromName(op, &kind), "delaycomm: _trace_record_cuda_call: unknown op ", op);
        trace::recordCudaCall(opName(kind), seq, calledAtNs, durNs, sizeClassOf(bytes),
                              timed ? trace::kCudaTimed : trace::kCudaUntimed, ok);
      },
      py::arg("op"), py::arg("seq"), py::arg("called_at_ns"), py::arg("dur_ns"), py::arg("bytes"), py::arg("timed"),
      py::arg("ok"), "Record a CUDA call in the DELAYCOMM_TRACE log as the CUDA path does (tests).");
}

void bindStats(py::module_& m) {
  py::class_<LogHistogram, std::shared_ptr<LogHistogram>>(m, "_LogHistogram",
                                                          "The telemetry histogram (exposed for tests).")
      .def(py::init<>())
      .def("record", &LogHistogram::record, py::arg("value"))
      .def(
          "quantile", [](const LogHistogram& h, double q) { return h.snapshot().quantile(q); }, py::arg("q"))
      .def("summary", [](const LogHistogram& h) { return summaryDict(summarize(h, kUnitless)); })
      .def("reset", &LogHistogram::reset);
  bindTrace(m);
}

}  // namespace delaycomm::bindings
