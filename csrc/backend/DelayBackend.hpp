#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Event.h>
#include <c10/util/FunctionRef.h>
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "backend/DelayWork.hpp"
#include "delay/DelayInjector.hpp"
#include "delay/Schedule.hpp"
#include "stale/StaleOptions.hpp"
#include "stale/StaleRouter.hpp"
#include "stale/StalenessEngine.hpp"
#include "stats/OpStats.hpp"

namespace delaycomm {

// Construction-time settings of a DelayBackend. Typed and already validated: Python's delaycomm._config checks the
// user's values once (its messages name the option, where the value came from and what is accepted) and
// delaycomm._backend fills this; C++ only asserts what it relies on.
struct BackendOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  std::string groupName;
  bool timeCuda = true;  // record CUDA events around GPU collectives (no host sync; harvested lazily)

  // Delay injection (docs/delay.md; delay/DelayOptions.hpp): the parsed spec and how it is applied. Its size,
  // timeout and group name are the group's (above).
  DelayOptions delay;

  // Staleness (docs/staleness.md; stale/StalenessEngine.hpp): mode bsp leaves the engine off. Its timeout and
  // group name are the group's (above).
  StalenessOptions stale;
  c10::intrusive_ptr<c10d::Store> store;  // the group's store (the ranks' agreement); required unless bsp
};

// DelayBackend: a c10d::Backend that routes every op by the device of its tensors to an inner backend built in
// Python (ProcessGroupGloo for CPU tensors, ProcessGroupNCCL for CUDA tensors) and measures each op. A thin
// front (docs/core.md): each override checks its arguments and forwards through one helper, run(); delays are
// the DelayInjector's (delay/DelayInjector.hpp), staleness the StalenessEngine's (stale/StalenessEngine.hpp),
// telemetry the GroupStats' (stats/OpStats.hpp), every op named by the one op table (ops/OpTable.hpp).
//
// Contracts (as c10d's):
//  - Ordering: collectives must be called in the same order on every rank of the group; a DelayBackend issues
//    them to its inner backends in call order, so the inner groups see the same sequence on every rank.
//  - Threads: ops may be called from several threads; sequence numbers are assigned atomically at the call.
//  - Streams (CUDA): ops are issued at once on the inner NCCL backend's streams; nothing blocks the host.
//  - Ownership: the works the inner backends return keep their tensors alive; delaycomm's works keep the inner
//    work and share the group's stats (never the backend), so a work may outlive its group.
//  - Unsupported ops fail with "Backend delaycomm does not support <op> ...".
//  - Cost: with nothing configured that acts on this rank (no delay targets it, no slowdown), a CPU op is issued
//    in place and returned in a DirectWorkCpu (the fast path: docs/benchmark.md has its measured cost).
//  - Delay (when configured): see DelayInjector. Timeouts: every wait that delaycomm adds is bounded by the
//    group's timeout (options.timeout) and ends in the timeout error of delay/DelayTimeout.hpp.
//  - Lifecycle: shutdown() (destroy_process_group) wakes every caller sleeping in a host delay or slowdown (their
//    calls raise: the op was not issued), issues every held-back op at once (in order) and joins the issuer
//    thread, all before the inner backends shut down; it never waits out a delay. abort() fails the held-back ops
//    instead. The destructor does what shutdown() does when shutdown() did not run (interpreter exit without
//    destroy_process_group), and may run on any thread, the issuer thread included.
class DelayBackend : public c10d::Backend {
 public:
  DelayBackend(int rank, int size, c10::intrusive_ptr<c10d::Backend> cpuInner,
               c10::intrusive_ptr<c10d::Backend> cudaInner, BackendOptions options);
  ~DelayBackend() override;

  const std::string getBackendName() const override { return "delaycomm"; }
  c10::intrusive_ptr<Options> getBackendOptions() override;
  bool supportsSplitting() const override { return false; }
  bool supportsCoalescing() const override { return true; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;

  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

  void abort() override;
  void shutdown() override;

  // Forwarded to the inner backends, as c10d's ProcessGroupWrapper forwards to the backend it wraps
  // (DelayForward.cpp). Both (Gloo and NCCL implement them): setTimeout(), which also bounds delaycomm's own waits
  // of the ops called after it (DelayInjector::timeout()), and enableCollectivesTiming() (then a work's
  // getDuration() is its inner work's). The NCCL backend's only, when the group has one (else c10d's "does not
  // support" error naming delaycomm): waitForPendingWorks, getError, getMemAllocator, allocateTensor (CUDA
  // options), supportsTensorAlloc, eagerConnectSingleDevice (a CUDA device), suspend, resume, getMemoryStats.
  // NOTE: registerOnCompletionHook is not forwarded: c10d's destroy waits for pending hooks only when the
  // group's own backend has one (Backend::hasHooks() is not virtual), so hooks on the inner NCCL backend could
  // run after the interpreter has gone.
  void setTimeout(std::chrono::milliseconds timeout) override;
  void enableCollectivesTiming() override;
  void waitForPendingWorks() override;
  c10d::ErrorType getError() override;
  std::shared_ptr<c10::Allocator> getMemAllocator() override;
  at::Tensor allocateTensor(long size, at::TensorOptions options = {}) override;
  bool supportsTensorAlloc(c10::DeviceIndex deviceIdx) override;
  void eagerConnectSingleDevice(at::Device device) override;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 12)
  // NOTE: Backend has these since torch 2.12 (docs/install.md, "Supported torch releases").
  void suspend() override;
  void resume() override;
  std::unordered_map<std::string, uint64_t> getMemoryStats() override;
#endif

