#include "delay/DeferredWork.hpp"

#include <pthread.h>

#include <system_error>
#include <thread>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include "delay/DelayTimeout.hpp"
#include "delay/IssuerThread.hpp"
#include "delay/Units.hpp"
#include "stats/Trace.hpp"

namespace delaycomm {

namespace {

// Completions handed to torch's inter-op pool that have not finished (queued or running), in this process.
std::atomic<size_t> pooledCompletions{0};

// Runs `complete` (it completes a future, whose callbacks are user code) off the calling thread, a thread that
// releases held-back ops (see DeferredWorkCpu's Threads): on torch's inter-op pool (at::launch). A callback that
// blocks holds its pool thread, and may wait for a future that a later completion completes: that completion must
// never queue behind it. So when as many completions as the pool has threads are still unfinished, this one gets
// a thread of its own, which ends when its callbacks return.
void completeOffThisThread(std::function<void()> complete) {
  struct Done {
    ~Done() { pooledCompletions.fetch_sub(1, std::memory_order_acq_rel); }
  };
  if (pooledCompletions.fetch_add(1, std::memory_order_acq_rel) < at::get_num_interop_threads()) {
    at::launch([complete = std::move(complete)] {
      Done done;
      complete();
    });
    return;
  }
  pooledCompletions.fetch_sub(1, std::memory_order_acq_rel);
  auto run = std::make_shared<std::function<void()>>(std::move(complete));
  try {
    std::thread([run] {
      pthread_setname_np(pthread_self(), "dc-callbacks");
      (*run)();
    }).detach();
  } catch (const std::system_error&) {
    at::launch([run] { (*run)(); });  // no thread to be had: the pool, late rather than never
  }
}

}  // namespace

DeferredWorkCpu::DeferredWorkCpu(OpKind op, uint64_t seq, std::shared_ptr<GroupStats> stats, Clock::time_point issuedAt,
                                 std::vector<at::Tensor> outputs, std::chrono::milliseconds groupTimeout,
                                 int64_t delayNs, std::optional<CallTiming> call)
    : c10d::Work(-1, opInfo(op).workType),
      op_(op),
      seq_(seq),
      stats_(std::move(stats)),
      issuedAt_(issuedAt),
      outputs_(std::move(outputs)),
      groupTimeout_(groupTimeout),
      delayNs_(delayNs),
      call_(call),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

DeferredWorkCpu::~DeferredWorkCpu() = default;

void DeferredWorkCpu::attach(c10::intrusive_ptr<c10d::Work> inner) {
  c10::intrusive_ptr<c10::ivalue::Future> innerFuture;
  try {
    innerFuture = inner->getFuture();
  } catch (const std::exception&) {
    // Gloo's send/recv works have no future: they are timed in wait().
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_INTERNAL_ASSERT(!attached_, "delaycomm: a work was attached twice");
    inner_ = std::move(inner);
    innerHasFuture_ = static_cast<bool>(innerFuture);
    attached_ = true;
  }
  attachedCv_.notify_all();
  if (innerFuture) {
    // NOTE: the callback owns a reference to this work; the cycle (inner future -> callback -> this -> inner) is
    // broken when the future completes and drops its callbacks.
    auto self = c10::intrusive_ptr<DeferredWorkCpu>::reclaim_copy(this);
    innerFuture->addCallback([self](c10::ivalue::Future& f) {
      if (f.hasError()) {
        self->recordCompletion(false);
        self->settleFuture(c10::IValue(), f.exception_ptr());
      } else {
        self->recordCompletion(true);
        self->settleFuture(f.value(), nullptr);
      }
    });
  }
}

void DeferredWorkCpu::fail(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = error;
    attached_ = true;
  }
  attachedCv_.notify_all();
  recordCompletion(false);
  settleFuture(c10::IValue(), error);
}

std::string DeferredWorkCpu::heldBackCause(int64_t heldMs) const {
  return c10::str("held back by an injected delay of ", msText(delayNs_), " ms (or by the ops queued ahead of it) for ",
                  heldMs, " ms since the call");
}

void DeferredWorkCpu::expire() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (attached_ || expired_) {
      return;
    }
    const auto heldMs = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - issuedAt_).count();
    expired_ = delayTimeoutError(opName(op_), seq_, "the op", groupTimeout_, true, heldBackCause(heldMs));
  }
  attachedCv_.notify_all();
  recordCompletion(false);
  settleFuture(c10::IValue(), expired_);
}

