#include "backend/DelayWork.hpp"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include "stats/Trace.hpp"

namespace delaycomm {

// ---------------------------------------------------------------------------------------------------------------
// DirectWorkCpu

DirectWorkCpu::DirectWorkCpu(c10::intrusive_ptr<c10d::Work> inner, c10::intrusive_ptr<c10::ivalue::Future> innerFuture,
                             OpKind op, uint64_t seq, std::shared_ptr<GroupStats> stats, Clock::time_point issuedAt,
                             std::optional<CallTiming> call)
    : c10d::Work(-1, opInfo(op).workType),
      inner_(std::move(inner)),
      future_(std::move(innerFuture)),
      op_(op),
      seq_(seq),
      stats_(std::move(stats)),
      issuedAt_(issuedAt),
      call_(call) {}

void DirectWorkCpu::watch() {
  // NOTE: the callback owns a reference to this work; the cycle (inner future -> callback -> this -> future) is
  // broken when the future completes and drops its callbacks. uses_future=false: the callback reads only whether
  // the future failed, so the future need not synchronise streams for it.
  future_->addCallback([self = c10::intrusive_ptr<DirectWorkCpu>::reclaim_copy(this)](
                           c10::ivalue::Future& f) { self->recordCompletion(!f.hasError()); },
                       /*uses_future=*/false);
}

void DirectWorkCpu::recordCompletion(bool ok) {
  if (recorded_.exchange(true, std::memory_order_acq_rel)) {
    return;
  }
  stats_->recordCompletion(op_, issuedAt_, call_, ok);
  trace::recordCall(opName(op_), seq_, issuedAt_, ok, call_ ? call_->sizeClass : 0);  // DELAYCOMM_TRACE
}

bool DirectWorkCpu::wait(std::chrono::milliseconds timeout) {
  bool ok = false;
  try {
    ok = inner_->wait(timeout);
  } catch (...) {
    recordCompletion(false);
    throw;
  }
  if (ok) {
    recordCompletion(true);  // the caller saw it complete before the future's callback ran
  }
  return ok;
}

// ---------------------------------------------------------------------------------------------------------------
// TimedWorkCuda

TimedWorkCuda::TimedWorkCuda(c10::intrusive_ptr<c10d::Work> inner, OpKind op, uint64_t seq,
                             std::shared_ptr<GroupStats> stats, std::optional<c10::Event> start, c10::Device device,
                             int sizeClass, Clock::time_point calledAt)
    : c10d::Work(-1, opInfo(op).workType),
      inner_(std::move(inner)),
      op_(op),
      seq_(seq),
      stats_(std::move(stats)),
      start_(std::move(start)),
      device_(device),
      sizeClass_(sizeClass),
      calledAt_(calledAt) {}

TimedWorkCuda::~TimedWorkCuda() {
  if (!timed_) {
    stats_->op(op_).untimed.fetch_add(1, std::memory_order_relaxed);
    recordUntimed(std::nullopt);
  }
}

void TimedWorkCuda::recordUntimed(std::optional<bool> ok) const {
  trace::recordCudaCall(opName(op_), seq_,
                        std::chrono::duration_cast<std::chrono::nanoseconds>(calledAt_.time_since_epoch()).count(), 0,
                        sizeClass_, trace::kCudaUntimed, ok);
}

void TimedWorkCuda::recordEnd(bool ok) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (timed_) {
    return;
  }
  timed_ = true;
  if (!start_) {  // time_cuda=0: no events, so no GPU time
    recordUntimed(ok);
    return;
  }
  c10::Event end(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  end.record(impl.getStream(device_));
  const CudaTimings::Call call{
      seq_, std::chrono::duration_cast<std::chrono::nanoseconds>(calledAt_.time_since_epoch()).count(), ok};
  stats_->cudaTimings().push(op_, std::move(*start_), std::move(end), sizeClass_, call);
  start_.reset();
}

void TimedWorkCuda::synchronize() {
  inner_->synchronize();
  recordEnd(true);
}

bool TimedWorkCuda::wait(std::chrono::milliseconds timeout) {
  const bool ok = inner_->wait(timeout);
  recordEnd(ok);
  return ok;
}

// ---------------------------------------------------------------------------------------------------------------
// CoalescedWork

CoalescedWork::CoalescedWork(std::vector<c10::intrusive_ptr<c10d::Work>> works)
    : c10d::Work(-1, c10d::OpType::COALESCED), works_(std::move(works)) {}

bool CoalescedWork::isCompleted() {
  for (auto& w : works_) {
    if (!w->isCompleted()) {
      return false;
    }
  }
  return true;
}

bool CoalescedWork::isSuccess() const {
  for (auto& w : works_) {
    if (!w->isSuccess()) {
      return false;
    }
  }
  return true;
}

std::exception_ptr CoalescedWork::exception() const {
  for (auto& w : works_) {
    if (auto e = w->exception()) {
      return e;
    }
  }
  return nullptr;
}

void CoalescedWork::synchronize() {
  for (auto& w : works_) {
    w->synchronize();
  }
}

bool CoalescedWork::wait(std::chrono::milliseconds timeout) {
  bool ok = true;
  for (auto& w : works_) {
    ok = w->wait(timeout) && ok;
  }
  return ok;
}

void CoalescedWork::abort() {
  for (auto& w : works_) {
    w->abort();
  }
}

c10::intrusive_ptr<c10::ivalue::Future> CoalescedWork::getFuture() {
  if (works_.size() == 1) {
    return works_[0]->getFuture();
  }
  c10::List<c10::intrusive_ptr<c10::ivalue::Future>> futures(
      c10::FutureType::create(c10::ListType::create(c10::TensorType::get())));
  for (auto& w : works_) {
    futures.push_back(w->getFuture());
  }
  // Completes with the concatenation of every member's output tensors.
  return c10::collectAll(futures)->then(
      [](c10::ivalue::Future& all) {
        std::vector<at::Tensor> out;
        for (const auto& f : all.value().toList()) {
          const auto& v = f.get().toFuture()->value();
          if (v.isTensorList()) {
            for (const auto& t : v.toTensorVector()) {
              out.push_back(t);
            }
          }
        }
        return c10::IValue(out);
      },
      c10::ListType::create(c10::TensorType::get()));
}

}  // namespace delaycomm
