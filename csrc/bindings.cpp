// The one pybind11 module of delaycomm: delaycomm._C. Private; the public API is delaycomm/__init__.py.
//
// NOTE: built with torch's bundled pybind11 headers, so that c10d Store/Backend objects created by torch cross
// into this module (the holder type of c10d classes is c10::intrusive_ptr, declared by torch/csrc/utils/pybind.h).

#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "backend/DelayBackend.hpp"
#include "kernels/Blend.hpp"
#include "stats/Histogram.hpp"
#include "stats/OpStats.hpp"

namespace py = pybind11;
using namespace delaycomm;

namespace {

const double kPercentiles[] = {0.5, 0.9, 0.99, 0.999};
const char* kPercentileNames[] = {"p50", "p90", "p99", "p999"};

// A histogram summary: count, mean, min, p50, p90, p99, p999, max, scaled by `scale` and suffixed by `unit`
// (e.g. ns -> us: scale 1e-3, unit "_us").
py::dict summarize(const LogHistogram& h, double scale, const char* unit) {
  const auto s = h.snapshot();
  py::dict d;
  d["count"] = s.count;
  d[py::str(std::string("mean") + unit)] = s.mean() * scale;
  d[py::str(std::string("min") + unit)] = s.min * scale;
  for (int i = 0; i < 4; ++i) {
    d[py::str(std::string(kPercentileNames[i]) + unit)] = s.quantile(kPercentiles[i]) * scale;
  }
  d[py::str(std::string("max") + unit)] = s.max * scale;
  return d;
}

py::dict groupStatsToDict(GroupStats& g) {
  py::dict ops;
  for (int i = 0; i < kNumOpKinds; ++i) {
    const auto kind = static_cast<OpKind>(i);
    const auto& s = g.op(kind);
    const uint64_t calls = s.calls.load();
    if (calls == 0) {
      continue;
    }
    py::dict d;
    d["calls"] = calls;
    d["bytes"] = s.bytes.load();
    d["errors"] = s.errors.load();
    d["delayed_calls"] = s.delayedCalls.load();
    d["untimed"] = s.untimed.load();
    d["latency"] = summarize(s.latencyNs, 1e-3, "_us");
    d["delay"] = summarize(s.delayNs, 1e-3, "_us");
    ops[opName(kind)] = d;
  }
  const auto& st = g.staleness();
  py::dict stale;
  const uint64_t fresh = st.fresh.load();
  const uint64_t nstale = st.stale.load();
  stale["steps"] = st.steps.load();
  stale["fresh"] = fresh;
  stale["stale"] = nstale;
  stale["dropped"] = st.dropped.load();
  stale["blocked_ms"] = static_cast<double>(st.blockedNs.load()) * 1e-6;
  stale["stale_fresh_ratio"] = fresh ? static_cast<double>(nstale) / static_cast<double>(fresh) : 0.0;
  stale["staleness"] = summarize(st.stalenessSteps, 1.0, "");
  py::dict out;
  out["ops"] = ops;
  out["staleness"] = stale;
  return out;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "delaycomm native core (private: use the delaycomm package)";

  // The c10d base classes must be registered (by importing torch.distributed) before ours derive from them.
  py::module_::import("torch.distributed");

  m.attr("cuda_compiled") = py::bool_(
#ifdef DELAYCOMM_WITH_CUDA
      true
#else
      false
#endif
  );

  py::class_<BackendOptions>(m, "BackendOptions")
      .def(py::init<>())
      .def_readwrite("timeout", &BackendOptions::timeout)
      .def_readwrite("group_name", &BackendOptions::groupName)
      .def_readwrite("time_cuda", &BackendOptions::timeCuda);

  py::class_<DelayBackend, c10::intrusive_ptr<DelayBackend>, c10d::Backend>(m, "DelayBackend")
      .def(py::init([](int rank, int size, c10::intrusive_ptr<c10d::Backend> cpuInner,
                       c10::intrusive_ptr<c10d::Backend> cudaInner, const BackendOptions& options) {
             return c10::make_intrusive<DelayBackend>(rank, size, std::move(cpuInner), std::move(cudaInner),
                                                      options);
           }),
           py::arg("rank"), py::arg("size"), py::arg("cpu_inner"), py::arg("cuda_inner"), py::arg("options"),
           py::call_guard<py::gil_scoped_release>())
      .def(
          "stats",
          [](DelayBackend& self) {
            {
              py::gil_scoped_release release;
              self.harvestCudaTimings();
            }
            return groupStatsToDict(self.stats());
          },
          "Telemetry of this group as a dict (see delaycomm.stats).")
      .def("reset_stats", &DelayBackend::resetStats, py::call_guard<py::gil_scoped_release>())
      .def(
          "_set_shutdown_hook",
          [](DelayBackend& self, py::function fn) {
            // The py::function must be destroyed with the GIL held, whichever thread drops the last copy.
            auto holder = std::shared_ptr<py::function>(new py::function(std::move(fn)), [](py::function* f) {
              if (Py_IsInitialized()) {
                py::gil_scoped_acquire gil;
                delete f;
              }
            });
            self.setShutdownHook([holder] {
              py::gil_scoped_acquire gil;
              (*holder)();
            });
          },
          py::arg("fn"))
      .def(
          "inner",
          [](DelayBackend& self, const std::string& device) {
            const auto type = c10::Device(device).type();
            return self.innerBackend(type);
          },
          py::arg("device"), "The inner backend that serves `device` ('cpu' or 'cuda'), or None.");

  py::class_<LogHistogram, std::shared_ptr<LogHistogram>>(m, "_LogHistogram",
                                                          "The telemetry histogram (exposed for tests).")
      .def(py::init<>())
      .def("record", &LogHistogram::record, py::arg("value"))
      .def("quantile", [](const LogHistogram& h, double q) { return h.snapshot().quantile(q); }, py::arg("q"))
      .def("summary", [](const LogHistogram& h) { return summarize(h, 1.0, ""); })
      .def("reset", &LogHistogram::reset);

  // ---- kernels: the fused pack/blend kernel of the staleness engine (csrc/kernels/Blend.hpp) ------------------
  m.def(
      "_fused_blend",
      [](at::Tensor grad, double freshScale, const std::vector<at::Tensor>& stale,
         const std::vector<double>& staleScales, const std::optional<at::Tensor>& stash) {
        kernels::fusedBlend(grad, freshScale, stale, staleScales, stash);
      },
      py::arg("grad"), py::arg("fresh_scale"), py::arg("stale"), py::arg("stale_scales"),
      // NOTE: keeps the GIL (no gil_scoped_release): this is a test and benchmark entry point, and on the H200
      // machine (torch 2.11, Python 3.12, GCC 13) the first bad-input test segfaulted while raising under a
      // released GIL (cause not established; not reproduced with torch 2.13 or 2.14 here). The staleness engine
      // calls fusedBlend from C++.
      py::arg("stash") = py::none(),
      "In place: stash = grad (if given), then grad = fresh_scale * grad + sum_i stale_scales[i] * stale[i], in one "
      "pass (see csrc/kernels/Blend.hpp). For tests and benchmarks; the staleness engine calls it from C++.");
  m.def("_blend_cpu_isa", &kernels::detail::blendCpuIsa, "The CPU blend loops' instruction set: 'avx2' or 'baseline'.");
  m.def("_set_blend_cpu_isa", &kernels::detail::setBlendCpuIsa, py::arg("isa"),
        "Force the CPU blend loops' instruction set: 'auto', 'baseline' or 'avx2' (tests and benchmarks).");
  // ---- end kernels ------------------------------------------------------------------------------------------------
}
