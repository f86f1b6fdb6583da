#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace delaycomm {

using SteadyClock = std::chrono::steady_clock;

// Sleeps until `deadline` with sub-100-microsecond precision: a coarse sleep to kSpinMargin before the deadline,
// then a spin (the OS wakes a sleeping thread late by tens to hundreds of microseconds on a loaded machine).
void sleepUntilPrecise(SteadyClock::time_point deadline);
inline void sleepForPrecise(std::chrono::nanoseconds d) { sleepUntilPrecise(SteadyClock::now() + d); }
constexpr std::chrono::microseconds kSpinMargin{200};

// One thread that issues a group's CPU ops to the inner backend, in call order, each no earlier than its release
// time: an op with delay d called at t is released at max(t + d, the release of the op ahead of it). Every rank
// issues the same sequence to its inner group, whatever the delays (reordering would deadlock Gloo).
//
// Threads: submit()/runInlineIfIdle() from any thread (the callers); tasks run on the issuer thread, or inline on
// the caller when nothing is queued. A task must not throw: it reports its error to its work.
// Lifecycle: stop() (or the destructor) issues every queued op at once, in order, then joins; cancelAll() fails
// the queued ops instead (abort).
class IssuerThread {
 public:
  using Task = std::function<void()>;
  using Cancel = std::function<void(std::exception_ptr)>;

  explicit IssuerThread(std::string name);
  ~IssuerThread();
  IssuerThread(const IssuerThread&) = delete;
  IssuerThread& operator=(const IssuerThread&) = delete;

  // Runs `fn` now on the calling thread, under the issuer's lock, when no op is queued or being issued, and returns
  // true; returns false (and runs nothing) otherwise. Exceptions from `fn` propagate to the caller.
  bool runInlineIfIdle(const std::function<void()>& fn);
  // Queues `task` for release at `releaseAt`; `cancel` fails its work if the queue is cancelled before.
  void submit(SteadyClock::time_point releaseAt, Task task, Cancel cancel);
  // Issues every queued op now (in order), waits until they were issued and joins the thread. Idempotent.
  void stop();
  // Fails every queued op with `error` (ops already issued are not affected).
  void cancelAll(std::exception_ptr error);
  size_t pending() const;

 private:
  struct Item {
    SteadyClock::time_point releaseAt;
    Task task;
    Cancel cancel;
  };
  void loop();

  const std::string name_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool busy_ = false;      // an item was popped and is being issued
  bool draining_ = false;  // release everything now (stop())
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace delaycomm
