#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

namespace delaycomm {

// Which reductions are data-parallel gradient reductions whose owner is known, and so may go stale
// (docs/staleness.md, "Which reductions go stale"). Every other reduction is kept fresh: it runs as under bsp, with
// its delay.
//
// A reduction is a gradient reduction when it is a SUM/AVG of one dense floating tensor (for a reduce-scatter also a
// PREMUL_SUM by a number) outside a coalescing window, and its owner is proven (stale/Owners.hpp):
//  1. inside an owner's scope: a DDP communication hook running on a bucket (the hook's one reduction of the
//     bucket's size; its other reductions, e.g. PowerSGD's factors, are kept fresh), or FSDP1's or FSDP2's
//     gradient reduction of one flat parameter or parameter group (its first reduction; under HSDP or
//     HYBRID_SHARD the all-reduce across replicas after a stale reduce-scatter is kept fresh: one stage goes stale);
//  2. by DDP's reducer (its default hook), recognised from the parameter whose gradient accumulation launched it
//     (or a joined rank's shadow of that DDP): the reduction of the round's next bucket, of that bucket's size and
//     dtype. A DDP with find_unused_parameters keeps its buckets fresh: it drops the reduced gradient of a parameter
//     no rank used in that step, so a late contribution landing there would be lost.
// The stream is the owner's (its name from the owner: the owner's ordinal, the bucket, the parameters), never an
// ordinal within a backward pass. Everything else is kept fresh, with the reason: outside a backward pass (metrics,
// TP forward, an end-of-backward bucket flush delaycomm cannot tell from them), in a backward pass by another
// autograd node (TP's backward all-reduces), by a parameter of no known owner (DeepSpeed's hooks, a user's), outside
// any node (final callbacks, compiled autograd graphs), or by a known owner but not as its gradient reduction (a
// counter all-reduced in a parameter hook).
//
// Every rank running the same program decides alike: the decision depends only on the program's sequence of
// reductions, forwards and scopes, never on timing.
//
// Threads: classify() on the calling thread of the collective (the scopes and the autograd node are the thread's);
// the owners' registry takes its own lock.
class GradientRecognizer {
 public:
  // Why a reduction that staleness could have taken was kept fresh.
  enum class Reason : uint8_t {
    kGradient = 0,        // not kept fresh: a gradient reduction of a known owner
    kNotFloatingSum,      // not a SUM/AVG of one dense floating tensor (or in a coalescing window)
    kOutsideBackward,     // issued outside a backward pass
    kOtherAutogradNode,   // in a backward pass, by an autograd node other than a gradient accumulation
    kUnusedParameters,    // DDP with find_unused_parameters
    kHsdpReplicas,        // HSDP's or HYBRID_SHARD's all-reduce across replicas after a stale reduce-scatter
    kCommHookOther,       // a DDP comm hook's reduction other than the bucket's gradient
    kNoOwner,             // in a parameter's gradient accumulation, of a parameter no known owner reduces
    kNoNode,              // in a backward pass outside any node (a final callback, a compiled autograd graph)
    kNotOwnersReduction,  // in a DDP parameter's gradient accumulation, not the reducer's reduction of its bucket
    kOwnerOther,          // in an FSDP scope, after the parameter group's gradient reduction
    kNotConsumed,         // the stream was reduced again before an optimizer step consumed it (StalenessEngine)
  };
  static constexpr size_t kNumReasons = 12;

  struct Decision {
    Reason reason = Reason::kOutsideBackward;
    std::string stream;     // the stream's name (a gradient reduction): its key is StalenessEngine::scopeKey of it
    int64_t consumer = -1;  // the parameters its result lands on (stale/Owners.hpp)
    bool shadow = false;    // issued in a join() shadow (the joined rank runs no optimizer step)
    std::string node;       // the autograd node (kOtherAutogradNode), for the warning
    bool gradient() const { return reason == Reason::kGradient; }
  };

  // group: the name of the group the reduction is on. structural: the reduction is a SUM/AVG (PREMUL_SUM by a
  // number) of one dense floating tensor outside a coalescing window; scatter: a reduce-scatter (else an all-reduce).
  Decision classify(const std::string& group, const at::Tensor& t, bool structural, bool scatter) const;

  // Why, in words, for the one-time warning.
  static const char* explain(Reason reason);
  static const char* name(Reason reason);
};

}  // namespace delaycomm
