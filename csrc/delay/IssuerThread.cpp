#include "delay/IssuerThread.hpp"

#include <pthread.h>

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

IssuerThread::IssuerThread(std::string name) : name_(std::move(name)) {
  thread_ = std::thread([this] { loop(); });
  pthread_setname_np(thread_.native_handle(), name_.substr(0, 15).c_str());
}

IssuerThread::~IssuerThread() { stop(); }

bool IssuerThread::runInlineIfIdle(const std::function<void()>& fn) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!queue_.empty() || busy_) return false;
  fn();
  return true;
}

void IssuerThread::submit(SteadyClock::time_point releaseAt, Task task, Cancel cancel) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      // The group is shutting down: issue in order right here (the thread has drained or is draining).
      queue_.push_back(Item{releaseAt, std::move(task), std::move(cancel)});
    } else {
      queue_.push_back(Item{releaseAt, std::move(task), std::move(cancel)});
      cv_.notify_all();
      return;
    }
  }
  // Stopping: run whatever is queued (including this item) on this thread, in order.
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    cv_.wait(lock, [this] { return !busy_; });
    if (queue_.empty()) break;
    Item it = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    it.task();
    it = Item{};
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

void IssuerThread::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    if (busy_) {  // a caller is issuing (inline, or draining after stop()): one issuer at a time keeps the order
      cv_.wait(lock);
      continue;
    }
    if (queue_.empty()) {
      if (stopping_) break;
      cv_.wait(lock);
      continue;
    }
    const auto releaseAt = queue_.front().releaseAt;
    if (!draining_) {
      const auto now = SteadyClock::now();
      if (now < releaseAt - kSpinMargin) {
        cv_.wait_until(lock, releaseAt - kSpinMargin);
        continue;  // re-check: a drain or a cancel may have come
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
    Item it = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    it.task();
    it = Item{};  // drop the task's captures (tensors, work) outside the lock
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

void IssuerThread::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    draining_ = true;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();  // stop() from a task on the issuer thread itself: it exits after this task
    } else {
      thread_.join();
    }
  }
}

void IssuerThread::cancelAll(std::exception_ptr error) {
  std::deque<Item> cancelled;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancelled.swap(queue_);
  }
  cv_.notify_all();
  for (auto& it : cancelled) {
    if (it.cancel) it.cancel(error);
  }
}

size_t IssuerThread::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.size() + (busy_ ? 1 : 0);
}

}  // namespace delaycomm
