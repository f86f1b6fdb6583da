#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "delay/IssuerThread.hpp"
#include "stale/PeerWatch.hpp"

namespace delaycomm {

// Every wait of the staleness engine, in one place (docs/staleness.md, "Waits"): the SSP gate, waiting out a gate
// timeout, and the waits on the group's store (the step_ms=auto agreement, flush's record exchange, the hold of a
// verdict). Each wait ends at the first of:
//  - its target (a gate wait) or its condition (a wait on the store);
//  - its deadline: the group's timeout as it is when the wait starts (setTimeout(), c10d's set_timeout, applies to
//    the waits that start after it, as Gloo's does to the ops issued after it);
//  - close() (destroy_process_group, abort): at once, however long the wait had left;
//  - a member of the group found gone by the peer watch (stale/PeerWatch.hpp): its process ended, or it destroyed
//    the group; at once, as Gloo notices a closed connection.
// A wait on the store never blocks in the store: it checks its condition (Store::check, one round trip) in slices
// of 1 ms doubling to 100 ms, and sleeps between them on a condition variable that close() and the peer watch
// signal. So no store call is held open for the length of the wait (c10d's TCPStore serialises a process's store
// calls: a blocking wait would hold up every other user of the store), and neither c10d's socket timeout nor its
// "waitForInput ... timed out" warnings are involved.
//
// Threads: any number of waiters on any threads; close() and setTimeout() from any thread.
class EngineWaits {
 public:
  enum class Woke { kDone, kDeadline, kClosed, kGone };

  EngineWaits(int rank, int size, c10::intrusive_ptr<c10d::Store> store, std::string groupName,
              std::chrono::milliseconds timeout);
  ~EngineWaits();

  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeoutMs_.load()); }
  void setTimeout(std::chrono::milliseconds timeout) { timeoutMs_.store(timeout.count()); }

  // Sleeps until `target` (as precise as sleepUntilPrecise: the last kSpinMargin spins); kDone at the target,
  // kClosed or kGone when the group closes or (if `endWhenGone`) a member is found gone first. A wait whose end is
  // already decided (waiting out a gate timeout that every rank computed from the shared schedule) passes false:
  // a member that ends because it reached the same timeout first must not change this rank's verdict.
  Woke sleepUntil(SteadyClock::time_point target, bool endWhenGone = true);
  // Waits until done() returns true (kDone), checking it at once and then once per slice, until `deadline`
  // (kDeadline). A member found gone ends the wait (kGone) only when done() is still false once more after it
  // was found (a record it published before it went is never missed), and only if `endWhenGone` (a wait that
  // counts gone members as done, the hold of a verdict, passes false). done() runs on the waiting thread without
  // any lock of this object; what it throws (a store error) propagates.
  Woke waitUntil(SteadyClock::time_point deadline, const std::function<bool()>& done, bool endWhenGone = true);

  // The members found gone so far (in the order found).
  std::vector<int> gone() const { return watch_.gone(); }

  // Ends every wait (kClosed) and makes later waits end at once; stops the peer watch, so that the other members
  // see this one go. Idempotent.
  void close();
  bool closed() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool closed_ = false;
  std::atomic<int64_t> timeoutMs_;
  PeerWatch watch_;  // last: its thread signals cv_
};

}  // namespace delaycomm
