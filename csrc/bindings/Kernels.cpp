// The fused pack/blend kernel of the staleness engine (kernels/Blend.hpp), for tests and benchmarks.

#include <optional>
#include <vector>

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "bindings/Bindings.hpp"
#include "kernels/Blend.hpp"

namespace delaycomm::bindings {

void bindKernels(py::module_& m) {
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
}

}  // namespace delaycomm::bindings
