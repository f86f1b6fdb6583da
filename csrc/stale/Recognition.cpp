// Which reductions are data-parallel gradient reductions of a known owner (stale/Recognition.hpp; docs/staleness.md,
// "Which reductions go stale").

#include "stale/Recognition.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/graph_task.h>

#include "stale/Owners.hpp"

namespace delaycomm {

namespace {

using Reason = GradientRecognizer::Reason;

GradientRecognizer::Decision gradientOf(std::string stream, int64_t consumer) {
  GradientRecognizer::Decision d;
  d.reason = Reason::kGradient;
  d.stream = std::move(stream);
  d.consumer = consumer;
  return d;
}

GradientRecognizer::Decision freshFor(Reason reason) {
  GradientRecognizer::Decision d;
  d.reason = reason;
  return d;
}

// 1. Inside an owner's scope (a DDP comm hook on a bucket; FSDP's reduction of one parameter group).
GradientRecognizer::Decision inScope(owners::Scope& s, const at::Tensor& t, bool scatter) {
  if (s.kind == owners::ScopeKind::kDdpHook) {
    if (s.reduced || scatter || t.numel() != s.numel) {
      return freshFor(Reason::kCommHookOther);
    }
    s.reduced = true;
    return s.dynamicUnused ? freshFor(Reason::kUnusedParameters) : gradientOf(s.stream, s.consumer);
  }
  if (s.reduced) {
    return freshFor(!scatter && s.scatterStale ? Reason::kHsdpReplicas : Reason::kOwnerOther);
  }
  s.reduced = true;
  s.scatterStale = scatter;  // cleared by the router when the engine does not take it
  return gradientOf(s.stream, s.consumer);
}

}  // namespace

GradientRecognizer::Decision GradientRecognizer::classify(const std::string& group, const at::Tensor& t,
                                                          bool structural, bool scatter) const {
  if (!structural) {
    return freshFor(Reason::kNotFloatingSum);
  }
  const int64_t shadow = owners::shadowDdp();
  owners::Scope* scope = owners::innermostScope();
  if (scope != nullptr && scope->kind != owners::ScopeKind::kDdpShadow) {
    Decision d = inScope(*scope, t, scatter);
    d.shadow = shadow >= 0;
    return d;
  }

  // 2. DDP's reducer: from a parameter's gradient accumulation, or a joined rank's shadow of the backward pass.
  const c10::TensorImpl* param = nullptr;
  if (shadow < 0) {
    if (torch::autograd::get_current_graph_task_id() < 0) {
      return freshFor(Reason::kOutsideBackward);
    }
    // The node being evaluated: null in a backward pass's final callbacks and in a compiled autograd graph.
    const auto node = torch::autograd::get_current_node();
    if (!node) {
      return freshFor(Reason::kNoNode);
    }
    const auto* accumulate = dynamic_cast<const torch::autograd::AccumulateGrad*>(node.get());
    if (accumulate == nullptr) {
      Decision d = freshFor(Reason::kOtherAutogradNode);
      d.node = node->name();
      return d;
    }
    param = accumulate->variable.unsafeGetTensorImpl();
  }
  if (scatter) {
    return freshFor(param != nullptr ? Reason::kNoOwner : Reason::kOutsideBackward);
  }
  const owners::DdpMatch m = owners::matchDdpReduction(param, shadow, group, t);
  switch (m.kind) {
    case owners::DdpMatch::Kind::kNotDdp:
      return freshFor(param != nullptr ? Reason::kNoOwner : Reason::kOutsideBackward);
    case owners::DdpMatch::Kind::kOther:
      return freshFor(Reason::kNotOwnersReduction);
    case owners::DdpMatch::Kind::kUnused:
      return freshFor(Reason::kUnusedParameters);
    case owners::DdpMatch::Kind::kBucket:
      break;
  }
  Decision d = gradientOf(m.stream, m.consumer);
  d.shadow = shadow >= 0;
  return d;
}

const char* GradientRecognizer::name(Reason reason) {
  switch (reason) {
    case Reason::kGradient:
      return "gradient";
    case Reason::kNotFloatingSum:
      return "not_floating_sum";
    case Reason::kOutsideBackward:
      return "outside_backward";
    case Reason::kOtherAutogradNode:
      return "other_autograd_node";
    case Reason::kUnusedParameters:
      return "find_unused_parameters";
    case Reason::kHsdpReplicas:
      return "hsdp_replicas";
    case Reason::kCommHookOther:
      return "comm_hook_other";
    case Reason::kNoOwner:
      return "no_owner";
    case Reason::kNoNode:
      return "no_node";
    case Reason::kNotOwnersReduction:
      return "not_owners_reduction";
    case Reason::kOwnerOther:
      return "owner_other";
    case Reason::kNotConsumed:
      return "not_consumed";
  }
  return "?";
}

const char* GradientRecognizer::explain(Reason reason) {
  switch (reason) {
    case Reason::kGradient:
      return "a gradient reduction";
    case Reason::kNotFloatingSum:
      return "it is not a SUM or AVG of one dense floating tensor (or it is in a coalescing window)";
    case Reason::kOutsideBackward:
      return "it was issued outside a backward pass, and delaycomm cannot tell a gradient reduction issued there (an "
             "end-of-backward bucket flush such as DeepSpeed ZeRO's) from a metric, a tensor-parallel forward "
             "all-reduce or an optimizer's or a user's collective";
    case Reason::kOtherAutogradNode:
      return "it was issued in a backward pass by an autograd node that is not a parameter's gradient "
             "accumulation (a tensor-parallel backward all-reduce)";
    case Reason::kUnusedParameters:
      return "its DDP module runs with find_unused_parameters=True: DDP drops the reduced gradient of a parameter "
             "that no rank used in a step, so a late contribution landing on such a step would be lost (pass "
             "find_unused_parameters=False, or static_graph=True, for staleness: docs/ecosystem.md)";
    case Reason::kHsdpReplicas:
      return "it is the all-reduce across replicas (HSDP, HYBRID_SHARD) after the shard group's reduce-scatter of the "
             "same parameters went stale: one stage of a gradient's reduction goes stale, not both";
    case Reason::kCommHookOther:
      return "it was issued by a DDP communication hook besides the bucket's gradient (a reduction of another "
             "size, e.g. PowerSGD's factors): a hook's intermediate results never go stale";
    case Reason::kNoOwner:
      return "it was issued in a backward pass by a parameter's gradient hook, but no model delaycomm recognises "
             "(DDP, FSDP1, FSDP2) reduces that parameter (DeepSpeed's or a user's gradient hook): which parameters "
             "the reduced tensor holds, and how its result is used, cannot be proven";
    case Reason::kNoNode:
      return "it was issued in a backward pass outside any parameter's gradient accumulation (a final callback, or "
             "a compiled autograd graph): whose gradients the reduced tensor holds cannot be proven";
    case Reason::kNotOwnersReduction:
      return "it was issued in the gradient hook of a DDP parameter, but it is not DDP's reduction of its next "
             "bucket (another size or dtype: a user's all-reduce in a parameter hook, e.g. a counter)";
    case Reason::kOwnerOther:
      return "FSDP issued it after the parameter group's gradient reduction (an all-reduce or comm hook's "
             "reduction): only the gradient reduction itself goes stale";
    case Reason::kNotConsumed:
      return "its stream was reduced again before an optimizer step consumed all of its parameters' previous "
             "gradient (reduced twice per optimizer step, as a GAN's discriminator or two backward passes per "
             "step are, or a reduction whose gradient no torch.optim optimizer stepped): a late contribution could "
             "land on a gradient that is used differently, so the stream is kept fresh from now on";
  }
  return "?";
}

}  // namespace delaycomm
