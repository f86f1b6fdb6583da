// The staleness engine's waits (stale/EngineWaits.hpp). Design notes: docs/staleness.md, "Waits".

#include "stale/EngineWaits.hpp"

#include <algorithm>

namespace delaycomm {

namespace {

constexpr std::chrono::milliseconds kFirstSlice{1};
constexpr std::chrono::milliseconds kLongestSlice{100};

}  // namespace

EngineWaits::EngineWaits(int rank, int size, c10::intrusive_ptr<c10d::Store> store, std::string groupName,
                         std::chrono::milliseconds timeout)
    : timeoutMs_(timeout.count()), watch_(rank, size, std::move(store), std::move(groupName), [this] {
        // Notified under the lock: a waiter between its check and its sleep cannot miss it.
        std::lock_guard<std::mutex> lock(mutex_);
        cv_.notify_all();
      }) {}

EngineWaits::~EngineWaits() {
  close();
}

void EngineWaits::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }
  cv_.notify_all();
  watch_.stop();
}

bool EngineWaits::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_;
}

EngineWaits::Woke EngineWaits::sleepUntil(SteadyClock::time_point target, bool endWhenGone) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto coarse = target - kSpinMargin;
    const auto interrupted = [&] { return closed_ || (endWhenGone && watch_.goneCount() > 0); };
    if (interrupted() || (SteadyClock::now() < coarse && cv_.wait_until(lock, coarse, interrupted))) {
      return closed_ ? Woke::kClosed : Woke::kGone;
    }
  }
  sleepUntilPrecise(target);  // the last stretch spins (a close() during it waits at most kSpinMargin)
  return Woke::kDone;
}

EngineWaits::Woke EngineWaits::waitUntil(SteadyClock::time_point deadline, const std::function<bool()>& done,
                                         bool endWhenGone) {
  auto slice = kFirstSlice;
  while (true) {
    if (closed()) {
      return Woke::kClosed;
    }
    const uint64_t goneBefore = watch_.goneCount();
    if (done()) {
      return Woke::kDone;
    }
    if (endWhenGone && goneBefore > 0) {
      return Woke::kGone;
    }
    const auto now = SteadyClock::now();
    if (now >= deadline) {
      return Woke::kDeadline;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait_until(lock, std::min<SteadyClock::time_point>(deadline, now + slice),
                   [&] { return closed_ || watch_.goneCount() != goneBefore; });
    slice = std::min(2 * slice, kLongestSlice);
  }
}

}  // namespace delaycomm
