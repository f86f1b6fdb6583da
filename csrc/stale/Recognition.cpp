// Which reductions are data-parallel gradient reductions (stale/Recognition.hpp; docs/staleness.md, "Which
// reductions go stale").

#include "stale/Recognition.hpp"

#include <atomic>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/graph_task.h>

#include "stale/FsdpScope.hpp"

namespace delaycomm {

namespace {

struct BucketFrame {
  int64_t index = -1;
  int64_t numel = 0;
  bool reduced = false;  // the bucket's gradient reduction was issued
};

// NOTE: a name of its own: the torch-heavy sources are compiled as one translation unit (CMakeLists.txt).
thread_local BucketFrame tlsBucket;

// The joined rank's shadow backward pass: a pseudo graph task id below -1 (real ones are >= 0, none is -1), 0 when
// no shadow is running on this thread.
std::atomic<int64_t> shadowPasses{0};
thread_local int64_t tlsShadowPass = 0;
thread_local int64_t tlsLastShadowPass = 0;

}  // namespace

namespace ddp_bucket_scope {

void enter(int64_t index, int64_t numel) {
  tlsBucket = BucketFrame{index, numel, false};
}

void exit() {
  tlsBucket = BucketFrame{};
}

}  // namespace ddp_bucket_scope

namespace ddp_join_shadow {

void enter(bool newPass) {
  if (newPass || tlsLastShadowPass == 0) {
    tlsLastShadowPass = -2 - shadowPasses.fetch_add(1, std::memory_order_relaxed);
  }
  tlsShadowPass = tlsLastShadowPass;
}

void exit() {
  tlsShadowPass = 0;
}

}  // namespace ddp_join_shadow

bool GradientRecognizer::enterLocked(int64_t graphTask) {
  if (graphTask != graphTask_) {
    usedMapLast_ = usedMapNow_;
    usedMapNow_ = false;
    ordinal_ = 0;
    graphTask_ = graphTask;
  }
  return usedMapNow_ || usedMapLast_;
}

GradientRecognizer::Decision GradientRecognizer::classify(const at::Tensor& t, bool structural, bool scatter) {
  Decision d;
  const char* kind = scatter ? "reduce_scatter" : "all_reduce";
  const int64_t realTask = torch::autograd::get_current_graph_task_id();
  // A joined rank's shadow of DDP's backward pass counts as a backward pass of its own, its reductions as DDP's.
  const int64_t graphTask = realTask < 0 && tlsShadowPass != 0 ? tlsShadowPass : realTask;
  // The node being evaluated: null outside a backward pass and in its final callbacks.
  const auto node = realTask >= 0 ? torch::autograd::get_current_node() : c10::intrusive_ptr<torch::autograd::Node>();
  const bool accumulating = (realTask >= 0 || graphTask != realTask) &&
                            (!node || dynamic_cast<const torch::autograd::AccumulateGrad*>(node.get()) != nullptr);

  if (accumulating && !structural && !scatter && t.defined() && !at::isFloatingType(t.scalar_type())) {
    // DDP's used-parameter map (find_unused_parameters): an integer all-reduce issued with the gradients.
    std::lock_guard<std::mutex> lock(mutex_);
    enterLocked(graphTask);
    usedMapNow_ = true;
  }
  if (!structural) {
    d.reason = Reason::kNotFloatingSum;
    return d;
  }

  // 1. FSDP2's reduction scope.
  if (const std::string* scope = fsdp_scope::current()) {
    if (scatter) {
      fsdp_scope::noteReduceScatter();
    } else if (fsdp_scope::reduceScattered()) {
      d.reason = Reason::kHsdpReplicas;
      return d;
    }
    d.reason = Reason::kGradient;
    d.stream = *scope;
    return d;
  }

  // 2. A DDP communication hook: the bucket's one reduction of its size.
  if (tlsBucket.index >= 0) {
    if (!tlsBucket.reduced && !scatter && t.numel() == tlsBucket.numel) {
      tlsBucket.reduced = true;
      std::lock_guard<std::mutex> lock(mutex_);
      if (graphTask != -1 && enterLocked(graphTask)) {
        d.reason = Reason::kUnusedParameters;
        return d;
      }
      d.reason = Reason::kGradient;
      d.stream = "DDP bucket #" + std::to_string(tlsBucket.index) + " (comm hook)";
      return d;
    }
    d.reason = Reason::kCommHookOther;
    return d;
  }

  // 3. A backward pass: a parameter's gradient accumulation or a final callback (or a joined rank's shadow of one).
  if (graphTask == -1) {
    d.reason = Reason::kOutsideBackward;
    return d;
  }
  if (!accumulating) {
    d.reason = Reason::kOtherAutogradNode;
    d.node = node->name();
    return d;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (enterLocked(graphTask)) {
    d.reason = Reason::kUnusedParameters;
    return d;
  }
  d.reason = Reason::kGradient;
  d.stream = std::string("backward ") + kind + " #" + std::to_string(ordinal_++);
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
      return "it was issued outside a backward pass, so it is not a data-parallel gradient reduction (a metric, "
             "a tensor-parallel forward all-reduce, an optimizer's or a user's collective)";
    case Reason::kOtherAutogradNode:
      return "it was issued in a backward pass by an autograd node that is not a parameter's gradient "
             "accumulation (a tensor-parallel backward all-reduce)";
    case Reason::kUnusedParameters:
      return "DDP reduces a used-parameter map in this backward pass (find_unused_parameters=True): DDP drops a "
             "late contribution to a parameter that is unused on the step it lands, so its gradients stay fresh";
    case Reason::kHsdpReplicas:
      return "it is HSDP's all-reduce across replicas, after the shard group's reduce-scatter in the same FSDP2 "
             "scope went stale: one stage of a gradient's reduction goes stale, not both";
    case Reason::kCommHookOther:
      return "it was issued by a DDP communication hook besides the bucket's gradient (a reduction of another "
             "size, e.g. PowerSGD's factors): a hook's intermediate results never go stale";
  }
  return "?";
}

}  // namespace delaycomm
