#include "stats/OpStats.hpp"

namespace delaycomm {

void OpStats::reset() {
  calls = 0;
  bytes = 0;
  delayedCalls = 0;
  errors = 0;
  untimed = 0;
  latencyNs.reset();
  delayNs.reset();
}

void StalenessStats::reset() {
  steps = 0;
  fresh = 0;
  stale = 0;
  dropped = 0;
  blockedNs = 0;
  stalenessSteps.reset();
}

void HostStats::reset() {
  slowdownCalls = 0;
  slowdownNs.reset();
}

void GroupStats::reset() {
  for (auto& op : ops_) {
    op.reset();
  }
  staleness_.reset();
  host_.reset();
}

}  // namespace delaycomm
