#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace c10d {
enum class OpType : std::uint8_t;  // torch/csrc/distributed/c10d/Work.hpp (kept out of this light header)
}  // namespace c10d

namespace delaycomm {

// Every operation a DelayBackend forwards. The one table of ops (OpTable.cpp, one row per kind, in this order)
// says what each is; telemetry, the works, the Python options (delay_ops) and the benchmark read it, in Python
// through delaycomm._C.op_table().
enum class OpKind : int {
  kBroadcast = 0,
  kAllreduce,
  kAllreduceCoalesced,
  kReduce,
  kAllgather,
  kAllgatherBase,
  kAllgatherCoalesced,
  kAllgatherIntoTensorCoalesced,
  kGather,
  kScatter,
  kReduceScatter,
  kReduceScatterBase,
  kReduceScatterTensorCoalesced,
  kAlltoallBase,
  kAlltoall,
  kSend,
  kRecv,
  kRecvAnysource,
  kBarrier,
  kCoalesced,
  kCount  // not an op
};

constexpr int kNumOpKinds = static_cast<int>(OpKind::kCount);

// One row of the table.
struct OpInfo {
  OpKind kind;
  // The name in telemetry (delaycomm.stats()["ops"]) and in delay_ops: the c10d Backend method's name.
  const char* name;
  // The OpType of the works of this op (what c10d's Work::retrieveOpType() says).
  c10d::OpType workType;
  // The op takes a ReduceOp.
  bool reduces;
  // delay_ops may name it (the coalescing window's own work is not an op of its own).
  bool delayable;
  // torch.distributed's function names for it, accepted by delay_ops as well (nullptr: none).
  std::array<const char*, 3> aliases;
};

const std::array<OpInfo, kNumOpKinds>& opTable();
inline const OpInfo& opInfo(OpKind op) {
  return opTable()[static_cast<int>(op)];
}
const char* opName(OpKind op);  // "unknown" outside the table
// Inverse of opName (names only, not aliases); returns false when the name is unknown.
bool opFromName(const std::string& name, OpKind* out);

}  // namespace delaycomm
