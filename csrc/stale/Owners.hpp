#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace delaycomm::owners {

// Whose gradients a reduction carries (docs/staleness.md, "Which reductions go stale"). A reduction may go stale only
// when its owner is known: the model that reduces it, which of its parameters the reduced tensor holds, and how the
// result is consumed. python/delaycomm/_owners.py, _ddp.py and _fsdp.py tell this from the owners' own code paths:
//
//  - a *consumer* (addConsumer) is the set of parameters one stream's result lands on: one DDP bucket's, one FSDP1
//    flat parameter's, one FSDP2 parameter group's (what the optimizer holds). Registered once per layout;
//  - a *scope* (enterScope) marks the calling thread while an owner's Python code reduces one consumer's gradients:
//    a DDP communication hook on its bucket, FSDP1's and FSDP2's gradient reduction, DDP join()'s shadow;
//  - DDP's own reducer reduces from C++ with no Python on the way (its default hook): ddpLayout registers its
//    buckets, ddpRound marks each forward that prepares a backward round, and matchDdpReduction recognises its bucket
//    reductions from the parameter whose gradient accumulation launched them (the reducer launches a round's buckets
//    once each, in index order);
//  - optimizerStepped (torch.optim's global step post hook) records which parameters an optimizer step consumed (their
//    .grad was not None) and which it skipped (.grad None); optimizerSkipped (GradScaler.step that found an inf)
//    and gradsDiscarded (zero_grad after no step) record steps whose gradients were thrown away; the engine reads
//    each parameter's fate since a stream's reduction (fates) to apply a contribution iff its own step's gradient
//    was applied (docs/staleness.md, "The rule");
//  - setLossScale (GradScaler.scale) records the loss scale the gradients reduced next are computed at.
//
// Stream names come from Python and name the owner in rank-invariant terms (the owner's ordinal in program order,
// the bucket, its parameters' ordinals): every rank running the same program names the same streams. Parameters
// are held weakly; a parameter whose tensor died is forgotten.
//
// Threads: scopes are the calling thread's; everything else is process-wide under one lock (any thread).

// Element ranges [offset, offset + numel) of one parameter in its stream's reduced tensor.
using Ranges = std::vector<std::pair<int64_t, int64_t>>;

// Registers the parameters of one consumer; returns its id (process-local: never part of a stream's key).
int64_t addConsumer(const std::vector<at::Tensor>& params);
// Sets each parameter's elements in the consumer's stream tensor (same order as its parameters). Without them (the
// layout not known), a stream whose step is skipped for some of its parameters only is kept fresh.
void setRanges(int64_t consumer, const std::vector<Ranges>& ranges);
// An optimizer step consumed the gradients of `consumed` and skipped `skipped` (its parameters whose .grad was None).
void optimizerStepped(const std::vector<at::Tensor>& consumed, const std::vector<at::Tensor>& skipped = {});
// A step that threw these parameters' gradients away (GradScaler found an inf; zero_grad with no step since the
// last zero_grad: gradsDiscarded).
void optimizerSkipped(const std::vector<at::Tensor>& params);
void gradsDiscarded(const std::vector<at::Tensor>& params);
// Optimizer events so far (steps, skips; any optimizer).
uint64_t stepCount();

// What became of a parameter's gradient after its stream's last reduction: consumed by a step, thrown away, or
// neither yet. The first optimizer event that touches the parameter after openReduction settles it.
enum class Fate : uint8_t { kOpen, kTaken, kSkipped };
// The consumer's stream (its key) was reduced: its parameters' fates start open.
void openReduction(int64_t consumer, uint64_t stream);
// Each parameter's fate since the stream's last openReduction, in the order of that reduction's consumer (the same
// parameters when the owner registered its layout anew); nullopt when the stream has none. A parameter whose tensor
// died is kOpen.
std::optional<std::vector<Fate>> fates(uint64_t stream);
// The consumer's parameters' ranges (empty: not known).
std::vector<Ranges> rangesOf(int64_t consumer);
// Whether an optimizer step consumed every parameter of `consumer` since the stream's last openReduction.
bool consumedSince(uint64_t stream);

// The loss scale of the gradients reduced from now on (GradScaler.scale; 1 without one), and whether a GradScaler
// was seen at all (the engine then checks each deferred contribution for infs).
void setLossScale(double scale);
double lossScale();
bool scalerSeen();
// Recognised reductions admitted so far (the conservation check's end: nothing reduced since a flush).
uint64_t reductionCount();
void countReduction();

enum class ScopeKind : uint8_t {
  kDdpHook,    // a DDP communication hook running on one bucket
  kFsdp,       // FSDP1's or FSDP2's gradient reduction of one flat parameter or parameter group
  kDdpShadow,  // a joined rank's shadow of DDP's backward pass (join())
};

struct Scope {
  ScopeKind kind = ScopeKind::kFsdp;
  std::string stream;          // kDdpHook, kFsdp: the stream's name
  int64_t numel = -1;          // kDdpHook: the bucket's size (its one gradient reduction has it)
  int64_t consumer = -1;       // kDdpHook, kFsdp
  int64_t ddp = -1;            // kDdpHook, kDdpShadow: the DDP instance
  bool dynamicUnused = false;  // kDdpHook: the DDP runs with find_unused_parameters (not static_graph)
  bool reduced = false;        // the owner's gradient reduction was issued in this scope
  bool scatterStale = false;   // kFsdp: that reduction was a reduce-scatter that went stale
};

void enterScope(Scope scope);
// Ends the calling thread's innermost scope; returns whether its gradient reduction was a reduce-scatter that went
// stale (FSDP under HSDP: flush then reduces it across the replicas as FSDP would).
bool exitScope();
// The calling thread's innermost scope, or nullptr.
Scope* innermostScope();
// The DDP whose join() shadow the calling thread runs, or -1.
int64_t shadowDdp();

// One bucket of DDP's reducer, in the reducer's index order.
struct DdpBucket {
  std::vector<at::Tensor> params;  // in the bucket's order
  int64_t numel = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::string stream;
  int64_t consumer = -1;
};
// DDP instance `ddp` (on the group named `group`) reduces with these buckets from now on. dynamicUnused:
// find_unused_parameters without static_graph. ownReducer: its buckets are reduced by the reducer's default hook
// (no Python comm hook registered, no builtin hook other than ALLREDUCE).
void ddpLayout(int64_t ddp, const std::string& group, std::vector<DdpBucket> buckets, bool dynamicUnused,
               bool ownReducer);
// A forward of DDP `ddp` prepared a backward round (or a join() shadow began one): its buckets are reduced anew,
// from bucket 0.
void ddpRound(int64_t ddp);
void ddpForget(int64_t ddp);

struct DdpMatch {
  enum class Kind : uint8_t {
    kNotDdp,  // the parameter belongs to no DDP delaycomm knows (or not on this group)
    kOther,   // in a DDP parameter's gradient accumulation, but not the reducer's reduction of its next bucket
    kUnused,  // the reducer's bucket, of a DDP with find_unused_parameters
    kBucket,  // the reducer's reduction of its next bucket
  };
  Kind kind = Kind::kNotDdp;
  std::string stream;
  int64_t consumer = -1;
};
// A floating SUM all-reduce `t` on group `group`, issued in the gradient accumulation of `param` (an AccumulateGrad
// node's variable), or with param null in DDP `shadow`'s join() shadow. Advances that DDP's round on a match.
DdpMatch matchDdpReduction(const c10::TensorImpl* param, int64_t shadow, const std::string& group, const at::Tensor& t);

}  // namespace delaycomm::owners
