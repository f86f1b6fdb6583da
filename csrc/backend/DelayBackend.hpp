#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <c10/core/Event.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "backend/DelayWork.hpp"
#include "delay/IssuerThread.hpp"
#include "delay/Schedule.hpp"
#include "stale/StalenessEngine.hpp"
#include "stats/OpStats.hpp"

namespace delaycomm {

// Construction-time settings of a DelayBackend that C++ needs. The Python side validates the user's options
// (delaycomm.DelayConfig) and fills this.
struct BackendOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  std::string groupName;
  bool timeCuda = true;  // record CUDA events around GPU collectives (no host sync; harvested lazily)

  // Delay injection (SPEC §3-4). `delay` is a spec (delay/DelaySpec.hpp); "none" disables it.
  std::string delay = "none";
  double delayFraction = 0.0;          // per-call Bernoulli probability
  std::vector<int64_t> delayRanks;     // delayed ranks; empty = all
  std::vector<std::string> delayOps;   // delayed ops by OpStats name; empty = all
  bool delayOnHost = false;            // delay_where=host: the caller blocks; else network (the op is held back)
  uint64_t seed = 0;
  double slowdown = 1.0;               // this rank's compute slowdown factor K (>= 1; 1 = none)

  // Staleness (docs/staleness.md; stale/StalenessEngine.hpp). staleness: "bsp" (engine off), "ssp", "asp".
  std::string staleness = "bsp";
  int64_t staleBound = 0;
  std::string stalePolicy = "ema";
  double emaAlpha = 0.1;
  double stepMs = 0.0;  // <= 0: calibrated
  int64_t maxPending = 64;
  c10::intrusive_ptr<c10d::Store> store;  // the group's store (step calibration)
  // The engine's SSP gate wait and step agreement are bounded by `timeout` above (docs/staleness.md).
};

