#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <ATen/core/ivalue.h>
#include <c10/core/Event.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "delay/DeferredWork.hpp"
#include "stats/OpStats.hpp"

namespace delaycomm {

// The Work for a CPU op issued at once on the calling thread when nothing configured acts on this rank (the
// backend's fast path): a thin forward to the inner work. Its future is the inner work's own (completed by the
// inner backend with the output tensors or its error; no second future to complete), and a callback on it times
// the op, so that it behaves as a DeferredWorkCpu attached at once, at the cost of one callback.
//
// Threads: watch() once, right after construction; every other method from any thread.
class DirectWorkCpu : public c10d::Work {
 public:
  DirectWorkCpu(c10::intrusive_ptr<c10d::Work> inner, c10::intrusive_ptr<c10::ivalue::Future> innerFuture, OpKind op,
                uint64_t seq, std::shared_ptr<GroupStats> stats, Clock::time_point issuedAt,
                std::optional<CallTiming> call = std::nullopt);

  // Times the op when the inner future completes (the callback owns a reference to this work until then).
  void watch();

  bool isCompleted() override { return inner_->isCompleted(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return inner_->result(); }
  void synchronize() override {}  // CPU ops have nothing to synchronise with a stream
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void abort() override { inner_->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  float getDuration() const override { return inner_->getDuration(); }
  uint64_t getSequencenumber() const override { return seq_; }

 private:
  void recordCompletion(bool ok);

  const c10::intrusive_ptr<c10d::Work> inner_;
  const c10::intrusive_ptr<c10::ivalue::Future> future_;
  const OpKind op_;
  const uint64_t seq_;
  const std::shared_ptr<GroupStats> stats_;
  const Clock::time_point issuedAt_;
  const std::optional<CallTiming> call_;  // the caller's latency (docs/profile.md, "What is recorded")
  std::atomic<bool> recorded_{false};
};

// The Work for a CUDA op: the inner (NCCL) work is issued at once, stream-ordered; this wrapper only adds
// timing. A start event is recorded on the current stream before the op was issued; the end event is recorded
// on the current stream when the caller synchronises with the op (wait()/synchronize()), i.e. right after the
// current stream was made to wait for the collective. The pair goes to the group's stats (GroupStats'
// CudaTimings, shared with this work, so waiting after destroy_process_group is safe); harvestCudaTimings() folds
// completed pairs into the histograms later (when the next CUDA op is issued, and when stats are read or reset):
// the hot path never blocks the host. DELAYCOMM_TRACE records the call there too (stats/Trace.hpp,
// recordCudaCall), from `calledAt` for the GPU's time between the events; a work destroyed untimed is recorded then.
class TimedWorkCuda : public c10d::Work {
 public:
  TimedWorkCuda(c10::intrusive_ptr<c10d::Work> inner, OpKind op, uint64_t seq, std::shared_ptr<GroupStats> stats,
                std::optional<c10::Event> start, c10::Device device, int sizeClass = 0,
                Clock::time_point calledAt = Clock::now());
  ~TimedWorkCuda() override;

  bool isCompleted() override { return inner_->isCompleted(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return inner_->result(); }
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void abort() override { inner_->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return inner_->getFuture(); }
  float getDuration() const override { return inner_->getDuration(); }
  uint64_t getSequencenumber() const override { return seq_; }

 private:
  void recordEnd(bool ok);
  void recordUntimed(std::optional<bool> ok) const;  // DELAYCOMM_TRACE: a call whose GPU time is unknown

  c10::intrusive_ptr<c10d::Work> inner_;
  const OpKind op_;
  const uint64_t seq_;
  const std::shared_ptr<GroupStats> stats_;
  std::optional<c10::Event> start_;
  const c10::Device device_;
  const int sizeClass_;
  const Clock::time_point calledAt_;
  std::mutex mutex_;
  bool timed_ = false;
};

// A group of works issued inside one coalescing window (startCoalescing()/endCoalescing()): complete when all
// are. Inner backends that coalesce themselves (NCCL) contribute their one end-of-window work.
class CoalescedWork : public c10d::Work {
 public:
  explicit CoalescedWork(std::vector<c10::intrusive_ptr<c10d::Work>> works);
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void abort() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
};

}  // namespace delaycomm
