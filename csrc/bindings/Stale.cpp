// Staleness (stale/): the scope keys of FSDP2's reductions (stale/FsdpScope.hpp) and the scopes of DDP's
// communication hooks (stale/Recognition.hpp, python/delaycomm/_ddp.py). docs/staleness.md.

#include <string>

#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "bindings/Bindings.hpp"
#include "stale/Recognition.hpp"
#include "stale/StalenessEngine.hpp"

namespace delaycomm::bindings {

void bindStale(py::module_& m) {
  m.def(
      "_stale_scope_key",
      [](const std::string& scope, int64_t numel, at::ScalarType dtype, bool scatter) {
        return StalenessEngine::scopeKey(scope, numel, dtype, scatter);
      },
      py::arg("scope"), py::arg("numel"), py::arg("dtype"), py::arg("scatter"),
      "The staleness key of the stream that an FSDP2 reduction scope (e.g. 'FSDP::post_backward_reduce (0)') "
      "reduces with tensors of numel elements of dtype (tests compute the delay schedule of that stream with it).");
  m.def("_ddp_bucket_enter", &ddp_bucket_scope::enter, py::arg("index"), py::arg("numel"),
        "Marks the calling thread as running a DDP communication hook on bucket `index` of `numel` elements.");
  m.def("_ddp_bucket_exit", &ddp_bucket_scope::exit, "Ends the calling thread's DDP communication hook scope.");
  m.def("_ddp_join_shadow_enter", &ddp_join_shadow::enter, py::arg("new_pass"),
        "Marks the calling thread as shadowing DDP's backward pass on a joined rank (join()).");
  m.def("_ddp_join_shadow_exit", &ddp_join_shadow::exit, "Ends the calling thread's join() shadow.");
}

}  // namespace delaycomm::bindings
