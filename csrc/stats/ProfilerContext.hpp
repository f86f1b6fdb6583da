#pragma once

#include <memory>

namespace delaycomm::trace {

// The caller's torch.profiler state, carried to the thread that issues its op (stats/Trace.hpp, 1.): the
// thread-local RecordFunction callbacks and the thread's debug info (which holds the profiler's state). A light
// header (no ATen): delay/IssuerThread.hpp carries one per queued op.
class ProfilerContext {
 public:
  ProfilerContext() = default;
  // The calling thread's: empty (no allocation) unless thread-local RecordFunction callbacks (a profiler) are
  // registered on it.
  static ProfilerContext capture();
  bool empty() const { return !state_; }

 private:
  friend class ProfilerContextGuard;
  struct State;
  std::shared_ptr<const State> state_;  // shared: a task that carries it may be copied (std::function)
};

// Applies a captured ProfilerContext on the calling thread for the guard's lifetime, then restores the thread's
// own (nothing at all for an empty context).
class ProfilerContextGuard {
 public:
  explicit ProfilerContextGuard(const ProfilerContext& ctx);
  ~ProfilerContextGuard();
  ProfilerContextGuard(const ProfilerContextGuard&) = delete;
  ProfilerContextGuard& operator=(const ProfilerContextGuard&) = delete;

 private:
  struct Saved;
  std::unique_ptr<Saved> saved_;  // the thread's own state while the context is applied (null: empty context)
};

}  // namespace delaycomm::trace
