// The policy math of one step (stale/Weights.hpp; docs/staleness.md, "The model").

#include "stale/Weights.hpp"

namespace delaycomm {

BlendWeights stepWeights(StalePolicy policy, double alpha, int64_t size, int64_t nFresh, int64_t nStale, bool mineFresh,
                         double resultScale) {
  const double n = static_cast<double>(size);
  BlendWeights w;
  switch (policy) {
    case StalePolicy::kApply:
      w.fresh = mineFresh ? 1.0 : 0.0;
      w.stale = 1.0;
      break;
    case StalePolicy::kDrop:
      w.fresh = (mineFresh && nFresh > 0) ? n / static_cast<double>(nFresh) : 0.0;
      break;
    case StalePolicy::kEma:
      if (nStale > 0 && nFresh > 0) {
        w.fresh = mineFresh ? n * (1.0 - alpha) / static_cast<double>(nFresh) : 0.0;
        w.stale = n * alpha / static_cast<double>(nStale);
      } else if (nStale > 0) {
        w.stale = n / static_cast<double>(nStale);
      } else {
        w.fresh = (mineFresh && nFresh > 0) ? n / static_cast<double>(nFresh) : 0.0;
      }
      break;
  }
  w.fresh *= resultScale;
  w.stale *= resultScale;
  return w;
}

double flushScale(StalePolicy policy, int64_t size, int64_t pendingGlobal, double resultScale) {
  const double scale = policy == StalePolicy::kEma && pendingGlobal > 0
                           ? static_cast<double>(size) / static_cast<double>(pendingGlobal)
                           : 1.0;
  return scale * resultScale;
}

}  // namespace delaycomm
