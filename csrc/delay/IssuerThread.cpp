#include "delay/IssuerThread.hpp"

#include <pthread.h>

#include <algorithm>
#include <vector>

#include "delay/DelayTimeout.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DELAYCOMM_CPU_RELAX() _mm_pause()
#else
#define DELAYCOMM_CPU_RELAX() std::this_thread::yield()
#endif

namespace delaycomm {

void sleepUntilPrecise(SteadyClock::time_point deadline) {
  const auto coarse = deadline - kSpinMargin;
  if (SteadyClock::now() < coarse) {
    std::this_thread::sleep_until(coarse);
  }
  while (SteadyClock::now() < deadline) {
    DELAYCOMM_CPU_RELAX();
  }
}

void sleepForPrecise(std::chrono::nanoseconds d) {
  sleepUntilPrecise(addSaturated<SteadyClock>(SteadyClock::now(), d.count()));
}

// ---------------------------------------------------------------------------------------------------------------
// HostSleeper

HostSleeper::Woke HostSleeper::sleepUntil(SteadyClock::time_point target, SteadyClock::time_point deadline) {
  const auto until = std::min(target, deadline);
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (closed_) {
      return Woke::kClosed;
    }
    const auto coarse = until - kSpinMargin;
    if (SteadyClock::now() < coarse && cv_.wait_until(lock, coarse, [this] { return closed_; })) {
      return Woke::kClosed;
    }
  }
  // The last stretch spins (a close() during it waits at most kSpinMargin).
  while (SteadyClock::now() < until) {
    DELAYCOMM_CPU_RELAX();
  }
  return target <= deadline ? Woke::kTarget : Woke::kDeadline;
}

void HostSleeper::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }
  cv_.notify_all();
}

bool HostSleeper::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_;
}

// ---------------------------------------------------------------------------------------------------------------
// IssuerThread

namespace {

// How many releasing scopes the calling thread is in (nested: a drain may cancel, an expiry may run in a drain).
thread_local int tlsReleasing = 0;

// Marks the calling thread as releasing held-back ops for the scope's lifetime (IssuerThread::releasingHere()).
struct ReleasingScope {
  ReleasingScope() { ++tlsReleasing; }
  ~ReleasingScope() { --tlsReleasing; }
  ReleasingScope(const ReleasingScope&) = delete;
  ReleasingScope& operator=(const ReleasingScope&) = delete;
};

}  // namespace

bool IssuerThread::releasingHere() {
  return tlsReleasing > 0;
}

IssuerThread::IssuerThread(std::string name) : name_(std::move(name)), state_(std::make_shared<State>()) {
  const std::string threadName = name_.substr(0, 15);  // before the thread exists: nothing may throw after
  // NOTE: the thread owns a reference to the state, never to this object (see stop()).
  thread_ = std::thread([s = state_] { loop(s); });
  pthread_setname_np(thread_.native_handle(), threadName.c_str());
}

IssuerThread::~IssuerThread() {
  stop();
}

bool IssuerThread::runInlineIfIdle(const std::function<void()>& fn) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (!state_->queue.empty() || state_->busy)
    return false;
  fn();
  return true;
}

IssuerThread::Item IssuerThread::popFrontLocked(State& s) {
  Item it = std::move(s.queue.front());
  s.queue.pop_front();
  if (s.expired > 0)
    --s.expired;
  return it;
}

void IssuerThread::issue(Item& it) {
  {
    trace::ProfilerContextGuard profiler(it.profiler);
    it.task();
  }
  it = Item{};  // drop the task's captures (tensors, work) outside the lock
}

