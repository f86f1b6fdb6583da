// DelayBackend and its typed options (backend/DelayBackend.hpp); validated by delaycomm._config, filled by
// delaycomm._backend.

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <c10/util/Logging.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "backend/DelayBackend.hpp"
#include "bindings/Bindings.hpp"

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
      pybind11::gil_scoped_release release;
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

namespace delaycomm::bindings {

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

// The hooks a DelayBackend calls from C++ (any thread), as Python callables.
void bindBackendHooks(py::class_<DelayBackend, GilReleasingHolder<DelayBackend>, c10d::Backend>& cls) {
  cls.def(
         "_set_warning_hook",
         [](DelayBackend& self, py::function fn) {
           self.setStaleWarningHook([cb = PyCallback(std::move(fn))](const std::string& msg) {
             if (!cb.call("delaycomm warning hook", false, msg)) {
               LOG(WARNING) << msg;  // interpreter exit: no Python to warn through
             }
           });
         },
         py::arg("fn"))
      .def(
          "_set_shutdown_hook",
          [](DelayBackend& self, py::function fn) {
            // The hook gets its backend when it is called: holding it (or a weak reference to its Python object,
            // which can be revived while pybind11 frees that object) would outlive or resurrect it. shutdown()
            // runs on a live backend, so a new reference to it is sound.
            DelayBackend* raw = &self;
            self.setShutdownHook([cb = PyCallback(std::move(fn)), raw] {
              if (!cb.call("delaycomm shutdown hook", true,
                           GilReleasingHolder<DelayBackend>(c10::intrusive_ptr<DelayBackend>::reclaim_copy(raw)))) {
                LOG(WARNING) << "delaycomm: a group shut down at interpreter exit: its shutdown hook (the stats "
                                "file) did not run; call destroy_process_group() before exit";
              }
            });
          },
          py::arg("fn"));
}

}  // namespace

void bindOptions(py::module_& m) {
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
      .value("MATCH", DelayMode::kMatch)
      .value("MATCH_CPU", DelayMode::kMatchCpu);

  py::class_<StalenessOptions>(m, "StalenessOptions", "The staleness engine's typed, validated settings.")
      .def(py::init<>())
      .def_readwrite("mode", &StalenessOptions::mode)
      .def_readwrite("bound", &StalenessOptions::bound)
      .def_readwrite("policy", &StalenessOptions::policy)
      .def_readwrite("alpha", &StalenessOptions::alpha)
      .def_readwrite("step_ms", &StalenessOptions::stepMs)
      .def_readwrite("max_pending", &StalenessOptions::maxPending)
      .def_readwrite("update_stats", &StalenessOptions::updateStats)
      .def_readwrite("check", &StalenessOptions::check);

  py::class_<DelayOptions> delay(m, "DelayOptions", "The delay injector's typed, validated settings.");
  delay.def(py::init<>())
      .def_property(
          "spec",
          [](const DelayOptions& o) -> py::object {
            return o.spec ? py::cast(std::const_pointer_cast<DelayDistribution>(o.spec)) : py::none();
          },
          [](DelayOptions& o, std::shared_ptr<DelayDistribution> spec) { o.spec = std::move(spec); },
          "The parsed delay spec (delaycomm._C.DelaySpec); None: no delay.");
  // Every other field by its row in delay/DelayOptions.hpp, and the names of all (DelayOptions.fields, spec
  // first): delaycomm._config's option table names the field of each delay option, and
  // tests/backend/test_config.py checks that the two name the same fields.
#define DELAYCOMM_BIND_DELAY_OPTION(type, name, init, doc) delay.def_readwrite(#name, &DelayOptions::name, doc);
  DELAYCOMM_DELAY_OPTION_FIELDS(DELAYCOMM_BIND_DELAY_OPTION)
#undef DELAYCOMM_BIND_DELAY_OPTION
#define DELAYCOMM_DELAY_OPTION_NAME(type, name, init, doc) #name,
  const std::vector<std::string> fields{"spec", DELAYCOMM_DELAY_OPTION_FIELDS(DELAYCOMM_DELAY_OPTION_NAME)};
#undef DELAYCOMM_DELAY_OPTION_NAME
  delay.attr("fields") = py::tuple(py::cast(fields));

  py::class_<BackendOptions>(m, "BackendOptions", "A DelayBackend's typed, validated settings (see _backend.py).")
      .def(py::init<>())
      .def_readwrite("timeout", &BackendOptions::timeout)
      .def_readwrite("group_name", &BackendOptions::groupName)
      .def_readwrite("time_cuda", &BackendOptions::timeCuda)
      .def_readwrite("delay", &BackendOptions::delay)
      .def_readwrite("stale", &BackendOptions::stale)
      .def_readwrite("store", &BackendOptions::store);
}

