#pragma once

// The pieces of delaycomm._C, the one pybind11 module (Module.cpp), one per area of csrc/. Conversion only: each
// binds what its area's headers declare and turns arguments and results into Python values at the edge; what an
// area computes lives in that area. Errors: std::invalid_argument, raised as ValueError.
//
// NOTE: built with torch's bundled pybind11 headers, so that c10d Store/Backend objects created by torch cross
// into this module (the holder type of c10d classes is c10::intrusive_ptr, declared by torch/csrc/utils/pybind.h).

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "delay/Sampler.hpp"
#include "ops/OpTable.hpp"
#include "stats/Telemetry.hpp"

namespace delaycomm::bindings {

namespace py = pybind11;

void bindOps(py::module_& m);      // Ops.cpp: the op table
void bindOptions(py::module_& m);  // Backend.cpp: the typed options
void bindBackend(py::module_& m);  // Backend.cpp: DelayBackend
void bindSpec(py::module_& m);     // Spec.cpp: the parsed delay spec (_C.DelaySpec), profiles, trace lines
void bindDelay(py::module_& m);    // Delay.cpp: samplers, schedules, fit, precise sleep
void bindStats(py::module_& m);    // Stats.cpp: the telemetry histogram
void bindKernels(py::module_& m);  // Kernels.cpp: the fused blend
void bindStale(py::module_& m);    // Stale.cpp: FSDP2 scope keys, DDP hook scopes

// delaycomm.stats() of one group: `t`, one key per field (Stats.cpp).
py::dict telemetryDict(const GroupTelemetry& t);

// `v` as an unsigned counter, or "delaycomm: METHOD: ARG must be >= 0, got V".
uint64_t checkedUnsigned(int64_t v, const char* method, const char* arg);
// The op named `op`, or "delaycomm: METHOD: unknown op 'NAME'".
OpKind opArgument(const std::string& op, const char* method);
// The call an optional op name and a size describe (a profile's (op, size class)), or "delaycomm: METHOD: unknown
// op 'NAME'".
CallSize callSizeArgument(const std::optional<std::string>& op, int64_t nbytes, const char* method);

// The parsed spec of a DelaySpec, or of a str (parsed by delaycomm._spec, the one parser, which reads a file the
// spec names); else "delaycomm: METHOD: spec must be ...".
std::shared_ptr<const DelayDistribution> specArgument(const py::handle& spec, const char* method);
// d's quantile (cdf) at a float or an array of them, each checked ("delaycomm: METHOD: q must be in [0, 1]").
py::object quantileOf(const DelayDistribution& d, py::object q, const std::optional<std::string>& op, int64_t nbytes,
                      const char* method);
py::object cdfOf(const DelayDistribution& d, py::object x, const char* method);
// A sampler's description (describe(), parse_delay_spec()) as a dict (Delay.cpp).
py::dict samplerDict(const SamplerDescription& s);

// f applied elementwise to a float or an array of floats, each input checked with `check` first.
template <typename F, typename C>
inline py::object mapDoubles(py::object x, F f, C check) {
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

}  // namespace delaycomm::bindings