  // Staleness (when configured): a SUM/AVG all-reduce of one floating tensor as one step of stream `key`
  // (stale_allreduce), or with no key as a recognised gradient reduction (delaycomm.ddp_hook: the DDP bucket scope
  // names its stream; kept fresh where none does), and flush(): delivers every pending contribution, one SUM
  // all-reduce per stream with any pending anywhere (one SUM reduce-scatter for a reduce-scatter stream, which
  // delivers this rank's shard) (collective: every rank calls it at the same point; docs/staleness.md, "flush").
  c10::intrusive_ptr<c10d::Work> staleAllreduce(at::Tensor& tensor, std::optional<uint64_t> key, bool average);
  std::vector<StalenessEngine::FlushStream> flush();
  // A SUM all-reduce that is part of flush (HSDP's and HYBRID_SHARD's all-reduce of a flushed shard across the
  // replicas, python/delaycomm/_fsdp.py): no staleness and no delay, like flush's own reductions. Waits for it.
  void flushAllreduce(at::Tensor& tensor);
  // One reduction of flush (SUM all-reduce, or reduce-scatter: this rank's shard), no staleness, no delay; waits for
  // it.
  at::Tensor flushReduce(at::Tensor local, bool scatter);
  // (this rank's pending stale contributions, the group's); zeros under bsp.
  std::pair<int64_t, int64_t> stalePending() const;
  // The stale:fresh ratio over the engine's recent window; 0 under bsp.
  double staleWindowedRatio() const;
  // Called with each one-time warning of the staleness engine (StalenessEngine::onWarn); ignored under bsp.
  void setStaleWarningHook(std::function<void(const std::string&)> hook);

  // Telemetry. harvestCudaTimings() folds completed GPU event pairs into the histograms (never blocks).
  void harvestCudaTimings() { stats_->harvestCudaTimings(); }
  // delaycomm.stats() of this group (stats/Telemetry.hpp): the completed CUDA timings folded in, then the group's
  // counters and the staleness engine's values.
  GroupTelemetry telemetry();
  // The delay schedule of this group; null when no delay is configured.
  const DelaySchedule* schedule() const { return injector_->schedule(); }
  // The delay of op `seq` of kind `op` on this rank, in ns (0: not delayed).
  int64_t delayNsFor(OpKind op, uint64_t seq, int64_t bytes = -1) const;
  // CPU ops queued in (or being issued by) the issuer thread.
  size_t pendingDelayedOps() const { return injector_->pending(); }
  void resetStats();
  const BackendOptions& options() const { return options_; }
  c10::intrusive_ptr<c10d::Backend> innerBackend(c10::DeviceType type) const;
  // Runs once, at the start of shutdown() (destroy_process_group); e.g. writes the stats file.
  void setShutdownHook(std::function<void()> hook);

