#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "stats/ProfilerContext.hpp"

namespace delaycomm {

using SteadyClock = std::chrono::steady_clock;

// Sleeps until `deadline` with sub-100-microsecond precision: a coarse sleep to kSpinMargin before the deadline,
// then a spin (the OS wakes a sleeping thread late by tens to hundreds of microseconds on a loaded machine).
void sleepUntilPrecise(SteadyClock::time_point deadline);
void sleepForPrecise(std::chrono::nanoseconds d);  // saturating: a huge d sleeps "forever", never into the past
constexpr std::chrono::microseconds kSpinMargin{200};

// The host-side sleeps of a group (delay_where=host, the compute slowdown), bounded and interruptible: a sleep
// ends at its target (as precise as sleepUntilPrecise), at the caller's deadline (the group's timeout), or when the
// group closes (destroy_process_group, abort), whichever comes first, so that neither a timeout nor a destroy ever
// waits out a delay.
// Threads: sleepUntil() from any number of threads; close() from any thread, once or more.
class HostSleeper {
 public:
  enum class Woke { kTarget, kDeadline, kClosed };
  Woke sleepUntil(SteadyClock::time_point target, SteadyClock::time_point deadline);
  // Wakes every sleeper (kClosed) and makes later sleeps return kClosed at once.
  void close();
  bool closed() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool closed_ = false;
};

// One thread that issues a group's CPU ops to the inner backend, in call order, each no earlier than its release
// time: an op with delay d called at t is released at max(t + d, the release of the op ahead of it). Every rank
// issues the same sequence to its inner group, whatever the delays (reordering would deadlock Gloo).
//
// Expiry: an op still queued at its expiry time (its call time + the group's timeout) has `expire` called once, on
// the issuer thread, so that its work fails with the timeout error although the op itself stays queued and is
// issued at its release time (every rank still issues the same sequence). Ops expire in queue order.
//
// Threads: submit()/runInlineIfIdle() from any thread (the callers); tasks and expire callbacks run on the issuer
// thread (never under its lock), or tasks inline on the caller when nothing is queued. Callbacks must not throw:
// they report their errors to their work.
// User code never runs while ops are being released: every task, expire and cancel callback runs with
// releasingHere() true on its thread (the issuer thread throughout; any other thread while it issues or cancels
// queued ops: a submit() at shutdown, cancelAll()), and whatever would run user code from there (completing a
// work's future runs its callbacks inline) hands it to another thread instead (delay/DeferredWork.hpp,
// docs/core.md "Threads"). A user callback that issues a collective and waits for it would otherwise wait for the
// very thread it blocks.
// Profiler: a task issued off its caller's thread runs with the caller's profiler state as it was at submit()
// (trace::ProfilerContext, stats/ProfilerContext.hpp), so that what the inner backend records of the op
// (gloo:all_reduce) lands in the caller's torch.profiler trace, whichever thread issues it. Lifecycle: stop() (or the
// destructor) issues every queued op at once, in order, then joins the thread; cancelAll() fails the queued ops instead
// (abort). stop() may be called from any thread, concurrently, more than once; called from a task on the issuer thread
// itself, it cannot join: the thread then finishes on its own once the queue is empty and touches nothing of this
// object after (its state is shared with it), so a destructor running on the issuer thread is safe.
class IssuerThread {
 public:
  using Task = std::function<void()>;
  using Cancel = std::function<void(std::exception_ptr)>;
  using Expire = std::function<void()>;
  // Told, under the issuer's lock before the op can be issued, how long the ops queued ahead of it hold it past
  // its own release time (in ns, >= 0): the wait behind the rank's earlier held-back calls (docs/profile.md).
  using Queued = std::function<void(int64_t)>;

  explicit IssuerThread(std::string name);
  ~IssuerThread();
  IssuerThread(const IssuerThread&) = delete;
  IssuerThread& operator=(const IssuerThread&) = delete;

  // Runs `fn` now on the calling thread, under the issuer's lock, when no op is queued or being issued, and returns
  // true; returns false (and runs nothing) otherwise. Exceptions from `fn` propagate to the caller.
  bool runInlineIfIdle(const std::function<void()>& fn);
  // Queues `task` for release at `releaseAt`; `cancel` fails its work if the queue is cancelled before; `expire`
  // (if set) is called once if the task is still queued at `expireAt`.
  void submit(SteadyClock::time_point releaseAt, Task task, Cancel cancel,
              SteadyClock::time_point expireAt = SteadyClock::time_point::max(), Expire expire = nullptr,
              const Queued& queued = nullptr);
  // Issues every queued op now (in order), waits until they were issued and joins the thread. Idempotent.
  void stop();
  // Fails every queued op with `error` (ops already issued are not affected).
  void cancelAll(std::exception_ptr error);
  size_t pending() const;
  // Whether the thread's loop has returned (after stop()).
  bool finished() const;
  // Whether the calling thread is releasing held-back ops (of any group) right now: see "User code" above.
  static bool releasingHere();

 private:
  struct Item {
    SteadyClock::time_point releaseAt;
    Task task;
    Cancel cancel;
    SteadyClock::time_point expireAt;
    Expire expire;
    trace::ProfilerContext profiler;  // the caller's, at submit() (empty: no profiler there)
  };
  // Everything the thread touches: shared with it, so that it can outlive this object (see stop()).
  struct State {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<Item> queue;
    size_t expired = 0;     // queue[0, expired) have had their expire callback
    bool busy = false;      // an item was popped and is being issued
    bool draining = false;  // release everything now (stop())
    bool stopping = false;
    bool finished = false;  // loop() returned
    // The latest release time of the ops queued or being issued (valid while any is): an op released earlier
    // than it waits for them (call order).
    SteadyClock::time_point latestRelease{};
  };
  static void loop(const std::shared_ptr<State>& s);
  // Pops the front item; s.mutex held.
  static Item popFrontLocked(State& s);
  // Runs the item's task under its caller's profiler state, then drops the task's captures; s.mutex not held.
  static void issue(Item& it);

  const std::string name_;
  const std::shared_ptr<State> state_;
  std::mutex joinMutex_;  // serialises stop()'s join
  std::thread thread_;
};

}  // namespace delaycomm
