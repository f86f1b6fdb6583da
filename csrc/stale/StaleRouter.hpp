#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "ops/OpTable.hpp"

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
};

// The one place that decides whether a reduction goes stale, and as which stream: the seam where what counts as a
// data-parallel gradient reduction is recognised. The backend asks it for every reduction it could route to the
// staleness engine (all_reduce, _reduce_scatter_base, stale_allreduce) and follows the route: stale, or the delayed
// bsp path (docs/core.md).
//
// Today's rule: a reduction goes stale when its op can be late at all (the delay schedule is active and the op is
// among delay_ops: delay_ops=broadcast leaves all-reduces bsp), and it is a SUM/AVG of one dense floating tensor
// outside a coalescing window, or for _reduce_scatter_base also a PREMUL_SUM by a number. Its stream is the
// explicit key when the caller names one, else the engine's (StalenessEngine::streamKey: FSDP2 scope or storage
// identity).
//
// Threads: classify() on the calling thread of the collective (the key may depend on it: FSDP2's scope is
// thread-local); it takes the engine's lock only to look up a key.
class StaleRouter {
 public:
  StaleRouter(StalenessEngine& engine, const DelayInjector& injector, int size);

  // tensors: the reduction's input(s) (for _reduce_scatter_base, the full input). explicitKey: stale_allreduce's.
  StaleRoute classify(OpKind op, const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& reduceOp,
                      bool coalescing, std::optional<uint64_t> explicitKey = std::nullopt) const;

 private:
  StalenessEngine& engine_;
  const DelayInjector& injector_;
  const int size_;
};

}  // namespace delaycomm
