// The one pybind11 module of delaycomm: delaycomm._C. Private; the public API is delaycomm/__init__.py.
//
// NOTE: built with torch's bundled pybind11 headers, so that c10d Store/Backend objects created by torch cross
// into this module (the holder type of c10d classes is c10::intrusive_ptr, declared by torch/csrc/utils/pybind.h).

#include <cmath>
#include <cstdio>
#include <optional>
#include <stdexcept>

#include <c10/util/Logging.h>
#include <pybind11/chrono.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "backend/DelayBackend.hpp"
#include "delay/DelaySpec.hpp"
#include "delay/Fit.hpp"
#include "delay/IssuerThread.hpp"
#include "delay/Profile.hpp"
#include "delay/Sampler.hpp"
#include "delay/Schedule.hpp"
#ifdef DELAYCOMM_WITH_CUDA
#include "delay/GpuDelay.hpp"
#endif
#include "kernels/Blend.hpp"
#include "ops/OpTable.hpp"
#include "stats/Histogram.hpp"
#include "stats/OpStats.hpp"

namespace py = pybind11;
using namespace delaycomm;

namespace delaycomm {

// The Python holder of a DelayBackend. Dropping the last reference destroys the inner Gloo/NCCL backends, whose
// destructors join their worker threads; a worker that is finishing a work whose tensors Python owns needs the
// GIL to release them. Destroying with the GIL held would deadlock on that join (seen at destroy_process_group),
// so the reference is dropped with the GIL released, as torch does for its own process groups.
template <typename T>
class GilReleasingHolder {
 public:
  GilReleasingHolder() = default;
  /* implicit */ GilReleasingHolder(c10::intrusive_ptr<T> ptr) : ptr_(std::move(ptr)) {}
  // pybind11 builds a holder from a raw pointer it got from a factory returning the holder's element
  // (pybind/pybind11#2957): take it over without a second reference count.
  explicit GilReleasingHolder(T* raw) : ptr_(c10::intrusive_ptr<T>::unsafe_steal_from_new(raw)) {}
  GilReleasingHolder(const GilReleasingHolder&) = default;
  GilReleasingHolder(GilReleasingHolder&&) noexcept = default;
  GilReleasingHolder& operator=(const GilReleasingHolder&) = default;
  GilReleasingHolder& operator=(GilReleasingHolder&&) noexcept = default;
  ~GilReleasingHolder() {
    if (ptr_ && PyGILState_Check()) {
      py::gil_scoped_release release;
      ptr_.reset();
    }
  }
  T* get() const noexcept { return ptr_.get(); }
  T& operator*() const noexcept { return *ptr_; }
  T* operator->() const noexcept { return ptr_.get(); }

 private:
  c10::intrusive_ptr<T> ptr_;
};

}  // namespace delaycomm

PYBIND11_DECLARE_HOLDER_TYPE(T, delaycomm::GilReleasingHolder<T>, true)

namespace {

// Whether this thread may take the GIL: Python is up and not finalizing. During finalization a thread other than
// the main one that takes the GIL is ended by pthread_exit (Python's rule); the forced unwind through a destructor
// or any noexcept frame then aborts the process ("terminate called without an active exception"). So C++ callers
// that may run late (hooks called from shutdown or from a destructor, on any thread) check this first.
bool pythonUsable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// A Python callable kept by C++ (a hook) and called from any thread at any time: copies share it; it is called
// and released with the GIL held, by whichever thread does so, or leaked when that happens during interpreter
// exit (see pythonUsable(); the interpreter frees it anyway).
class PyCallback {
 public:
  explicit PyCallback(py::function fn)
      : fn_(new py::function(std::move(fn)), [](py::function* f) {
          if (!pythonUsable()) {
            return;
          }
          py::gil_scoped_acquire gil;
          delete f;
        }) {}

  // Calls it with the GIL held; returns false, calling nothing, once Python is no longer usable. A Python error
  // propagates as py::error_already_set when `raise`, else is reported as unraisable, naming `where`.
  template <typename... Args>
  bool call(const char* where, bool raise, Args&&... args) const {
    if (!pythonUsable()) {
      return false;
    }
    py::gil_scoped_acquire gil;
    try {
      (*fn_)(std::forward<Args>(args)...);
    } catch (py::error_already_set& err) {
      if (raise) {
        throw;
      }
      err.discard_as_unraisable(where);
    }
    return true;
  }

