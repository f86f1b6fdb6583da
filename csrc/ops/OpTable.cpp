#include "ops/OpTable.hpp"

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace delaycomm {

namespace {

using c10d::OpType;

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13)
constexpr OpType kReduceScatterTensorCoalescedType = OpType::REDUCE_SCATTER_TENSOR_COALESCED;
#else
// NOTE: torch 2.11 (the GPU machine's) has no REDUCE_SCATTER_TENSOR_COALESCED op type yet.
constexpr OpType kReduceScatterTensorCoalescedType = OpType::COALESCED;
#endif

// clang-format off
constexpr std::array<OpInfo, kNumOpKinds> kOpTable = {{
    // kind                                   name                               work type                       reduces delayable aliases (torch.distributed)
    {OpKind::kBroadcast,                     "broadcast",                       OpType::BROADCAST,               false, true,  {}},
    {OpKind::kAllreduce,                     "allreduce",                       OpType::ALLREDUCE,               true,  true,  {"all_reduce"}},
    {OpKind::kAllreduceCoalesced,            "allreduce_coalesced",             OpType::ALLREDUCE_COALESCED,     true,  true,  {"all_reduce_coalesced"}},
    {OpKind::kReduce,                        "reduce",                          OpType::REDUCE,                  true,  true,  {}},
    {OpKind::kAllgather,                     "allgather",                       OpType::ALLGATHER,               false, true,  {"all_gather"}},
    {OpKind::kAllgatherBase,                 "_allgather_base",                 OpType::_ALLGATHER_BASE,         false, true,  {"all_gather_into_tensor", "all_gather_single"}},
    {OpKind::kAllgatherCoalesced,            "allgather_coalesced",             OpType::ALLGATHER_COALESCED,     false, true,  {"all_gather_coalesced"}},
    {OpKind::kAllgatherIntoTensorCoalesced,  "allgather_into_tensor_coalesced", OpType::COALESCED,               false, true,  {}},
    {OpKind::kGather,                        "gather",                          OpType::GATHER,                  false, true,  {}},
    {OpKind::kScatter,                       "scatter",                         OpType::SCATTER,                 false, true,  {}},
    {OpKind::kReduceScatter,                 "reduce_scatter",                  OpType::REDUCE_SCATTER,          true,  true,  {}},
    {OpKind::kReduceScatterBase,             "_reduce_scatter_base",            OpType::_REDUCE_SCATTER_BASE,    true,  true,  {"reduce_scatter_tensor", "reduce_scatter_single"}},
    {OpKind::kReduceScatterTensorCoalesced,  "reduce_scatter_tensor_coalesced", kReduceScatterTensorCoalescedType, true, true, {}},
    {OpKind::kAlltoallBase,                  "alltoall_base",                   OpType::ALLTOALL_BASE,           false, true,  {"all_to_all_single"}},
    {OpKind::kAlltoall,                      "alltoall",                        OpType::ALLTOALL,                false, true,  {"all_to_all"}},
    {OpKind::kSend,                          "send",                            OpType::SEND,                    false, true,  {"isend"}},
    {OpKind::kRecv,                          "recv",                            OpType::RECV,                    false, true,  {"irecv"}},
    {OpKind::kRecvAnysource,                 "recv_anysource",                  OpType::RECVANYSOURCE,           false, true,  {}},
    {OpKind::kBarrier,                       "barrier",                         OpType::BARRIER,                 false, true,  {}},
    {OpKind::kCoalesced,                     "coalesced",                       OpType::COALESCED,               false, false, {}},
}};
// clang-format on

constexpr bool inKindOrder() {
  for (int i = 0; i < kNumOpKinds; ++i) {
    if (static_cast<int>(kOpTable[i].kind) != i) {
      return false;
    }
  }
  return true;
}
static_assert(inKindOrder(), "kOpTable must list one row per OpKind, in OpKind's order");

}  // namespace

const std::array<OpInfo, kNumOpKinds>& opTable() {
  return kOpTable;
}

const char* opName(OpKind op) {
  const int i = static_cast<int>(op);
  return (i >= 0 && i < kNumOpKinds) ? kOpTable[i].name : "unknown";
}

bool opFromName(const std::string& name, OpKind* out) {
  for (const auto& row : kOpTable) {
    if (name == row.name) {
      *out = row.kind;
      return true;
    }
  }
  return false;
}

}  // namespace delaycomm
