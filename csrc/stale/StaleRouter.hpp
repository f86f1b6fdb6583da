#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "ops/OpTable.hpp"
#include "stale/Recognition.hpp"

namespace delaycomm {

class DelayInjector;
class StalenessEngine;

// How one reduction is routed under ssp/asp (docs/staleness.md, "Which reductions go stale").
struct StaleRoute {
  bool stale = false;        // through the staleness engine; else the delayed bsp path
  uint64_t key = 0;          // the stream (stale only)
  double resultScale = 1.0;  // the stream's result scale: 1 (SUM), 1 / N (AVG), f (PREMUL_SUM(f))
  bool scatter = false;      // a reduce-scatter stream
  const char* whyNot = "";   // why it is not stale, in words (not stale only)
  // Not stale although staleness could take the op: not a data-parallel gradient reduction (stale/Recognition.hpp).
  // The backend counts it (kept_fresh_calls) and warns once per reason.
  bool keptFresh = false;
  GradientRecognizer::Reason reason = GradientRecognizer::Reason::kGradient;
  std::string node;      // the autograd node that issued it (GradientRecognizer::Reason::kOtherAutogradNode)
  std::string detail;    // the stream and what it had deferred (GradientRecognizer::Reason::kNotConsumed)
  bool mayDefer = true;  // stale only: false while a recognised stream is on probation (StalenessEngine::admit)
};

// The one place that decides whether a reduction goes stale, and as which stream: the seam where what counts as a
// data-parallel gradient reduction is recognised. The backend asks it for every reduction it could route to the
// staleness engine (all_reduce, _reduce_scatter_base, stale_allreduce) and follows the route: stale, or the delayed
// bsp path (docs/core.md).
//
// The rule: a reduction goes stale when its op can be late at all (the delay schedule is active and the op is
// among delay_ops: delay_ops=broadcast leaves all-reduces bsp), it is a SUM/AVG of one dense floating tensor
// outside a coalescing window, or for _reduce_scatter_base also a PREMUL_SUM by a number, and it is a data-parallel
// gradient reduction of a known owner (GradientRecognizer, stale/Recognition.hpp) that passes the runtime check
// (StalenessEngine::admit), or names an explicit key (stale_allreduce). Its stream is the explicit key, else the
// recognised stream's. A reduction that could be late but is not such a gradient reduction is kept fresh
// (keptFresh): it runs the delayed bsp path.
//
// Threads: classify() on the calling thread of the collective (the decision depends on it: the owners' scopes and
// the autograd node are the thread's); it takes the engine's lock only to admit a recognised stream.
class StaleRouter {
 public:
  StaleRouter(StalenessEngine& engine, const DelayInjector& injector, int size);

  // tensors: the reduction's input(s) (for _reduce_scatter_base, the full input). explicitKey: stale_allreduce's.
  StaleRoute classify(OpKind op, const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& reduceOp,
                      bool coalescing, std::optional<uint64_t> explicitKey = std::nullopt);

 private:
  // Shape checks: why the engine cannot blend this reduction (nullptr: it can); sets the result scale.
  const char* unblendable(OpKind op, const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& reduceOp,
                          bool coalescing, StaleRoute& route) const;

  GradientRecognizer recognizer_;
  StalenessEngine& engine_;
  const DelayInjector& injector_;
  const int size_;
};

}  // namespace delaycomm