void bindBackend(py::module_& m) {
  py::class_<DelayBackend, GilReleasingHolder<DelayBackend>, c10d::Backend> cls(m, "DelayBackend");
  // NOTE: the GIL is released around the construction only (it may wait on the store), never with a call_guard: a
  // factory's call_guard also covers pybind11 registering the new instance in its table of live instances, and
  // two ranks-as-threads registering at once without the GIL corrupted that table ("Tried to deallocate
  // unregistered instance", then unknown opcodes; tests/backend/test_concurrent_creation.py).
  cls.def(py::init([](int rank, int size, c10::intrusive_ptr<c10d::Backend> cpuInner,
                      c10::intrusive_ptr<c10d::Backend> cudaInner, const BackendOptions& options) {
            c10::intrusive_ptr<DelayBackend> backend;
            {
              py::gil_scoped_release release;
              backend =
                  c10::make_intrusive<DelayBackend>(rank, size, std::move(cpuInner), std::move(cudaInner), options);
            }
            return GilReleasingHolder<DelayBackend>(std::move(backend));
          }),
          py::arg("rank"), py::arg("size"), py::arg("cpu_inner"), py::arg("cuda_inner"), py::arg("options"))
      .def(
          "stats",
          [](DelayBackend& self) {
            GroupTelemetry t;
            {
              py::gil_scoped_release release;
              t = self.telemetry();
            }
            return telemetryDict(t);
          },
          "Telemetry of this group as a dict (see delaycomm.stats).")
      .def("reset_stats", &DelayBackend::resetStats, py::call_guard<py::gil_scoped_release>())
      .def("_harvest_cuda_timings", &DelayBackend::harvestCudaTimings, py::call_guard<py::gil_scoped_release>(),
           "Fold the completed GPU timings in (and their DELAYCOMM_TRACE records); never blocks.")
      // ---- staleness (stale/StalenessEngine.hpp) ----
      .def("stale_allreduce", &DelayBackend::staleAllreduce, py::arg("tensor"), py::arg("key"),
           py::arg("average") = false, py::call_guard<py::gil_scoped_release>(),
           "SUM (or AVG) all-reduce of one tensor as step of stream `key` under the group's staleness model; with "
           "key None, as a recognised gradient reduction (the DDP bucket scope of delaycomm.ddp_hook).")
      .def(
          "flush",
          [](DelayBackend& self) {
            std::vector<StalenessEngine::FlushStream> streams;
            {
              py::gil_scoped_release release;
              streams = self.flush();
            }
            py::list out;
            for (auto& s : streams) {
              py::object local = s.local.defined() ? py::cast(s.local) : py::none();
              py::object reference = s.reference.defined() ? py::cast(s.reference) : py::none();
              out.append(py::make_tuple(s.key, local, s.consumer, s.scatter, s.name, reference));
            }
            return out;
          },
          "Deliver every pending stale contribution (collective); returns [(key, delivered sum or None, consumer id, "
          "reduce-scatter, stream name, stale_check's reference or None)].")
      .def("flush_allreduce", &DelayBackend::flushAllreduce, py::arg("tensor"),
           py::call_guard<py::gil_scoped_release>(),
           "A SUM all-reduce that is part of flush (no staleness, no delay); waits for it.")
      .def("stale_pending", &DelayBackend::stalePending, "(this rank's pending stale contributions, the group's)")
      .def("stale_windowed_ratio", &DelayBackend::staleWindowedRatio)
      .def(
          "inner",
          [](DelayBackend& self, const std::string& device) { return self.innerBackend(c10::Device(device).type()); },
          py::arg("device"), "The inner backend that serves `device` ('cpu' or 'cuda'), or None.")
      .def(
          "delay_ns_for",
          [](DelayBackend& self, const std::string& op, uint64_t seq, int64_t nbytes) {
            return self.delayNsFor(opArgument(op, "delay_ns_for"), seq, nbytes);
          },
          py::arg("op"), py::arg("seq"), py::arg("nbytes") = -1,
          "The injected delay of op `seq` (a group sequence number; of `nbytes`, for a profile) on this rank.")
      .def("pending_delayed_ops", &DelayBackend::pendingDelayedOps);
  bindBackendHooks(cls);
}

}  // namespace delaycomm::bindings