// DelayBackend: a c10d::Backend that routes every op by the device of its tensors to an inner backend built in
// Python (ProcessGroupGloo for CPU tensors, ProcessGroupNCCL for CUDA tensors) and measures each op.
//
// Contracts (as c10d's):
//  - Ordering: collectives must be called in the same order on every rank of the group; a DelayBackend issues
//    them to its inner backends in call order, so the inner groups see the same sequence on every rank.
//  - Threads: ops may be called from several threads; sequence numbers are assigned atomically at the call.
//  - Streams (CUDA): ops are issued at once on the inner NCCL backend's streams; nothing blocks the host.
//  - Ownership: the works the inner backends return keep their tensors alive; DelayWork keeps the inner work.
//  - Unsupported ops fail with "Backend delaycomm does not support <op> ...".
//  - Delay (when configured): op `seq` of kind k on rank r is delayed by schedule().delayNs(r, k, seq).
//    network + CPU: the op goes through the group's IssuerThread, which issues every CPU op in call order, each no
//    earlier than call time + delay; the caller gets its Work at once. network + GPU: a stream-ordered sleep
//    kernel before the collective (delay/GpuDelay.hpp); the host never blocks. host: the calling thread sleeps
//    before issuing. Slowdown K: before each op the caller sleeps (K - 1) x the time since its previous op
//    returned.
//  - Timeouts: every wait that delaycomm adds is bounded by the group's timeout (options.timeout) and ends in the
//    timeout error of delay/DelayTimeout.hpp: the host delay and the slowdown on the calling thread (the call
//    raises), an op held back by the issuer thread (its work and future fail), the GPU sleep kernel (capped, see
//    delay/GpuDelay.hpp).
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
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
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

  // Staleness (when configured): a SUM/AVG all-reduce of one floating tensor under an explicit key (DDP hook),
  // and flush(): delivers every pending contribution, one SUM all-reduce per key with any pending anywhere (one
  // SUM reduce-scatter for a reduce-scatter stream, which delivers this rank's shard) (collective: every rank
  // calls it at the same point); returns (key, delivered sum) pairs.
  c10::intrusive_ptr<c10d::Work> staleAllreduce(at::Tensor& tensor, uint64_t key, bool average);
  std::vector<std::pair<uint64_t, at::Tensor>> flush();
  StalenessEngine* staleness() { return stale_.get(); }

  // Telemetry. harvestCudaTimings() folds completed GPU event pairs into the histograms (never blocks).
  void harvestCudaTimings();
  GroupStats& stats() { return *stats_; }
  // The delay schedule of this group; null when no delay is configured.
  const DelaySchedule* schedule() const { return schedule_.get(); }
  // The delay of op `seq` of kind `op` on this rank, in ns (0: not delayed).
  int64_t delayNsFor(OpKind op, uint64_t seq) const;
  // CPU ops queued in (or being issued by) the issuer thread.
  size_t pendingDelayedOps() const { return issuer_ ? issuer_->pending() : 0; }
  void resetStats();
  const BackendOptions& options() const { return options_; }
  c10::intrusive_ptr<c10d::Backend> innerBackend(c10::DeviceType type) const;
  // Runs once, at the start of shutdown() (destroy_process_group); e.g. writes the stats file.
  void setShutdownHook(std::function<void()> hook);

 private:
  using IssueFn = std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend&)>;

  // Routes one op: picks the inner backend for `device`, counts it, issues it and wraps the inner work.
  // asyncOp: the c10d option of that name (false: the inner NCCL op may run on the current stream, so a GPU
  // delay must then be joined back into it).
  c10::intrusive_ptr<c10d::Work> run(OpKind op, c10::Device device, int64_t bytes, std::vector<at::Tensor> outputs,
                                     IssueFn issue, bool asyncOp = true, bool applyDelay = true);
  // The stale path of allreduce: blend in place (StalenessEngine::prepare), then one SUM all-reduce.
  c10::intrusive_ptr<c10d::Work> runStale(at::Tensor& tensor, uint64_t key, bool average,
                                          const c10d::AllreduceOptions& opts);
  // The stale path of _reduce_scatter_base (FSDP2's reduce-scatter): blend the full input in place
  // (StalenessEngine::prepareScaled), then one SUM reduce-scatter of the original size.
  c10::intrusive_ptr<c10d::Work> runStaleReduceScatter(at::Tensor& output, at::Tensor& input,
                                                       const c10d::ReduceScatterOptions& opts);
  // Whether reduction `op` of `tensors` goes through the staleness engine (see DelayBackend.cpp).
  bool staleEligible(OpKind op, const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& reduceOp) const;
  c10d::Backend& innerFor(OpKind op, c10::Device device);
  // Calls `issue` on `inner`, turning "does not support" errors into delaycomm's words; counts errors if asked.
  c10::intrusive_ptr<c10d::Work> issueOn(c10d::Backend& inner, OpKind op, c10::Device device, IssueFn& issue,
                                         bool countErrors);
  // Slowdown K: sleeps (K - 1) x the time since the previous op returned, on hostSleeper_, until `deadline` at
  // most (then raises the timeout error).
  void applySlowdown(OpKind op, uint64_t seq, Clock::time_point deadline);
  // Raises "the group was shut down while this call was held back by <what>" when a host sleep woke kClosed.
  void throwIfClosed(HostSleeper::Woke woke, OpKind op, uint64_t seq, const char* what) const;


  const c10::intrusive_ptr<c10d::Backend> cpuInner_;
  const c10::intrusive_ptr<c10d::Backend> cudaInner_;
  const BackendOptions options_;
  const std::shared_ptr<GroupStats> stats_;
  std::atomic<uint64_t> seq_{0};
  std::unique_ptr<DelaySchedule> schedule_;
  std::unique_ptr<StalenessEngine> stale_;
  std::array<bool, kNumOpKinds> delayOp_{};
  std::unique_ptr<IssuerThread> issuer_;  // CPU network delay only
  HostSleeper hostSleeper_;               // host delay and slowdown; closed by shutdown() and abort()
  std::atomic<int64_t> lastReturnNs_{-1};  // slowdown: when the previous op returned to its caller
  std::mutex hookMutex_;
  std::function<void()> shutdownHook_;

  // Coalescing window (c10d calls start/end from the thread that issues the window's ops).
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> coalescedWorks_;
  std::vector<c10d::Backend*> coalescingInners_;

  struct CudaPair {
    OpKind op;
    c10::Event start;
    c10::Event end;
  };
  // GPU event pairs waiting to be harvested. Shared with the works' harvest callbacks (DelayWorkCuda), which hold
  // it weakly: a work waited for after its group was destroyed must not reach into a freed backend.
  struct CudaTimings {
    std::mutex mutex;
    std::deque<CudaPair> pending;
  };
  const std::shared_ptr<CudaTimings> cudaTimings_ = std::make_shared<CudaTimings>();
};

}  // namespace delaycomm
