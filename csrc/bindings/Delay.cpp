// Delay injection (delay/): specs, samplers, schedules, fit, precise sleep.

#include <chrono>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <c10/util/StringUtil.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings/Bindings.hpp"
#include "delay/DelayInjector.hpp"
#include "delay/DelaySpec.hpp"
#include "delay/Fit.hpp"
#include "delay/IssuerThread.hpp"
#include "delay/LocalLatency.hpp"
#include "delay/Sampler.hpp"
#include "delay/Schedule.hpp"
#ifdef DELAYCOMM_WITH_CUDA
#include "delay/GpuDelay.hpp"
#endif

namespace delaycomm::bindings {

uint64_t checkedUnsigned(int64_t v, const char* method, const char* arg) {
  if (v < 0) {
    throw std::invalid_argument(std::string("delaycomm: ") + method + ": " + arg + " must be >= 0, got " +
                                std::to_string(v));
  }
  return static_cast<uint64_t>(v);
}

py::dict samplerDict(const SamplerDescription& s) {
  py::dict d;
  d["spec"] = s.spec;
  d["family"] = s.family;
  py::dict params;
  for (const auto& [k, v] : s.parameters) {
    params[py::str(k)] = v;
  }
  d["parameters"] = params;
  py::dict given;
  for (const auto& p : s.requested) {
    given[py::float_(p.q)] = p.seconds;
  }
  d["requested_percentiles_s"] = given;
  if (!s.source.empty()) {
    d[py::str(s.source + "_path")] = s.sourcePath;
    d[py::str(s.source + "_digest")] = s.sourceDigest;
  }
  if (!s.percentiles.empty()) {
    py::dict q;
    for (const auto& [name, seconds] : s.percentiles) {
      q[py::str(name)] = seconds;
    }
    d["percentiles"] = q;
  }
  d["mean_s"] = s.mean;
  d["seed"] = s.seed;
  d["rank"] = s.rank;
  return d;
}

namespace {

// n consecutive counters of one stream from `start`, as a NumPy array: at(stream, seq) for each, computed without
// the GIL (samplers and schedules are immutable).
template <typename T, typename At>
py::array_t<T> counterRun(int64_t n, int64_t stream, int64_t start, const char* method, At at) {
  const uint64_t count = checkedUnsigned(n, method, "n");
  const uint64_t st = checkedUnsigned(stream, method, "stream");
  const uint64_t first = checkedUnsigned(start, method, "start");
  py::array_t<T> out(static_cast<py::ssize_t>(count));
  T* dst = out.mutable_data();
  {
    py::gil_scoped_release release;
    for (uint64_t i = 0; i < count; ++i) {
      dst[i] = at(st, first + i);
    }
  }
  return out;
}

void bindSampler(py::module_& m) {
  py::class_<DelaySampler>(m, "DelaySampler", "A delay distribution with counter-based, deterministic draws.")
      .def(py::init([](const py::object& spec, int64_t seed, int64_t rank) {
             return DelaySampler(specArgument(spec, "DelaySampler"), checkedUnsigned(seed, "DelaySampler", "seed"),
                                 checkedUnsigned(rank, "DelaySampler", "rank"));
           }),
           py::arg("spec"), py::arg("seed") = 0, py::arg("rank") = 0)
      .def(
          "sample",
          [](const DelaySampler& s, int64_t stream, int64_t seq) {
            return s.sample(checkedUnsigned(stream, "DelaySampler.sample", "stream"),
                            checkedUnsigned(seq, "DelaySampler.sample", "seq"));
          },
          py::arg("stream"), py::arg("seq"))
      .def(
          "sample_many",
          [](const DelaySampler& s, int64_t n, int64_t stream, int64_t start) {
            return counterRun<double>(n, stream, start, "DelaySampler.sample_many",
                                      [&s](uint64_t st, uint64_t seq) { return s.sample(st, seq); });
          },
          py::arg("n"), py::arg("stream") = 0, py::arg("start") = 0)
      .def(
          "quantile",
          [](const DelaySampler& s, py::object q, std::optional<std::string> op, int64_t nbytes) {
            return quantileOf(s.distribution(), std::move(q), op, nbytes, "DelaySampler.quantile");
          },
          py::arg("q"), py::arg("op") = py::none(), py::arg("nbytes") = -1)
      .def(
          "cdf",
          [](const DelaySampler& s, py::object x) { return cdfOf(s.distribution(), std::move(x), "DelaySampler.cdf"); },
          py::arg("x"))
      .def("mean", &DelaySampler::mean)
      .def("describe", [](const DelaySampler& s) { return samplerDict(describeSampler(s)); })
      .def_property_readonly("spec", [](const DelaySampler& s) { return s.spec().text; })
      .def_property_readonly(
          "delay_spec", [](const DelaySampler& s) { return std::const_pointer_cast<DelayDistribution>(s.shared()); },
          "The parsed spec (delaycomm._C.DelaySpec) the draws come from.")
      .def_property_readonly("seed", &DelaySampler::seed)
      .def_property_readonly("rank", &DelaySampler::rank);
}

void bindSchedule(py::module_& m) {
  py::class_<DelaySchedule>(m, "DelaySchedule",
                            "Which calls of which rank are delayed and by how much: f(seed, rank, stream, seq).")
      .def(py::init([](const py::object& spec, double fraction, int64_t seed, std::vector<int64_t> ranks, double burst,
                       int64_t carrierSize) {
             return DelaySchedule(specArgument(spec, "DelaySchedule"), fraction,
                                  checkedUnsigned(seed, "DelaySchedule", "seed"), std::move(ranks), burst, carrierSize);
           }),
           py::arg("spec"), py::arg("fraction"), py::arg("seed") = 0, py::arg("ranks") = std::vector<int64_t>{},
           py::arg("burst") = 0.0, py::arg("carrier_size") = 0)
      .def(
          "carrier",
          [](const DelaySchedule& s, int64_t stream, int64_t seq) {
            return s.carrier(checkedUnsigned(stream, "DelaySchedule.carrier", "stream"),
                             checkedUnsigned(seq, "DelaySchedule.carrier", "seq"));
          },
          py::arg("stream"), py::arg("seq"),
          "delay_carrier=one: the rank that carries call (stream, seq), or -1 (no single carrier).")
      .def("delayed", &DelaySchedule::delayed, py::arg("rank"), py::arg("stream"), py::arg("seq"))
      .def(
          "delay_ns",
          [](const DelaySchedule& s, int64_t rank, uint64_t stream, uint64_t seq, std::optional<std::string> op,
             int64_t nbytes) {
            return s.delayNs(rank, stream, seq, callSizeArgument(op, nbytes, "DelaySchedule.delay_ns"));
          },
          py::arg("rank"), py::arg("stream"), py::arg("seq"), py::arg("op") = py::none(), py::arg("nbytes") = -1)
      .def(
          "delays_ns",
          [](const DelaySchedule& s, int64_t rank, int64_t stream, int64_t start, int64_t n) {
            return counterRun<int64_t>(n, stream, start, "DelaySchedule.delays_ns",
                                       [&s, rank](uint64_t st, uint64_t seq) { return s.delayNs(rank, st, seq); });
          },
          py::arg("rank"), py::arg("stream"), py::arg("start"), py::arg("n"))
      .def(
          "delayed_many",
          [](const DelaySchedule& s, int64_t rank, int64_t stream, int64_t start, int64_t n) {
            return counterRun<bool>(n, stream, start, "DelaySchedule.delayed_many",
                                    [&s, rank](uint64_t st, uint64_t seq) { return s.delayed(rank, st, seq); });
          },
          py::arg("rank"), py::arg("stream"), py::arg("start"), py::arg("n"))
      .def(
          "latest",
          [](const DelaySchedule& s, int64_t stream, int64_t seq, int64_t size, int64_t onlyRank) {
            const auto l = s.latest(checkedUnsigned(stream, "DelaySchedule.latest", "stream"),
                                    checkedUnsigned(seq, "DelaySchedule.latest", "seq"), size, onlyRank);
            return py::make_tuple(l.rank, l.ns, l.quantile);
          },
          py::arg("stream"), py::arg("seq"), py::arg("size"), py::arg("only_rank") = -1,
          "delay_mode=match's view of a call: (latest rank or -1, its delay in ns, its quantile).")
      .def_static("min_burst", &DelaySchedule::minBurst, py::arg("fraction"),
                  "The shortest mean burst length at `fraction`: 1 / (1 - fraction) calls.")
      .def_property_readonly("burst", &DelaySchedule::burst)
      .def_property_readonly("fraction", &DelaySchedule::fraction)
      .def_property_readonly("ranks", &DelaySchedule::ranks)
      .def_property_readonly("active", &DelaySchedule::active)
      .def_static("key_stream", &DelaySchedule::keyStream, py::arg("key"))
      .def_readonly_static("LOADER_STREAM", &DelaySchedule::kLoaderStream);

  // delay_place=step's run of overlapping calls (delay/Schedule.hpp, StepPlace), its targets drawn from a schedule's
  // distribution as the injector draws them: for the tests of its arithmetic.
  py::class_<StepPlace>(m, "_StepPlace", "delay_place=step: the run of overlapping calls whose draw a call joins.")
      .def(py::init<>())
      .def(
          "place",
          [](StepPlace& p, int64_t nowNs, double u, const DelaySchedule& s, std::optional<std::string> op,
             int64_t nbytes, int64_t ownNs, bool mayJoin) {
            const CallSize at = callSizeArgument(op, nbytes, "_StepPlace.place");
            const auto placed = p.place(nowNs, u, [&](double v) { return s.drawNs(v, at); }, ownNs, mayJoin);
            return py::make_tuple(placed.u, placed.ns, placed.joined, placed.behindNs);
          },
          py::arg("now_ns"), py::arg("u"), py::arg("schedule"), py::arg("op") = py::none(), py::arg("nbytes") = -1,
          py::arg("own_ns") = 0, py::arg("may_join") = true,
          "(the draw position the call takes, its target in ns, whether it joined a running run, how long the run "
          "holds it past its own release in ns).")
      .def("running", &StepPlace::running, py::arg("now_ns"))
      .def("behind_ns", &StepPlace::behindNs, py::arg("now_ns"))
      .def_property_readonly("end_ns", &StepPlace::endNs);
}

py::dict fitDict(const FitResult& r) {
  py::dict d;
  d["spec"] = r.spec;
  d["family"] = r.family;
  d["fraction"] = r.fraction;
  std::vector<std::pair<double, double>> comp, achieved;
  for (const auto& c : r.component)
    comp.emplace_back(c.q, c.seconds);
  for (const auto& a : r.achieved)
    achieved.emplace_back(a.q, a.seconds);
  d["component"] = comp;
  d["achieved"] = achieved;
  return d;
}

}  // namespace

void bindDelay(py::module_& m) {
  m.def(
      "parse_delay_spec",
      [](const py::object& text) {
        // The spec is parsed (and a file it names read) by delaycomm._spec, the one parser, then solved.
        return samplerDict(describeSampler(DelaySampler(specArgument(text, "parse_delay_spec"))));
      },
      py::arg("text"),
      "Parse and solve a delay spec; returns its description, raises ValueError saying what is wrong.");
  m.def(
      "parse_duration", [](const std::string& text, const std::string& what) { return parseDuration(text, what); },
      py::arg("text"), py::arg("what") = "duration", "A duration with a unit (ns, us, ms, s) in seconds.");
  m.def(
      "counter_uniforms",
      [](int64_t seed, int64_t rank, int64_t stream, int64_t seq) {
        return counterUniforms(
            checkedUnsigned(seed, "counter_uniforms", "seed"), checkedUnsigned(rank, "counter_uniforms", "rank"),
            checkedUnsigned(stream, "counter_uniforms", "stream"), checkedUnsigned(seq, "counter_uniforms", "seq"));
      },
      py::arg("seed"), py::arg("rank"), py::arg("stream"), py::arg("seq"));
  m.def("_philox4x32", &philox4x32, py::arg("counter"), py::arg("key"));
  m.def(
      "sleep_precise",
      [](double seconds) {
        // NOTE: the bound keeps seconds x 1e9 in int64 nanoseconds (llround of more is undefined).
        if (!(seconds >= 0.0) || !(seconds <= 9.0e9)) {
          throw std::invalid_argument(
              c10::str("delaycomm: sleep_precise: seconds must be a number in [0, 9e9], got ", seconds));
        }
        py::gil_scoped_release release;
        sleepForPrecise(std::chrono::nanoseconds(static_cast<int64_t>(std::llround(seconds * 1e9))));
      },
      py::arg("seconds"), "Sleep with sub-millisecond precision (coarse sleep, then spin), GIL released.");
#ifdef DELAYCOMM_WITH_CUDA
  m.def(
      "_gpu_sleep",
      [](int device, int64_t ns) { gpuSleepOnCurrentStream(c10::Device(c10::DeviceType::CUDA, device), ns); },
      py::arg("device"), py::arg("ns"), "Launch the delay kernel on the device's current stream (tests, bench).");
#endif
  m.def(
      "fit_mixture",
      [](const std::vector<std::pair<double, double>>& targets, double fraction, const std::string& family) {
        std::vector<FitTarget> t;
        for (const auto& [q, x] : targets) {
          t.push_back({q, x});
        }
        return fitDict(fitMixture(t, fraction, family));
      },
      py::arg("targets"), py::arg("fraction"), py::arg("family") = "auto");
  // Match mode's estimate of this machine's own latency (delay/LocalLatency.hpp), for its tests.
  py::class_<LatencyEstimate>(m, "_LatencyEstimate")
      .def(py::init<>())
      .def("record", &LatencyEstimate::record, py::arg("ns"))
      .def(
          "record_many",
          [](LatencyEstimate& e, const std::vector<int64_t>& ns) {
            for (const int64_t v : ns) {
              e.record(v);
            }
          },
          py::arg("ns"))
      .def("quantile_ns", &LatencyEstimate::quantileNs, py::arg("q"))
      .def("mean_ns", &LatencyEstimate::meanNs)
      .def("smallest_ns", &LatencyEstimate::smallestNs)
      .def_property_readonly("count", &LatencyEstimate::count)
      .def_property_readonly_static("halving_every", [](const py::object&) { return LatencyEstimate::kHalvingEvery; })
      .def_property_readonly_static("min_samples", [](const py::object&) { return LatencyEstimate::kMinSamples; });
  // How delay_mode treats a delayed call on a CPU or cuda tensor (delay/DelayInjector.hpp), for its tests: the
  // cuda branch cannot run on a machine without a GPU, the decision can.
  m.def(
      "_match_call",
      [](DelayMode mode, OpKind op, bool cuda) {
        switch (matchCallFor(mode, op, cuda)) {
          case MatchCall::kAdd:
            return "add";
          case MatchCall::kMatch:
            return "match";
          case MatchCall::kUntimed:
            return "untimed";
        }
        return "?";
      },
      py::arg("mode"), py::arg("op"), py::arg("cuda"));
  bindSampler(m);
  bindSchedule(m);
}

}  // namespace delaycomm::bindings
