#include "stats/Trace.hpp"

#include <algorithm>
#include <functional>
#include <thread>

#include <c10/util/ThreadLocalDebugInfo.h>

#include "stats/Histogram.hpp"

namespace delaycomm::trace {

struct ProfilerContext::State {
  at::RecordFunctionTLS callbacks;
  std::shared_ptr<c10::ThreadLocalDebugInfo> debugInfo;
};

ProfilerContext ProfilerContext::capture() {
  const auto& tls = at::get_record_function_tls_();
  if (C10_LIKELY(tls.sorted_tls_callbacks_.empty())) {
    return {};
  }
  ProfilerContext ctx;
  ctx.state_ = std::make_shared<const State>(State{tls, c10::ThreadLocalDebugInfo::current()});
  return ctx;
}

struct ProfilerContextGuard::Saved {
  at::RecordFunctionTLS callbacks;
  c10::DebugInfoGuard debugInfo;  // restores the thread's own debug info when destroyed
};

ProfilerContextGuard::ProfilerContextGuard(const ProfilerContext& ctx) {
  if (!ctx.state_) {
    return;
  }
  saved_.reset(new Saved{at::get_record_function_tls_(), c10::DebugInfoGuard(ctx.state_->debugInfo)});
  at::set_record_function_tls_(ctx.state_->callbacks);
}

ProfilerContextGuard::~ProfilerContextGuard() {
  if (saved_) {
    at::set_record_function_tls_(saved_->callbacks);
    saved_.reset();
  }
}

Span Span::start(at::StepCallbacks&& callbacks, const char* name, const SpanArgs& args) {
  Span span;
  span.rf_ = std::make_unique<at::RecordFunction>(std::move(callbacks));
  span.rf_->before(std::string_view(name), &args);
  return span;
}

std::atomic<TraceLog*> TraceLog::active_{nullptr};

TraceLog& TraceLog::enable(size_t capacity) {
  static std::mutex enableMutex;
  std::lock_guard<std::mutex> lock(enableMutex);
  capacity = std::max<size_t>(capacity, 1);
  if (TraceLog* log = active_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> ringLock(log->mutex_);
    if (capacity > log->ring_.size() && log->written_ <= log->ring_.size()) {
      log->ring_.resize(capacity);  // nothing wrapped yet: the order is kept
    }
    return *log;
  }
  // NOTE: never freed: works completing at interpreter exit may still record into it.
  auto* log = new TraceLog(capacity);
  active_.store(log, std::memory_order_release);
  return *log;
}

void TraceLog::record(TraceRecord r) {
  r.thread = std::hash<std::thread::id>{}(std::this_thread::get_id());
  std::lock_guard<std::mutex> lock(mutex_);
  ring_[written_ % ring_.size()] = r;
  ++written_;
}

std::vector<TraceRecord> TraceLog::snapshot(uint64_t* dropped) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t n = ring_.size();
  std::vector<TraceRecord> out;
  if (written_ <= n) {
    out.assign(ring_.begin(), ring_.begin() + static_cast<std::ptrdiff_t>(written_));
    *dropped = 0;
    return out;
  }
  out.reserve(n);
  for (uint64_t i = written_ - n; i < written_; ++i) {
    out.push_back(ring_[i % n]);
  }
  *dropped = written_ - n;
  return out;
}

size_t TraceLog::capacity() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ring_.size();
}

int64_t TraceLog::epochOffsetNs() {
  const auto system =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  return system - nowNs();
}

void recordCallTo(TraceLog& log, const char* op, uint64_t seq, std::chrono::steady_clock::time_point calledAt, bool ok,
                  int sizeClass) {
  TraceRecord r;
  r.kind = TraceRecord::kCall;
  r.name = op;
  r.op = op;
  r.startNs = std::chrono::duration_cast<std::chrono::nanoseconds>(calledAt.time_since_epoch()).count();
  r.durNs = TraceLog::nowNs() - r.startNs;
  r.seq = seq;
  r.args = {static_cast<int64_t>(sizeClassBytes(sizeClass)), ok ? 1 : 0, 0, 0, 0};
  log.record(r);
}

void recordCudaCallTo(TraceLog& log, const char* op, uint64_t seq, int64_t calledAtNs, int64_t durNs, int sizeClass,
                      CudaCallTiming timing, std::optional<bool> ok) {
  TraceRecord r;
  r.kind = TraceRecord::kCall;
  r.name = op;
  r.op = op;
  r.startNs = calledAtNs;
  r.durNs = std::max<int64_t>(durNs, 0);
  r.seq = seq;
  r.args = {static_cast<int64_t>(sizeClassBytes(sizeClass)), ok ? (*ok ? 1 : 0) : -1, 1, static_cast<int64_t>(timing),
            0};
  log.record(r);
}

}  // namespace delaycomm::trace
