#include "stats/OpStats.hpp"

namespace delaycomm {

namespace {
constexpr std::array<const char*, kNumOpKinds> kOpNames = {
    "broadcast",
    "allreduce",
    "allreduce_coalesced",
    "reduce",
    "allgather",
    "_allgather_base",
    "allgather_coalesced",
    "allgather_into_tensor_coalesced",
    "gather",
    "scatter",
    "reduce_scatter",
    "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced",
    "alltoall_base",
    "alltoall",
    "send",
    "recv",
    "recv_anysource",
    "barrier",
    "coalesced",
};
}  // namespace

const char* opName(OpKind op) {
  const int i = static_cast<int>(op);
  return (i >= 0 && i < kNumOpKinds) ? kOpNames[i] : "unknown";
}

bool opFromName(const std::string& name, OpKind* out) {
  for (int i = 0; i < kNumOpKinds; ++i) {
    if (name == kOpNames[i]) {
      *out = static_cast<OpKind>(i);
      return true;
    }
  }
  return false;
}

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