void IssuerThread::submit(SteadyClock::time_point releaseAt, Task task, Cancel cancel, SteadyClock::time_point expireAt,
                          Expire expire, const Queued& queued) {
  trace::ProfilerContext profiler = trace::ProfilerContext::capture();  // on the caller's thread, before the lock
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mutex);
  const bool ahead = !s.queue.empty() || s.busy;
  if (queued) {
    queued(ahead && s.latestRelease > releaseAt
               ? std::chrono::duration_cast<std::chrono::nanoseconds>(s.latestRelease - releaseAt).count()
               : 0);
  }
  s.latestRelease = ahead ? std::max(s.latestRelease, releaseAt) : releaseAt;
  s.queue.push_back(
      Item{releaseAt, std::move(task), std::move(cancel), expireAt, std::move(expire), std::move(profiler)});
  if (!s.stopping) {
    s.cv.notify_all();
    return;
  }
  // The group is shutting down (the thread has drained or is draining): issue whatever is queued (this item
  // included) right here, in order, one issuer at a time.
  ReleasingScope releasing;
  while (true) {
    s.cv.wait(lock, [&s] { return !s.busy; });
    if (s.queue.empty())
      break;
    Item it = popFrontLocked(s);
    s.busy = true;
    lock.unlock();
    issue(it);
    lock.lock();
    s.busy = false;
    s.cv.notify_all();
  }
}

void IssuerThread::loop(const std::shared_ptr<State>& state) {
  ReleasingScope releasing;  // for the thread's whole life
  State& s = *state;
  std::unique_lock<std::mutex> lock(s.mutex);
  while (true) {
    if (s.busy) {  // a caller is issuing (inline, or draining after stop()): one issuer at a time keeps the order
      s.cv.wait(lock);
      continue;
    }
    if (s.queue.empty()) {
      if (s.stopping)
        break;
      s.cv.wait(lock);
      continue;
    }
    if (!s.draining) {
      const auto now = SteadyClock::now();
      // Expire, in queue order, the ops held back past their expiry (their works fail with the timeout error).
      std::vector<Expire> due;
      while (s.expired < s.queue.size() && s.queue[s.expired].expireAt <= now) {
        if (s.queue[s.expired].expire)
          due.push_back(s.queue[s.expired].expire);
        ++s.expired;
      }
      if (!due.empty()) {
        lock.unlock();
        for (auto& fn : due)
          fn();
        due.clear();
        lock.lock();
        continue;  // re-check: the queue may have changed
      }
      const auto releaseAt = s.queue.front().releaseAt;
      if (now < releaseAt - kSpinMargin) {
        auto wakeAt = releaseAt - kSpinMargin;
        if (s.expired < s.queue.size())
          wakeAt = std::min(wakeAt, s.queue[s.expired].expireAt);
        s.cv.wait_until(lock, wakeAt);
        continue;  // re-check: a drain, a cancel or an expiry may have come
      }
      if (now < releaseAt) {
        lock.unlock();
        while (SteadyClock::now() < releaseAt) {
          DELAYCOMM_CPU_RELAX();
        }
        lock.lock();
        continue;
      }
    }
    Item it = popFrontLocked(s);
    s.busy = true;
    lock.unlock();
    issue(it);
    lock.lock();
    s.busy = false;
    s.cv.notify_all();
  }
  s.finished = true;
  s.cv.notify_all();
}

void IssuerThread::stop() {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.draining = true;
    s.stopping = true;
  }
  s.cv.notify_all();
  {
    std::lock_guard<std::mutex> joinLock(joinMutex_);
    if (!thread_.joinable()) {
      return;
    }
    if (thread_.get_id() != std::this_thread::get_id()) {
      thread_.join();
      return;
    }
    thread_.detach();
  }
  // stop() from a task on the issuer thread itself (e.g. the group's last reference dropped by a callback that the
  // task ran): it cannot join itself. Issue what is queued now, in order (this thread is the issuer, and the task
  // that called us has already issued its op), so that nothing queued runs after this object is gone; the loop
  // then finds the queue empty and returns, touching only the shared state.
  ReleasingScope releasing;
  std::unique_lock<std::mutex> lock(s.mutex);
  while (!s.queue.empty()) {
    Item it = popFrontLocked(s);
    lock.unlock();
    issue(it);
    lock.lock();
  }
}

void IssuerThread::cancelAll(std::exception_ptr error) {
  std::deque<Item> cancelled;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    cancelled.swap(state_->queue);
    state_->expired = 0;
  }
  state_->cv.notify_all();
  ReleasingScope releasing;
  for (auto& it : cancelled) {
    if (it.cancel)
      it.cancel(error);
  }
}

size_t IssuerThread::pending() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->queue.size() + (state_->busy ? 1 : 0);
}

bool IssuerThread::finished() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->finished;
}

}  // namespace delaycomm
