#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <ATen/core/ivalue.h>
#include <c10/core/Event.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "stats/OpStats.hpp"

namespace delaycomm {

using Clock = std::chrono::steady_clock;

// The Work a DelayBackend hands to its caller for a CPU op.
//
// Phases (as c10d's Works): the backend checks inputs and creates this Work at once; the inner Work is attached
// when the op is issued to the inner backend, which may be later (an issuer thread holds delayed ops back, in
// call order); wait() blocks until the inner op is attached, then waits on it (its errors and timeouts surface
// here unchanged). The own future completes with the inner future's value (the output tensors) or its error.
//
// Held back (delay_where=network): wait() without a timeout still waits no longer than the group's timeout for
// the op to be issued, then raises a timeout error (DistBackendError, delay/DelayTimeout.hpp) naming the injected
// delay: a delay longer than the timeout is a timeout, never a hang. The same holds for the future (what DDP
// waits on): an op still held back at its call time + the group's timeout expires (expire(), from the issuer
// thread), and the work fails with that error for good (wait(), result(), the future, exception()), although the
// op itself is still issued at its release time so that every rank issues the same sequence.
//
// Inner works without a future (Gloo's send/recv) are timed when wait() returns, and getFuture() reports that
// the op has none, exactly as the inner backend would.
//
// Threads: attach()/fail() are called once, from the issuing thread; expire() from the issuer thread; every
// other method from any thread. The own future completes on the inner backend's thread that completes the inner
// future (as the inner backend's own futures do), or on the thread that waits (no inner future), but never on a
// thread that releases held-back ops (delay/IssuerThread.hpp: its callbacks are user code that may issue a
// collective and wait for it): there, when the inner op completed before it was attached, or when the op failed,
// expired or was cancelled, torch's inter-op pool (at::launch) completes it, or a thread of its own (dc-callbacks)
// when every pool thread may be held by a blocking callback handed to it before (docs/core.md "Threads").
class DelayWorkCpu : public c10d::Work {
 public:
  DelayWorkCpu(OpKind op, uint64_t seq, std::shared_ptr<GroupStats> stats, Clock::time_point issuedAt,
               std::vector<at::Tensor> outputs, std::chrono::milliseconds groupTimeout = kNoTimeout,
               int64_t delayNs = 0, std::optional<CallTiming> call = std::nullopt);
  ~DelayWorkCpu() override;

  // Hand over the inner work (once). Completion of the inner future completes this work's future.
  void attach(c10::intrusive_ptr<c10d::Work> inner);
  // The op could not be issued (the inner backend threw): the error reaches wait() and the future.
  void fail(std::exception_ptr error);
  // The op is still held back at its call time + the group's timeout: the work fails with the timeout error (a
  // no-op once the op was issued). A later attach() is accepted and its outcome ignored.
  void expire();

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void abort() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  float getDuration() const override;  // the inner work's (enableCollectivesTiming), once the op was issued
  uint64_t getSequencenumber() const override { return seq_; }

 private:
  // Waits until attach() or fail() ran; false on timeout.
  bool waitAttached(std::chrono::milliseconds timeout);
  // waitAttached() bounded by `timeout`, or by the group's timeout when none is given; raises on expiry.
  void waitAttachedOrThrow(std::chrono::milliseconds timeout, const char* method);
  void recordCompletion(bool ok);
  // Completes the own future once: with `value`, or with `error` when set. Whoever comes first wins. On a thread
  // that releases held-back ops, the inter-op pool completes it (see Threads above).
  void settleFuture(const c10::IValue& value, std::exception_ptr error);
  // The text of the held-back timeout, `heldMs` after the call.
  std::string heldBackCause(int64_t heldMs) const;

  const OpKind op_;
  const uint64_t seq_;
  const std::shared_ptr<GroupStats> stats_;
  const Clock::time_point issuedAt_;
  const std::vector<at::Tensor> outputs_;  // keeps the caller's outputs alive until completion
  const std::chrono::milliseconds groupTimeout_;
  const int64_t delayNs_;
  const std::optional<CallTiming> call_;  // the caller's latency (docs/profile.md, "What is recorded")

  mutable std::mutex mutex_;
  std::condition_variable attachedCv_;
  bool attached_ = false;
  bool recorded_ = false;
  bool futureSettled_ = false;
  std::exception_ptr expired_;  // the timeout error, once expired
  bool innerHasFuture_ = false;
  c10::intrusive_ptr<c10d::Work> inner_;
  std::exception_ptr error_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// The Work for a CPU op issued at once on the calling thread when nothing configured acts on this rank (the
// backend's fast path): a thin forward to the inner work. Its future is the inner work's own (completed by the
// inner backend with the output tensors or its error; no second future to complete), and a callback on it times
// the op, so that it behaves as a DelayWorkCpu attached at once, at the cost of one callback.
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
// the hot path never blocks the host.
class DelayWorkCuda : public c10d::Work {
 public:
  DelayWorkCuda(c10::intrusive_ptr<c10d::Work> inner, OpKind op, uint64_t seq, std::shared_ptr<GroupStats> stats,
                std::optional<c10::Event> start, c10::Device device, int sizeClass = 0);
  ~DelayWorkCuda() override;

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
  void recordEnd();

  c10::intrusive_ptr<c10d::Work> inner_;
  const OpKind op_;
  const uint64_t seq_;
  const std::shared_ptr<GroupStats> stats_;
  std::optional<c10::Event> start_;
  const c10::Device device_;
  const int sizeClass_;
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