void DeferredWorkCpu::settleFuture(const c10::IValue& value, std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (futureSettled_) {
      return;
    }
    futureSettled_ = true;
  }
  auto complete = [future = future_, value, error] {
    if (error) {
      future->setError(error);
    } else {
      future->markCompleted(value);
    }
  };
  if (IssuerThread::releasingHere()) {
    // NOTE: completing the future runs its callbacks inline, and they are user code: a DDP comm hook's next stage
    // (PowerSGD's) issues a collective and waits for it, which on this thread would wait for the very thread it
    // blocks.
    completeOffThisThread(std::move(complete));
    return;
  }
  complete();
}

bool DeferredWorkCpu::waitAttached(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout == kNoTimeout) {
    attachedCv_.wait(lock, [this] { return attached_ || expired_; });
    return true;
  }
  return attachedCv_.wait_for(lock, timeout, [this] { return attached_ || expired_; });
}

void DeferredWorkCpu::recordCompletion(bool ok) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (recorded_) {
      return;
    }
    recorded_ = true;
  }
  std::optional<CallTiming> call = call_;
  if (call) {
    call->queuedNs = queuedNs_.load(std::memory_order_relaxed);
  }
  stats_->recordCompletion(op_, issuedAt_, call, ok);
  trace::recordCall(opName(op_), seq_, issuedAt_, ok, call ? call->sizeClass : 0);  // DELAYCOMM_TRACE
}

bool DeferredWorkCpu::isCompleted() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_ || expired_) {
    return true;
  }
  return attached_ && inner_->isCompleted();
}

bool DeferredWorkCpu::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_ || expired_ || !attached_) {
    return false;
  }
  return inner_->isSuccess();
}

std::exception_ptr DeferredWorkCpu::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_) {
    return error_;
  }
  if (expired_) {
    return expired_;
  }
  return attached_ ? inner_->exception() : nullptr;
}

int DeferredWorkCpu::sourceRank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(attached_ && inner_, "delaycomm: ", opName(op_), ": sourceRank() is known once the op completed");
  return inner_->sourceRank();
}

void DeferredWorkCpu::waitAttachedOrThrow(std::chrono::milliseconds timeout, const char* method) {
  const auto limit = timeout == kNoTimeout ? groupTimeout_ : timeout;
  if (waitAttached(limit)) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (expired_) {
      std::rethrow_exception(expired_);
    }
    return;
  }
  const auto heldMs = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - issuedAt_).count();
  throwDelayTimeout(opName(op_), seq_, method, limit, timeout == kNoTimeout, heldBackCause(heldMs));
}

std::vector<at::Tensor> DeferredWorkCpu::result() {
  waitAttachedOrThrow(kNoTimeout, "result()");
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_) {
    std::rethrow_exception(error_);
  }
  return inner_->result();
}

void DeferredWorkCpu::synchronize() {
  // CPU ops have nothing to synchronise with a stream.
}

bool DeferredWorkCpu::wait(std::chrono::milliseconds timeout) {
  const auto start = Clock::now();
  waitAttachedOrThrow(timeout, "wait()");
  c10::intrusive_ptr<c10d::Work> inner;
  bool innerHasFuture = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_) {
      std::rethrow_exception(error_);
    }
    inner = inner_;
    innerHasFuture = innerHasFuture_;
  }
  auto left = timeout;
  if (timeout != kNoTimeout) {
    left -= std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    left = std::max(left, std::chrono::milliseconds(1));
  }
  bool ok = false;
  try {
    ok = inner->wait(left);
  } catch (...) {
    recordCompletion(false);
    throw;
  }
  if (!innerHasFuture) {
    recordCompletion(ok);
    if (ok) {
      settleFuture(c10::IValue(outputs_), nullptr);
    }
  } else if (ok) {
    recordCompletion(true);  // the caller saw it complete before the future's callbacks ran
  }
  return ok;
}

void DeferredWorkCpu::abort() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (inner_) {
    inner_->abort();
  }
}

c10::intrusive_ptr<c10::ivalue::Future> DeferredWorkCpu::getFuture() {
  return future_;
}

float DeferredWorkCpu::getDuration() const {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(inner_, "delaycomm: ", opName(op_), ": getDuration() is known once the op was issued (sequence number ",
              seq_, ")");
  return inner_->getDuration();
}

}  // namespace delaycomm
