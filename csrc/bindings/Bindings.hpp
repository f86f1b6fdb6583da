#pragma once

// The pieces of delaycomm._C, the one pybind11 module (Module.cpp), one per area of csrc/. Conversion only: each
// binds what its area's headers declare and turns arguments and results into Python values at the edge; what an
// area computes lives in that area. Errors: std::invalid_argument, raised as ValueError.
//
// NOTE: built with torch's bundled pybind11 headers, so that c10d Store/Backend objects created by torch cross
// into this module (the holder type of c10d classes is c10::intrusive_ptr, declared by torch/csrc/utils/pybind.h).

#include <cstdint>
#include <optional>
#include <string>

#include <pybind11/pybind11.h>

#include "delay/Sampler.hpp"
#include "ops/OpTable.hpp"
#include "stats/Telemetry.hpp"

namespace delaycomm::bindings {

namespace py = pybind11;

void bindOps(py::module_& m);      // Ops.cpp: the op table
void bindOptions(py::module_& m);  // Backend.cpp: the typed options
void bindBackend(py::module_& m);  // Backend.cpp: DelayBackend
void bindDelay(py::module_& m);    // Delay.cpp: specs, samplers, schedules, fit, precise sleep
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

}  // namespace delaycomm::bindings
