// Which reductions go stale (stale/StaleRouter.hpp; docs/staleness.md, "Which reductions go stale").

#include "stale/StaleRouter.hpp"

#include <cmath>

#include <c10/util/Exception.h>
#include <torch/version.h>

#include "delay/DelayInjector.hpp"
#include "stale/Owners.hpp"
#include "stale/StalenessEngine.hpp"

namespace delaycomm {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13)
using PreMulSumSupplement = c10d::PreMulSumSupplement;
#else
// NOTE: before torch 2.13 the supplement was c10d::NCCLPreMulSumSupplement (the same fields).
using PreMulSumSupplement = c10d::NCCLPreMulSumSupplement;
#endif

namespace {

// The factor of a PREMUL_SUM given as a number (FSDP2's gradient divide factor); nullopt for any other op, or
// for a factor given as a tensor (reading it would synchronise with its device).
std::optional<double> premulSumFactor(const c10d::ReduceOp& reduceOp) {
  if (reduceOp.op_ != c10d::ReduceOp::PREMUL_SUM) {
    return std::nullopt;
  }
  const auto* supplement = dynamic_cast<const PreMulSumSupplement*>(reduceOp.supplement_.get());
  if (supplement == nullptr || supplement->tensor_factor.defined()) {
    return std::nullopt;
  }
  return supplement->double_factor;
}

StaleRoute notStale(const char* why) {
  StaleRoute route;
  route.whyNot = why;
  return route;
}

}  // namespace

StaleRouter::StaleRouter(StalenessEngine& engine, const DelayInjector& injector, int size)
    : engine_(engine), injector_(injector), size_(size) {}

const char* StaleRouter::unblendable(OpKind op, const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& reduceOp,
                                     bool coalescing, StaleRoute& route) const {
  if (tensors.size() != 1) {
    return "it reduces more than one tensor";
  }
  if (coalescing) {
    return "it is inside a coalescing window";
  }
  const at::Tensor& t = tensors[0];
  if (t.is_sparse() || !at::isFloatingType(t.scalar_type())) {
    return "its tensor is not a dense floating tensor";
  }
  switch (reduceOp.op_) {
    case c10d::ReduceOp::SUM:
      route.resultScale = 1.0;
      return nullptr;
    case c10d::ReduceOp::AVG:
      route.resultScale = 1.0 / static_cast<double>(size_);
      return nullptr;
    case c10d::ReduceOp::PREMUL_SUM: {
      // PREMUL_SUM(f) is a SUM scaled by f (FSDP2 with a gradient divide factor): reduce-scatter only.
      const auto factor = premulSumFactor(reduceOp);
      if (op != OpKind::kReduceScatterBase || !factor) {
        return "its PREMUL_SUM factor is a tensor, or it is not a reduce-scatter";
      }
      TORCH_CHECK_VALUE(std::isfinite(*factor),
                        "delaycomm: stale reduction: the result scale (PREMUL_SUM factor) must be finite, got ",
                        *factor);
      route.resultScale = *factor;
      return nullptr;
    }
    default:
      return "its reduce op is not SUM, AVG or PREMUL_SUM";
  }
}

StaleRoute StaleRouter::classify(OpKind op, const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& reduceOp,
                                 bool coalescing, std::optional<uint64_t> explicitKey) {
  const DelaySchedule* schedule = injector_.schedule();
  if (schedule == nullptr || !schedule->active()) {
    return notStale("no delay is configured, so nothing can be late");
  }
  if (!injector_.delays(op)) {
    return notStale("the op is not among delay_ops");
  }
  StaleRoute route;
  const bool scatter = op == OpKind::kReduceScatterBase;
  const char* why = unblendable(op, tensors, reduceOp, coalescing, route);
  if (explicitKey) {  // stale_allreduce: the caller says it is a gradient stream
    if (why != nullptr) {
      return notStale(why);
    }
    route.stale = true;
    route.key = *explicitKey;
    return route;
  }
  const at::Tensor t = tensors.size() == 1 ? tensors[0] : at::Tensor();
  auto decision = recognizer_.classify(engine_.options().groupName, t, why == nullptr, scatter);
  if (decision.gradient()) {
    auto admission = engine_.admit(decision.stream, t, scatter, decision.consumer, decision.shadow);
    if (admission.admitted) {
      route.stale = true;
      route.scatter = scatter;
      route.key = admission.key;
      route.mayDefer = admission.mayDefer;
      return route;
    }
    if (owners::Scope* scope = owners::innermostScope(); scope != nullptr && scatter) {
      scope->scatterStale = false;  // kept fresh after all: the replicas' all-reduce after it is the stale stage
    }
    decision.reason = GradientRecognizer::Reason::kNotConsumed;
    route.detail = std::move(admission.detail);
  }
  route.whyNot = why != nullptr ? why : GradientRecognizer::explain(decision.reason);
  route.keptFresh = true;
  route.reason = decision.reason;
  route.node = std::move(decision.node);
  return route;
}

}  // namespace delaycomm
