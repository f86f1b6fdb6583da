#pragma once

#include <string>

namespace delaycomm {

// Which FSDP2 parameter group the calling thread is reducing, if any (docs/staleness.md, "Keys for
// reduce-scatter").
//
// FSDP2 (torch.distributed.fsdp.fully_shard) allocates a new reduce-scatter input and output on every step, so
// storage identity never recurs for them; what recurs, identically on every rank, is the parameter group. FSDP2
// issues each group's gradient reduction (the reduce-scatter, and under HSDP the all-reduce across replicas) inside
// `torch.profiler.record_function("FSDP::post_backward_reduce (<module fqn>)")`. While any staleness engine
// lives, a RecordFunction callback (USER_SCOPE only: aten ops keep their fast path) tracks the innermost such
// scope of each thread, so a reduction issued inside it can be keyed by the module's fully qualified name.
//
// Threads: the scope is thread-local (FSDP2 issues the reduction on the thread that entered the scope: the
// autograd thread running its post-backward hook). acquire/release are thread-safe and reference-counted: the
// callback is installed by the first engine and removed with the last.
// NOTE: the scope name is FSDP2's profiler label, not a public API; tests/stale/test_fsdp.py runs real FSDP2 so
// that a torch release which renames it fails there (the reduce-scatters then fall back to storage keys, which do
// not recur, and the engine warns once that staleness cannot engage).
namespace fsdp_scope {

// The label prefix of FSDP2's gradient reduction scope.
inline constexpr const char* kReduceLabel = "FSDP::post_backward_reduce";

void acquire();
void release();

// The innermost FSDP2 reduction scope of this thread ("FSDP::post_backward_reduce (layers.0)"), or nullptr.
const std::string* current();
// Marks that a stale reduce-scatter was issued in the current scope (HSDP: an all-reduce after it is the
// replicas').
void noteReduceScatter();
// Whether a stale reduce-scatter was issued in the current scope.
bool reduceScattered();

}  // namespace fsdp_scope

}  // namespace delaycomm
