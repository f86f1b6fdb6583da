// delaycomm._C: the one pybind11 module of delaycomm. Private; the public API is delaycomm/__init__.py.

#include <pybind11/pybind11.h>

#include "bindings/Bindings.hpp"

PYBIND11_MODULE(_C, m) {
  namespace bindings = delaycomm::bindings;
  m.doc() = "delaycomm native core (private: use the delaycomm package)";

  // The c10d base classes must be registered (by importing torch.distributed) before ours derive from them.
  pybind11::module_::import("torch.distributed");

  m.attr("cuda_compiled") = pybind11::bool_(
#ifdef DELAYCOMM_WITH_CUDA
      true
#else
      false
#endif
  );

  bindings::bindOps(m);
  bindings::bindSpec(m);  // before the options that hold a spec
  bindings::bindOptions(m);
  bindings::bindBackend(m);
  bindings::bindDelay(m);
  bindings::bindStats(m);
  bindings::bindKernels(m);
  bindings::bindStale(m);
}
