// Staleness (stale/): the owners of gradient reductions (stale/Owners.hpp: python/delaycomm/_owners.py, _ddp.py and
// _fsdp.py register them) and the keys of recognised streams. docs/staleness.md.

#include <string>
#include <tuple>
#include <vector>

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "bindings/Bindings.hpp"
#include "stale/Owners.hpp"
#include "stale/StalenessEngine.hpp"

namespace delaycomm::bindings {

namespace {

owners::ScopeKind scopeKindArgument(const std::string& kind) {
  if (kind == "ddp_hook") {
    return owners::ScopeKind::kDdpHook;
  }
  if (kind == "fsdp") {
    return owners::ScopeKind::kFsdp;
  }
  if (kind == "ddp_shadow") {
    return owners::ScopeKind::kDdpShadow;
  }
  throw std::invalid_argument("delaycomm: _stale_scope_enter: kind must be 'ddp_hook', 'fsdp' or 'ddp_shadow', got '" +
                              kind + "'");
}

// (params, numel, dtype, stream name, consumer id) per bucket, in the reducer's order.
using BucketArgs = std::tuple<std::vector<at::Tensor>, int64_t, at::ScalarType, std::string, int64_t>;

}  // namespace

void bindStale(py::module_& m) {
  m.def(
      "_stale_scope_key",
      [](const std::string& scope, int64_t numel, at::ScalarType dtype, bool scatter) {
        return StalenessEngine::scopeKey(scope, numel, dtype, scatter);
      },
      py::arg("scope"), py::arg("numel"), py::arg("dtype"), py::arg("scatter"),
      "The staleness key of the recognised stream named `scope` (e.g. 'DDP #0 bucket #0 (params 3-0)') reduced "
      "with tensors of numel elements of dtype (tests compute the delay schedule of that stream with it).");
  m.def("_stale_consumer", &owners::addConsumer, py::arg("params"),
        "Registers the parameters one stream's result lands on; returns the consumer's id.");
  m.def("_stale_optimizer_stepped", &owners::optimizerStepped, py::arg("params"),
        py::arg("skipped") = std::vector<at::Tensor>{},
        "An optimizer step consumed these parameters' gradients (and skipped those of `skipped`: .grad None).");
  // ---- the rule (docs/staleness.md, "The rule") ----
  m.def("_stale_optimizer_skipped", &owners::optimizerSkipped, py::arg("params"),
        "A step that threw these parameters' gradients away (GradScaler found an inf).");
  m.def("_stale_grads_discarded", &owners::gradsDiscarded, py::arg("params"),
        "zero_grad of these parameters: what they held is thrown away if no step consumed it since the last one.");
  m.def("_stale_consumer_ranges", &owners::setRanges, py::arg("consumer"), py::arg("ranges"),
        "Each parameter's [(offset, numel)] in the consumer's stream tensor.");
  m.def("_stale_set_loss_scale", &owners::setLossScale, py::arg("scale"),
        "The loss scale of the gradients reduced from now on (GradScaler.scale).");
  m.def("_stale_loss_scale", &owners::lossScale, "The current loss scale (1 without a GradScaler).");
  m.def("_stale_reductions", &owners::reductionCount, "Recognised reductions admitted so far.");
  m.def(
      "_stale_scope_enter",
      [](const std::string& kind, const std::string& stream, int64_t numel, int64_t consumer, int64_t ddp,
         bool dynamicUnused) {
        owners::Scope s;
        s.kind = scopeKindArgument(kind);
        s.stream = stream;
        s.numel = numel;
        s.consumer = consumer;
        s.ddp = ddp;
        s.dynamicUnused = dynamicUnused;
        owners::enterScope(std::move(s));
      },
      py::arg("kind"), py::arg("stream") = "", py::arg("numel") = -1, py::arg("consumer") = -1, py::arg("ddp") = -1,
      py::arg("dynamic_unused") = false,
      "Marks the calling thread as reducing one owner's gradients (a DDP comm hook's bucket, FSDP's parameter group, "
      "DDP join()'s shadow).");
  m.def("_stale_scope_exit", &owners::exitScope,
        "Ends the calling thread's innermost owner scope; returns whether its reduce-scatter went stale.");
  m.def(
      "_stale_ddp_layout",
      [](int64_t ddp, const std::string& group, const std::vector<BucketArgs>& buckets, bool dynamicUnused,
         bool ownReducer) {
        std::vector<owners::DdpBucket> out;
        for (const auto& [params, numel, dtype, stream, consumer] : buckets) {
          out.push_back(owners::DdpBucket{params, numel, dtype, stream, consumer});
        }
        owners::ddpLayout(ddp, group, std::move(out), dynamicUnused, ownReducer);
      },
      py::arg("ddp"), py::arg("group"), py::arg("buckets"), py::arg("dynamic_unused"), py::arg("own_reducer"),
      "DDP instance `ddp` reduces these buckets ((params, numel, dtype, stream, consumer) each) from now on.");
  m.def("_stale_ddp_round", &owners::ddpRound, py::arg("ddp"),
        "A forward of DDP `ddp` prepared a backward round: its buckets are reduced anew, from bucket 0.");
  m.def("_stale_ddp_forget", &owners::ddpForget, py::arg("ddp"), "DDP `ddp` is gone.");
}

}  // namespace delaycomm::bindings