 private:
  std::shared_ptr<py::function> fn_;
};

// The quantiles every summary reports, with their key names: histograms (telemetry) take the first
// kHistogramQuantiles, delay distributions (describeSampler) all of them.
struct Quantile {
  double q;
  const char* name;
};
constexpr Quantile kQuantiles[] = {{0.5, "p50"}, {0.9, "p90"}, {0.99, "p99"}, {0.999, "p999"}, {0.9999, "p9999"}};
constexpr int kHistogramQuantiles = 4;

// A histogram summary: count, mean, min, p50, p90, p99, p999, max, scaled by `scale` and suffixed by `unit`
// (e.g. ns -> us: scale 1e-3, unit "_us").
py::dict summarize(const LogHistogram& h, double scale, const char* unit) {
  const auto s = h.snapshot();
  py::dict d;
  d["count"] = s.count;
  d[py::str(std::string("mean") + unit)] = s.mean() * scale;
  d[py::str(std::string("min") + unit)] = s.min * scale;
  for (int i = 0; i < kHistogramQuantiles; ++i) {
    d[py::str(std::string(kQuantiles[i].name) + unit)] = s.quantile(kQuantiles[i].q) * scale;
  }
  d[py::str(std::string("max") + unit)] = s.max * scale;
  return d;
}

// The latency callers experienced per size class (docs/profile.md, "What is recorded"): for each class that
// recorded a call, its smallest size, a summary and the whole histogram (sparse [index, count] pairs of the log
// buckets, what a profile is built from).
py::list bySize(const SizeHistograms& classes) {
  py::list out;
  for (int c = 0; c < kSizeClasses; ++c) {
    const LogHistogram* h = classes.find(c);
    if (h == nullptr) {
      continue;
    }
    const auto s = h->snapshot();
    if (s.count == 0) {
      continue;
    }
    py::list buckets;
    for (int i = 0; i < LogHistogram::kBuckets; ++i) {
      if (s.buckets[static_cast<size_t>(i)] != 0) {
        buckets.append(py::make_tuple(i, s.buckets[static_cast<size_t>(i)]));
      }
    }
    py::dict hist;
    hist["base"] = LogHistogram::kBase;
    hist["unit"] = "ns";
    hist["count"] = s.count;
    hist["zeros"] = s.zeros;
    hist["sum_ns"] = s.sum;
    hist["min_ns"] = s.min;
    hist["max_ns"] = s.max;
    hist["buckets"] = buckets;
    py::dict d;
    d["bytes"] = sizeClassBytes(c);
    d["calls"] = s.count;
    d["latency"] = summarize(*h, 1e-3, "_us");
    d["histogram"] = hist;
    out.append(d);
  }
  return out;
}

// The one place where a group's telemetry becomes the dict of delaycomm.stats() (README "Telemetry"):
// per-op counters and summaries, the staleness counters with the engine's own keys (docs/staleness.md; zeros
// and "off" when the engine is off), the slowdown.
py::dict statsDict(const GroupStats& g, const StalenessEngine* e) {
  py::dict ops;
  for (const auto& row : opTable()) {
    const auto& s = g.op(row.kind);
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
    d["stale_calls"] = s.staleCalls.load();
    d["kept_fresh_calls"] = s.keptFreshCalls.load();
    d["latency"] = summarize(s.latencyNs, 1e-3, "_us");
    d["delay"] = summarize(s.delayNs, 1e-3, "_us");
    d["by_size"] = bySize(s.callNsBySize);
    py::dict match;  // delay_mode=match (docs/delay.md, "Match mode"); zeros under delay_mode=add
    match["calls"] = s.matchCalls.load();
    match["nothing_added"] = s.matchNothingAdded.load();
    match["uncalibrated"] = s.matchUncalibrated.load();
    d["match"] = match;
    ops[row.name] = d;
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
  stale["stale_fresh_ratio_windowed"] = e ? e->windowedRatio() : 0.0;
  stale["pending_here"] = e ? e->pendingHere() : 0;
  stale["keys"] = e ? e->keyCount() : 0;
  const auto src = e ? e->stepSource() : StepSource{};
  using Kind = StepSource::Kind;
  stale["step_ms"] = static_cast<double>(src.stepNs) * 1e-6;
  stale["step_source"] = !e                              ? "off"
                         : src.kind == Kind::kConfigured ? "step_ms"
                         : src.kind == Kind::kCalibrated ? "calibrated"
                                                         : "calibrating";
  stale["step_key"] = src.key;
  stale["step_intervals"] = src.intervals;
  stale["step_call"] = src.atCall;
  py::dict host;
  host["calls"] = g.host().slowdownCalls.load();
  host["blocked"] = summarize(g.host().slowdownNs, 1e-6, "_ms");
  py::dict out;
  out["ops"] = ops;
  out["staleness"] = stale;
  out["slowdown"] = host;
  return out;
}

// ===============================================================================================================
// Delay injection (issue 3): specs, samplers, schedules, fit, precise sleep. Errors: std::invalid_argument, which
// pybind11 raises as ValueError.

uint64_t checkedUnsigned(int64_t v, const char* method, const char* arg) {
  if (v < 0) {
    throw std::invalid_argument(std::string("delaycomm: ") + method + ": " + arg + " must be >= 0, got " +
                                std::to_string(v));
  }
  return static_cast<uint64_t>(v);
}

py::dict describeSampler(const DelaySampler& s) {
  py::dict d;
  const auto& spec = s.spec();
  d["spec"] = spec.text;
  d["family"] = familyName(spec.family);
  py::dict params;
  for (const auto& [k, v] : s.parameters()) {
    params[py::str(k)] = v;
  }
  d["parameters"] = params;
  py::dict given;
  for (const auto& p : spec.percentiles) {
    given[py::float_(p.q)] = p.seconds;
  }
  d["requested_percentiles_s"] = given;
  if (spec.family == DelaySpec::Family::kProfile) {
    d["profile_path"] = spec.profilePath;
    char digest[24];  // the file's content, for the ranks' agreement on the configuration
    std::snprintf(digest, sizeof(digest), "%016llx", static_cast<unsigned long long>(spec.profile->digest()));
    d["profile_digest"] = std::string(digest);
  }
  if (spec.family == DelaySpec::Family::kTrace) {
    d["trace_path"] = spec.tracePath;
    char digest[24];  // the file's content, for the ranks' agreement on the configuration
    std::snprintf(digest, sizeof(digest), "%016llx", static_cast<unsigned long long>(spec.traceDigest));
    d["trace_digest"] = std::string(digest);
  }
  if (!spec.isNone()) {
    py::dict q;
    for (const auto& [quantile, name] : kQuantiles) {
      q[py::str(std::string(name) + "_s")] = s.quantile(quantile);
    }
    d["percentiles"] = q;
  }
  d["mean_s"] = s.mean();
  d["seed"] = s.seed();
  d["rank"] = s.rank();
  return d;
}

// Applies f elementwise to a float or an array of floats; checks each input with `check`.
// n consecutive counters of one (rank, stream) of a schedule, from start, as a NumPy array: the same for every
// rank, computed without the GIL. `at(schedule, rank, stream, seq)` is the schedule's per-call value.
template <typename T, typename At>
py::array_t<T> scheduleRun(const DelaySchedule& s, int64_t rank, int64_t stream, int64_t start, int64_t n,
                           const char* method, At at) {
  const uint64_t count = checkedUnsigned(n, method, "n");
  const uint64_t st = checkedUnsigned(stream, method, "stream");
  const uint64_t first = checkedUnsigned(start, method, "start");
  py::array_t<T> out(static_cast<py::ssize_t>(count));
  T* dst = out.mutable_data();
  {
    py::gil_scoped_release release;
    for (uint64_t i = 0; i < count; ++i) {
      dst[i] = at(s, rank, st, first + i);
    }
  }
  return out;
}

template <typename F, typename C>
py::object mapDoubles(py::object x, F f, C check) {
  if (py::isinstance<py::float_>(x) || py::isinstance<py::int_>(x)) {
    const double v = x.cast<double>();
    check(v);
    return py::float_(f(v));
  }
  auto in = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(x);
  if (!in) {
    throw std::invalid_argument("delaycomm: expected a float or an array of floats");
  }
  py::array_t<double> out(in.request().shape);
  const double* src = in.data();
  double* dst = out.mutable_data();
  const auto n = in.size();
  for (py::ssize_t i = 0; i < n; ++i) {
    check(src[i]);
    dst[i] = f(src[i]);
  }
  return out;
}

void bindDelay(py::module_& m) {
  m.def(
      "parse_delay_spec",
      [](const std::string& text) {
        std::optional<DelaySampler> sampler;
        {
          py::gil_scoped_release release;         // a trace file may be long
          sampler.emplace(parseDelaySpec(text));  // solving may reject it too
        }
        return describeSampler(*sampler);
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

  py::class_<DelaySampler>(m, "DelaySampler", "A delay distribution with counter-based, deterministic draws.")
      .def(py::init([](const std::string& spec, int64_t seed, int64_t rank) {
             return DelaySampler(parseDelaySpec(spec), checkedUnsigned(seed, "DelaySampler", "seed"),
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
            const uint64_t count = checkedUnsigned(n, "DelaySampler.sample_many", "n");
            const uint64_t st = checkedUnsigned(stream, "DelaySampler.sample_many", "stream");
            const uint64_t first = checkedUnsigned(start, "DelaySampler.sample_many", "start");
            py::array_t<double> out(static_cast<py::ssize_t>(count));
            double* dst = out.mutable_data();
            {
              py::gil_scoped_release release;
              for (uint64_t i = 0; i < count; ++i) {
                dst[i] = s.sample(st, first + i);
              }
            }
            return out;
          },
          py::arg("n"), py::arg("stream") = 0, py::arg("start") = 0)
      .def(
          "quantile",
          [](const DelaySampler& s, py::object q, std::optional<std::string> op, int64_t nbytes) {
            CallSize at;  // a profile's (op, size class); other families ignore it
            if (op) {
              OpKind kind{};
              if (!opFromName(*op, &kind)) {
                throw std::invalid_argument("delaycomm: DelaySampler.quantile: unknown op " + delaycomm::quoted(*op));
              }
              at.op = static_cast<int>(kind);
            }
            at.bytes = nbytes;
            return mapDoubles(
                q, [&s, at](double v) { return s.quantile(v, at); },
                [](double v) {
                  if (!(v >= 0.0 && v <= 1.0)) {
                    throw std::invalid_argument("delaycomm: DelaySampler.quantile: q must be in [0, 1], got " +
                                                std::to_string(v));
                  }
                });
          },
          py::arg("q"), py::arg("op") = py::none(), py::arg("nbytes") = -1)
      .def(
          "cdf",
          [](const DelaySampler& s, py::object x) {
            return mapDoubles(
                x, [&s](double v) { return s.cdf(v); },
                [](double v) {
                  if (std::isnan(v)) {
                    throw std::invalid_argument("delaycomm: DelaySampler.cdf: x must be a number of seconds, got nan");
                  }
                });
          },
          py::arg("x"))
      .def("mean", &DelaySampler::mean)
      .def("describe", &describeSampler)
      .def_property_readonly("spec", [](const DelaySampler& s) { return s.spec().text; })
      .def_property_readonly("seed", &DelaySampler::seed)
      .def_property_readonly("rank", &DelaySampler::rank);

  py::class_<DelaySchedule>(m, "DelaySchedule",
                            "Which calls of which rank are delayed and by how much: f(seed, rank, stream, seq).")
      .def(py::init(
               [](const std::string& spec, double fraction, int64_t seed, std::vector<int64_t> ranks, double burst) {
                 return DelaySchedule(parseDelaySpec(spec), fraction, checkedUnsigned(seed, "DelaySchedule", "seed"),
                                      std::move(ranks), burst);
               }),
           py::arg("spec"), py::arg("fraction"), py::arg("seed") = 0, py::arg("ranks") = std::vector<int64_t>{},
           py::arg("burst") = 0.0)
      .def("delayed", &DelaySchedule::delayed, py::arg("rank"), py::arg("stream"), py::arg("seq"))
      .def(
          "delay_ns",
          [](const DelaySchedule& s, int64_t rank, uint64_t stream, uint64_t seq, std::optional<std::string> op,
             int64_t nbytes) {
            CallSize at;  // a profile's (op, size class); other families ignore it
            if (op) {
              OpKind kind{};
              if (!opFromName(*op, &kind)) {
                throw std::invalid_argument("delaycomm: DelaySchedule.delay_ns: unknown op " + delaycomm::quoted(*op));
              }
              at.op = static_cast<int>(kind);
            }
            at.bytes = nbytes;
            return s.delayNs(rank, stream, seq, at);
          },
          py::arg("rank"), py::arg("stream"), py::arg("seq"), py::arg("op") = py::none(), py::arg("nbytes") = -1)
      .def(
          "delays_ns",
          [](const DelaySchedule& s, int64_t rank, int64_t stream, int64_t start, int64_t n) {
            return scheduleRun<int64_t>(
                s, rank, stream, start, n, "DelaySchedule.delays_ns",
                [](const DelaySchedule& d, int64_t r, uint64_t st, uint64_t q) { return d.delayNs(r, st, q); });
          },
          py::arg("rank"), py::arg("stream"), py::arg("start"), py::arg("n"))
      .def(
          "delayed_many",
          [](const DelaySchedule& s, int64_t rank, int64_t stream, int64_t start, int64_t n) {
            return scheduleRun<bool>(
                s, rank, stream, start, n, "DelaySchedule.delayed_many",
                [](const DelaySchedule& d, int64_t r, uint64_t st, uint64_t q) { return d.delayed(r, st, q); });
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

  m.def(
      "fit_mixture",
      [](const std::vector<std::pair<double, double>>& targets, double fraction, const std::string& family) {
        std::vector<FitTarget> t;
        for (const auto& [q, x] : targets) {
          t.push_back({q, x});
        }
        const FitResult r = fitMixture(t, fraction, family);
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
      },
      py::arg("targets"), py::arg("fraction"), py::arg("family") = "auto");
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

  // ---- the op table (csrc/ops/OpTable.hpp): the one list of ops, read by delaycomm._ops --------------------------
  {
    py::enum_<OpKind> kinds(m, "OpKind", "The ops of the native op table, named as in telemetry.");
    for (const auto& row : opTable()) {
      kinds.value(row.name, row.kind);
    }
  }
  py::class_<OpInfo>(m, "OpInfo", "One row of the native op table (csrc/ops/OpTable.hpp).")
      .def_property_readonly("kind", [](const OpInfo& o) { return o.kind; })
      .def_property_readonly("name", [](const OpInfo& o) { return std::string(o.name); })
      .def_property_readonly("reduces", [](const OpInfo& o) { return o.reduces; })
      .def_property_readonly("delayable", [](const OpInfo& o) { return o.delayable; })
      .def_property_readonly("aliases",
                             [](const OpInfo& o) {
                               std::vector<std::string> names;
                               for (const char* a : o.aliases) {
                                 if (a)
                                   names.emplace_back(a);
                               }
                               return py::tuple(py::cast(names));
                             })
      .def("__repr__", [](const OpInfo& o) { return std::string("<delaycomm op ") + o.name + ">"; });
  m.def(
      "op_table",
      [] {
        py::tuple rows(kNumOpKinds);
        for (int i = 0; i < kNumOpKinds; ++i) {
          rows[i] = py::cast(&opTable()[i], py::return_value_policy::reference);
        }
        return rows;
      },
      "Every op the backend forwards, in OpKind order (names, aliases, which reduce, which delay_ops may name).");

  // ---- typed options (validated by delaycomm._config; filled by delaycomm._backend) -------------------------------
  py::enum_<StalenessMode>(m, "Staleness", "staleness= without its bound: bsp, ssp or asp.")
      .value("BSP", StalenessMode::kBsp)
      .value("SSP", StalenessMode::kSsp)
      .value("ASP", StalenessMode::kAsp);
  py::enum_<StalePolicy>(m, "StalePolicy", "stale_policy=: what a late contribution does.")
      .value("EMA", StalePolicy::kEma)
      .value("APPLY", StalePolicy::kApply)
      .value("DROP", StalePolicy::kDrop);
  py::enum_<DelayWhere>(m, "DelayWhere", "delay_where=: where a delay is paid.")
      .value("NETWORK", DelayWhere::kNetwork)
      .value("HOST", DelayWhere::kHost);
  py::enum_<DelayMode>(m, "DelayMode", "delay_mode=: add the delay, or match the target latency.")
      .value("ADD", DelayMode::kAdd)
      .value("MATCH", DelayMode::kMatch);

  py::class_<StalenessOptions>(m, "StalenessOptions", "The staleness engine's typed, validated settings.")
      .def(py::init<>())
      .def_readwrite("mode", &StalenessOptions::mode)
      .def_readwrite("bound", &StalenessOptions::bound)
      .def_readwrite("policy", &StalenessOptions::policy)
      .def_readwrite("alpha", &StalenessOptions::alpha)
      .def_readwrite("step_ms", &StalenessOptions::stepMs)
      .def_readwrite("max_pending", &StalenessOptions::maxPending);

  py::class_<BackendOptions>(m, "BackendOptions", "A DelayBackend's typed, validated settings (see _backend.py).")
      .def(py::init<>())
      .def_readwrite("timeout", &BackendOptions::timeout)
      .def_readwrite("group_name", &BackendOptions::groupName)
      .def_readwrite("time_cuda", &BackendOptions::timeCuda)
      .def_readwrite("delay", &BackendOptions::delay)
      .def_readwrite("delay_fraction", &BackendOptions::delayFraction)
      .def_readwrite("delay_ranks", &BackendOptions::delayRanks)
      .def_readwrite("delay_ops", &BackendOptions::delayOps)
      .def_readwrite("delay_where", &BackendOptions::delayWhere)
      .def_readwrite("delay_mode", &BackendOptions::delayMode)
      .def_readwrite("delay_burst", &BackendOptions::delayBurst)
      .def_readwrite("seed", &BackendOptions::seed)
      .def_readwrite("slowdown", &BackendOptions::slowdown)
      .def_readwrite("stale", &BackendOptions::stale)
      .def_readwrite("store", &BackendOptions::store);

  py::class_<DelayBackend, GilReleasingHolder<DelayBackend>, c10d::Backend>(m, "DelayBackend")
      .def(py::init([](int rank, int size, c10::intrusive_ptr<c10d::Backend> cpuInner,
                       c10::intrusive_ptr<c10d::Backend> cudaInner, const BackendOptions& options) {
             return GilReleasingHolder<DelayBackend>(
                 c10::make_intrusive<DelayBackend>(rank, size, std::move(cpuInner), std::move(cudaInner), options));
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
            return statsDict(self.stats(), self.staleness());
          },
          "Telemetry of this group as a dict (see delaycomm.stats).")
      .def("reset_stats", &DelayBackend::resetStats, py::call_guard<py::gil_scoped_release>())
      // ---- staleness (stale/StalenessEngine.hpp) ----
      .def("stale_allreduce", &DelayBackend::staleAllreduce, py::arg("tensor"), py::arg("key"),
           py::arg("average") = false, py::call_guard<py::gil_scoped_release>(),
           "SUM (or AVG) all-reduce of one tensor as step of stream `key` under the group's staleness model.")
      .def("flush", &DelayBackend::flush, py::call_guard<py::gil_scoped_release>(),
           "Deliver every pending stale contribution (collective); returns [(key, delivered sum)].")
      .def(
          "stale_pending",
          [](DelayBackend& self) {
            auto* e = self.staleness();
            return py::make_tuple(e ? e->pendingHere() : 0, e ? e->pendingGlobal() : 0);
          },
          "(this rank's pending stale contributions, the group's)")
      .def("stale_windowed_ratio",
           [](DelayBackend& self) {
             auto* e = self.staleness();
             return e ? e->windowedRatio() : 0.0;
           })
      .def(
          "_set_warning_hook",
          [](DelayBackend& self, py::function fn) {
            if (auto* e = self.staleness()) {
              e->onWarn = [cb = PyCallback(std::move(fn))](const std::string& msg) {
                if (!cb.call("delaycomm warning hook", false, msg)) {
                  LOG(WARNING) << msg;  // interpreter exit: no Python to warn through
                }
              };
            }
          },
          py::arg("fn"))
      .def(
          "_set_shutdown_hook",
          [](DelayBackend& self, py::function fn) {
            self.setShutdownHook([cb = PyCallback(std::move(fn))] {
              if (!cb.call("delaycomm shutdown hook", true)) {
                LOG(WARNING) << "delaycomm: a group shut down at interpreter exit: its shutdown hook (the stats "
                                "file) did not run; call destroy_process_group() before exit";
              }
            });
          },
          py::arg("fn"))
      .def(
          "inner",
          [](DelayBackend& self, const std::string& device) {
            const auto type = c10::Device(device).type();
            return self.innerBackend(type);
          },
          py::arg("device"), "The inner backend that serves `device` ('cpu' or 'cuda'), or None.")
      .def(
          "delay_ns_for",
          [](DelayBackend& self, const std::string& op, uint64_t seq, int64_t nbytes) {
            OpKind kind;
            if (!opFromName(op, &kind)) {
              throw std::invalid_argument("delaycomm: delay_ns_for: unknown op '" + op + "'");
            }
            return self.delayNsFor(kind, seq, nbytes);
          },
          py::arg("op"), py::arg("seq"), py::arg("nbytes") = -1,
          "The injected delay of op `seq` (a group sequence number; of `nbytes`, for a profile) on this rank.")
      .def("pending_delayed_ops", &DelayBackend::pendingDelayedOps);

  bindDelay(m);

  py::class_<LogHistogram, std::shared_ptr<LogHistogram>>(m, "_LogHistogram",
                                                          "The telemetry histogram (exposed for tests).")
      .def(py::init<>())
      .def("record", &LogHistogram::record, py::arg("value"))
      .def(
          "quantile", [](const LogHistogram& h, double q) { return h.snapshot().quantile(q); }, py::arg("q"))
      .def("summary", [](const LogHistogram& h) { return summarize(h, 1.0, ""); })
      .def("reset", &LogHistogram::reset);

  // ---- kernels: the fused pack/blend kernel of the staleness engine (csrc/kernels/Blend.hpp) ------------------
  m.def(
      "_fused_blend",
      [](at::Tensor grad, double freshScale, const std::vector<at::Tensor>& stale,
         const std::vector<double>& staleScales,
         const std::optional<at::Tensor>& stash) { kernels::fusedBlend(grad, freshScale, stale, staleScales, stash); },
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

  // ---- staleness: scope keys of FSDP2's reductions (stale/FsdpScope.hpp, docs/staleness.md) -------------------
  m.def(
      "_stale_scope_key",
      [](const std::string& scope, int64_t numel, at::ScalarType dtype, bool scatter) {
        return StalenessEngine::scopeKey(scope, numel, dtype, scatter);
      },
      py::arg("scope"), py::arg("numel"), py::arg("dtype"), py::arg("scatter"),
      "The staleness key of the stream that an FSDP2 reduction scope (e.g. 'FSDP::post_backward_reduce (0)') "
      "reduces with tensors of numel elements of dtype (tests compute the delay schedule of that stream with it).");
  // ---- end staleness scope keys ----------------------------------------------------------------------------------

  // ---- staleness: DDP communication hooks (stale/Recognition.hpp, python/delaycomm/_ddp.py) ----------------------
  m.def("_ddp_bucket_enter", &ddp_bucket_scope::enter, py::arg("index"), py::arg("numel"),
        "Marks the calling thread as running a DDP communication hook on bucket `index` of `numel` elements.");
  m.def("_ddp_bucket_exit", &ddp_bucket_scope::exit, "Ends the calling thread's DDP communication hook scope.");
  m.def("_ddp_join_shadow_enter", &ddp_join_shadow::enter, py::arg("new_pass"),
        "Marks the calling thread as shadowing DDP's backward pass on a joined rank (join()).");
  m.def("_ddp_join_shadow_exit", &ddp_join_shadow::exit, "Ends the calling thread's join() shadow.");
  // ---- end DDP communication hooks ------------------------------------------------------------------------------
}
