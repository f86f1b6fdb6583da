#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "stats/OpStats.hpp"

namespace delaycomm {

using Clock = std::chrono::steady_clock;

// The Work of a CPU op whose inner work is attached after the caller got it, with a future of its own: an op held
// back by the issuer thread (DelayInjector, delay_where=network), attached when the op is issued; and an op
// issued at once whose inner work has no future (Gloo's send/recv, delayed or not), attached at once.
//
// Phases (as c10d's Works): the caller checks inputs and creates this Work at once; the inner Work is attached
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
// Inner works without a future (Gloo's send/recv) are timed when wait() returns, and the own future completes
// there, with the output tensors.
//
// Threads: attach()/fail() are called once, from the issuing thread; expire() from the issuer thread; every
// other method from any thread. The own future completes on the inner backend's thread that completes the inner
// future (as the inner backend's own futures do), or on the thread that waits (no inner future), but never on a
// thread that releases held-back ops (delay/IssuerThread.hpp: its callbacks are user code that may issue a
// collective and wait for it): there, when the inner op completed before it was attached, or when the op failed,
// expired or was cancelled, torch's inter-op pool (at::launch) completes it, or a thread of its own (dc-callbacks)
// when every pool thread may be held by a blocking callback handed to it before (docs/core.md "Threads").
class DeferredWorkCpu : public c10d::Work {
 public:
  DeferredWorkCpu(OpKind op, uint64_t seq, std::shared_ptr<GroupStats> stats, Clock::time_point issuedAt,
                  std::vector<at::Tensor> outputs, std::chrono::milliseconds groupTimeout = kNoTimeout,
                  int64_t delayNs = 0, std::optional<CallTiming> call = std::nullopt);
  ~DeferredWorkCpu() override;

  // Hand over the inner work (once). Completion of the inner future completes this work's future.
  void attach(c10::intrusive_ptr<c10d::Work> inner);
  // The op could not be issued (the inner backend threw): the error reaches wait() and the future.
  void fail(std::exception_ptr error);
  // The op is still held back at its call time + the group's timeout: the work fails with the timeout error (a
  // no-op once the op was issued). A later attach() is accepted and its outcome ignored.
  void expire();
  // How long the ops queued ahead of it held it past its own release (IssuerThread::Queued): left out of the
  // latency its caller's call records (CallTiming::queuedNs). Set before the op is issued.
  void setQueuedNs(int64_t ns) { queuedNs_.store(ns, std::memory_order_relaxed); }

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
  std::atomic<int64_t> queuedNs_{0};

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

}  // namespace delaycomm