 private:
  using IssueFn = std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend&)>;
  using IssueRef = c10::function_ref<c10::intrusive_ptr<c10d::Work>(c10d::Backend&)>;

  // The one helper every op forwards through: picks the inner backend for `device`, counts the op, issues it
  // with `issue` (a callable taking the inner backend, owning copies of its arguments) and wraps the inner work.
  // asyncOp: the c10d option of that name (false: the inner NCCL op may run on the current stream, so a GPU
  // delay must then be joined back into it). applyDelay: false for ops the staleness engine already delayed.
  // NOTE: a template so that the fast path (CPU, nothing configured that acts on this rank: see fastPath_)
  // calls `issue` in place; only the general path (delays, slowdown, coalescing, CUDA timing) stores it.
  template <typename Issue>
  c10::intrusive_ptr<c10d::Work> run(OpKind op, c10::Device device, int64_t bytes,
                                     const std::vector<at::Tensor>& outputs, Issue&& issue, bool asyncOp = true,
                                     bool applyDelay = true) {
    if (fastPath_ && !coalescing_ && device.is_cpu()) {
      return runDirect(op, device, bytes, outputs, IssueRef(issue));
    }
    return runGeneral(op, device, bytes, outputs, IssueFn(std::forward<Issue>(issue)), asyncOp, applyDelay);
  }
  // The fast path: issue on the calling thread, wrap in a DirectWorkCpu (DelayRun.cpp).
  c10::intrusive_ptr<c10d::Work> runDirect(OpKind op, c10::Device device, int64_t bytes,
                                           const std::vector<at::Tensor>& outputs, IssueRef issue);
  // Everything else: slowdown, delay (host, CPU issuer thread, GPU sleep kernel), coalescing, CUDA timing.
  c10::intrusive_ptr<c10d::Work> runGeneral(OpKind op, c10::Device device, int64_t bytes,
                                            const std::vector<at::Tensor>& outputs, IssueFn issue, bool asyncOp,
                                            bool applyDelay);
  // The caller's work for a CPU op issued at once: a DirectWorkCpu, or a DeferredWorkCpu when the inner work has
  // no future (Gloo's send/recv: timed in wait()).
  c10::intrusive_ptr<c10d::Work> wrapIssuedCpu(c10::intrusive_ptr<c10d::Work> innerWork, OpKind op, uint64_t seq,
                                               Clock::time_point calledAt, const std::vector<at::Tensor>& outputs,
                                               const CallTiming& call);
  // The stale path (backend/StalePath.cpp), for a reduction that staleRouter_ routed there. allreduce: blend in
  // place (StalenessEngine::prepareScaled), then one SUM all-reduce.
  c10::intrusive_ptr<c10d::Work> runStaleAllreduce(const StaleRoute& route, at::Tensor& tensor,
                                                   const c10d::AllreduceOptions& opts);
  // _reduce_scatter_base (FSDP2's reduce-scatter): blend the full input in place, then one SUM reduce-scatter of
  // the original size (checkStaleReduceScatter first).
  c10::intrusive_ptr<c10d::Work> runStaleReduceScatter(const StaleRoute& route, at::Tensor& output, at::Tensor& input,
                                                       const c10d::ReduceScatterOptions& opts);
  void checkStaleReduceScatter(const at::Tensor& output, const at::Tensor& input) const;
  // A reduction staleness could take but kept fresh (not a gradient reduction: route.keptFresh): counted in
  // kept_fresh_calls, warned about once per reason and group (docs/staleness.md, "Which reductions go stale").
  void keptFresh(OpKind op, const std::vector<at::Tensor>& tensors, const StaleRoute& route);
  // Counts a stale step's delay in the op's stats (delayed_calls, stale_calls).
  void countStale(OpKind op, const StalenessEngine::StepInfo& info);
  c10d::Backend& innerFor(OpKind op, c10::Device device);
  // Drops the reference to the inner Gloo backend: its worker threads stop and are joined when it was the last.
  void releaseGloo();
  // Calls `issue` on `inner`, turning "does not support" errors into delaycomm's words; counts errors if asked.
  c10::intrusive_ptr<c10d::Work> issueOn(c10d::Backend& inner, OpKind op, c10::Device device, IssueRef issue,
                                         bool countErrors);
  // Numbers and counts one op (its group sequence number, calls, bytes); returns the sequence number.
  // Counts the call; returns its sequence number in the group. *drawSeq (when given): the position the delay
  // schedule draws it at: for a collective the count of the group's collectives (calls every rank makes, so that
  // the ranks agree on a call's carrier after point-to-point calls: docs/delay.md, "Match mode"), for a
  // point-to-point op the sequence number.
  uint64_t admit(OpKind op, int64_t bytes, uint64_t* drawSeq = nullptr);

  // Released by shutdown() (see there): null afterwards.
  c10::intrusive_ptr<c10d::Backend> cpuInner_;
  bool glooReleased_ = false;
  const c10::intrusive_ptr<c10d::Backend> cudaInner_;
  const BackendOptions options_;
  const std::shared_ptr<GroupStats> stats_;
  std::atomic<uint64_t> seq_{0};
  std::atomic<uint64_t> collectiveSeq_{0};   // admit(): the group's collectives (not send/recv)
  std::unique_ptr<DelayInjector> injector_;  // before stale_, which reads its schedule
  // Nothing configured acts on this rank's ops (!injector_->engaged()): CPU ops take runDirect().
  bool fastPath_ = true;
  std::unique_ptr<StalenessEngine> stale_;    // null under bsp
  std::unique_ptr<StaleRouter> staleRouter_;  // with stale_: which reductions go stale
  std::array<std::atomic<bool>, GradientRecognizer::kNumReasons> freshWarned_{};
  std::mutex hookMutex_;
  std::function<void()> shutdownHook_;

  // Coalescing window (c10d calls start/end from the thread that issues the window's ops).
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> coalescedWorks_;
  std::vector<c10d::Backend*> coalescingInners_;
};

}  // namespace delaycomm
