#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include <ATen/core/Tensor.h>

namespace delaycomm {

// Which reductions are data-parallel gradient reductions, and so may go stale (docs/staleness.md, "Which
// reductions go stale"). Every other reduction is kept fresh: it runs as under bsp, with its delay.
//
// A reduction is a gradient reduction when it is a SUM/AVG of one dense floating tensor (for a reduce-scatter also a
// PREMUL_SUM by a number) outside a coalescing window, and it is issued
//  1. inside an FSDP2 parameter group's gradient-reduction scope (stale/FsdpScope.hpp): its stream is the scope;
//     except HSDP's all-reduce across replicas after a stale reduce-scatter in the same scope (kept fresh);
//  2. by a DDP communication hook, as the bucket's one reduction of the bucket's size (DdpBucketScope below): its
//     stream is the bucket. The hook's other reductions (PowerSGD's factors and its uncompressed tensors) are kept
//     fresh;
//  3. in a backward pass (autograd graph task), by a parameter's gradient accumulation (the AccumulateGrad node
//     and its hooks: DDP's reducer, DeepSpeed's and other gradient hooks) or by a final callback of the backward
//     pass (DDP's static_graph first iteration, FSDP2's root): its stream is its ordinal among such reductions of
//     this group within the backward pass, with its size and dtype ("backward reduction #k"). Except after DDP's
//     used-parameter map (find_unused_parameters: a non-floating all-reduce in the backward pass), in that
//     backward pass and the next: DDP drops a late contribution to a parameter unused on the step it lands.
// Everything else is kept fresh: outside a backward pass (metrics, TP forward), or in a backward pass by another
// autograd node (TP's backward all-reduces).
//
// Every rank running the same program decides alike: the decision depends only on the program's sequence of
// reductions and backward passes, never on timing (NOTE: a future callback may run on the issuing thread or on
// another one depending on timing, so a hook's callbacks are recognised by the bucket scope, not by the thread).
//
// Threads: classify() may be called from any thread (its per-group state takes a lock); the scopes are the calling
// thread's.
class GradientRecognizer {
 public:
  // Why a reduction that staleness could have taken was kept fresh.
  enum class Reason : uint8_t {
    kGradient = 0,       // not kept fresh: a gradient reduction
    kNotFloatingSum,     // not a SUM/AVG of one dense floating tensor (or in a coalescing window)
    kOutsideBackward,    // issued outside a backward pass
    kOtherAutogradNode,  // in a backward pass, by an autograd node other than a gradient accumulation
    kUnusedParameters,   // DDP with find_unused_parameters
    kHsdpReplicas,       // HSDP's all-reduce across replicas after a stale reduce-scatter
    kCommHookOther,      // a DDP comm hook's reduction other than the bucket's gradient
  };
  static constexpr size_t kNumReasons = 7;

  struct Decision {
    Reason reason = Reason::kOutsideBackward;
    std::string stream;  // the stream's name (a gradient reduction): its key is StalenessEngine::scopeKey of it
    std::string node;    // the autograd node (kOtherAutogradNode), for the warning
    bool gradient() const { return reason == Reason::kGradient; }
  };

  // structural: the reduction is a SUM/AVG (PREMUL_SUM by a number) of one dense floating tensor outside a
  // coalescing window; scatter: a reduce-scatter (else an all-reduce).
  Decision classify(const at::Tensor& t, bool structural, bool scatter);

  // Why, in words, for the one-time warning.
  static const char* explain(Reason reason);
  static const char* name(Reason reason);

 private:
  // Notes that a reduction is issued in backward pass `graphTask` (a new one starts the ordinals again); returns
  // whether DDP's used-parameter map was reduced in it or in the one before.
  bool enterLocked(int64_t graphTask);

  std::mutex mutex_;
  int64_t graphTask_ = -1;    // the backward pass of the last reduction issued in one
  int64_t ordinal_ = 0;       // gradient reductions so far in it
  bool usedMapNow_ = false;   // DDP's used-parameter map was all-reduced in it
  bool usedMapLast_ = false;  // ... in the backward pass before it
};

// The DDP communication hook being run on this thread (python/delaycomm/_ddp.py wraps every hook registered on a
// DDP module): the bucket's index and size, and whether its gradient reduction was issued.
namespace ddp_bucket_scope {
void enter(int64_t index, int64_t numel);
void exit();
}  // namespace ddp_bucket_scope

// A joined rank's shadow of DDP's backward pass (DDP join(): python/delaycomm/_ddp.py marks the calling thread while
// DDP issues the all-reduces that match the active ranks' buckets and used-parameter map). Its reductions are
// recognised as in a backward pass of their own, so they are the same streams, with the same keys, as the active
// ranks' (docs/staleness.md, "Which reductions go stale"). newPass: a new shadow backward pass (else the last one
// goes on: the used-parameter map after the buckets).
namespace ddp_join_shadow {
void enter(bool newPass);
void exit();
}  // namespace ddp_join_shadow

}  // namespace delaycomm
