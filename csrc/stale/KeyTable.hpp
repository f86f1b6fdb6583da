#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>

namespace delaycomm {

// The staleness engine's streams by key, bounded (docs/staleness.md, "Keys" and "Memory").
//
// A *key* names one stream of reductions (one DDP bucket); each call on a key is one step. Keys are explicit
// (stale_allreduce(key=...)), < kExplicitKeyLimit; or named by the stream the recogniser found (stale/Recognition.hpp:
// a DDP bucket, an FSDP flat parameter or parameter group, each named by its owner) with the tensor's size and dtype
// (scopeKey: a hash, >= kScopeKeyBase, the same on every rank whatever the order). The range between the two is
// unused.
//
// The table holds at most maxKeys keys: the least recently used key with nothing pending is forgotten beyond that.
// The order depends only on the sequence of keys, so every rank forgets the same keys at the same call.
//
// Threads: none of its own; the engine calls it under its lock.
class KeyTable {
 public:
  static constexpr uint64_t kExplicitKeyLimit = uint64_t{1} << 40;
  static constexpr uint64_t kScopeKeyBase = uint64_t{1} << 41;

  // A late contribution: rank's, `staleness` steps late, arriving at the step it is filed under.
  struct Arrival {
    int rank;
    int64_t staleness;
  };
  // One of this rank's own deferred contributions.
  struct Deferred {
    uint64_t due;
    uint64_t origin;
    at::Tensor tensor;
    double scale = 1.0;  // the loss scale it was computed at (GradScaler; 1 without one)
  };
  // A contribution this rank added to a step (or carries to the next): its tensor, the weight it was added with
  // at its landing step, and the loss scale it was computed at.
  struct Term {
    at::Tensor tensor;
    double weight = 1.0;
    double scale = 1.0;
  };
  // A recognised stream's last reduction until an optimizer event resolves it (docs/staleness.md, "The rule"):
  // what landed on it (carried to the next step taken when its step is skipped), and this rank's fresh gradient,
  // unscaled (the conservation check's reference, kept when its step is taken).
  struct Open {
    bool active = false;
    uint64_t step = 0;
    std::vector<Term> landed;
    bool hadArrivals = false;  // global: contributions landed on it (this rank's own may be none)
    at::Tensor fresh;          // stale_check only
  };
  // step_ms=auto: the intervals between consecutive calls of one stream (stale/StepClock.hpp).
  struct CallTimes {
    std::chrono::steady_clock::time_point last;
    std::vector<int64_t> intervals;
    size_t calls() const { return intervals.size() + (last != std::chrono::steady_clock::time_point{} ? 1 : 0); }
  };

  // A recognised stream's runtime check (docs/staleness.md, "The runtime check"): each of its reductions must be
  // consumed by an optimizer step over all of its parameters before the next; it defers nothing until it has passed
  // the check StalenessOptions::probationCalls times, and a stream that fails is kept fresh from then on.
  struct Watch {
    uint64_t calls = 0;
    uint64_t passes = 0;
    uint64_t stepAt = 0;    // the optimizer step count at its last reduction (stale/Owners.hpp)
    uint64_t deferred = 0;  // contributions (all ranks') it made late so far
    bool fresh = false;     // failed the check: kept fresh from now on
  };

  // One stream: its bookkeeping (the same on every rank: derived from the shared schedule) and this rank's own
  // deferred contributions.
  struct Stream {
    uint64_t seen = 0;
    uint64_t step = 0;
    std::map<uint64_t, std::vector<Arrival>> arrivals;  // global: step -> contributions arriving then
    std::vector<int64_t> pendingOf;                     // global: contributions of each rank in flight (not under drop)
    std::deque<Deferred> mine;                          // this rank's deferred contributions, in deferral order
    at::Tensor prototype;                               // dtype/device of the stream (no storage)
    int64_t numel = 0;                                  // its size at the last step
    double resultScale = 1.0;           // the stream's result scale (last step): 1, 1 / N (AVG), f (PREMUL_SUM)
    bool scatter = false;               // a reduce-scatter stream (last step)
    std::string scope;                  // set for recognised streams: the stream's name
    int64_t consumer = -1;              // recognised streams: the parameters its result lands on (stale/Owners.hpp)
    Watch watch;                        // recognised streams
    Open open;                          // recognised streams: the last reduction, until resolved
    std::vector<Term> carry;            // what landed on a skipped step, for the next reduction (or flush)
    bool carryPending = false;          // global: a skipped step had contributions landed on it
    at::Tensor produced;                // stale_check: this rank's fresh gradients of the steps taken, unscaled
    CallTimes times;                    // step_ms=auto, until one stream has calibrated
    std::list<uint64_t>::iterator lru;  // position in the table's LRU list

    int64_t pendingGlobal() const;
    bool holdsPending() const {
      return !mine.empty() || !arrivals.empty() || !carry.empty() || !open.landed.empty() || produced.defined();
    }
  };

  KeyTable(int size, int64_t maxKeys);

  // The stream of `key`, created like `t` if new; marks it the most recently used.
  Stream& touch(uint64_t key, const at::Tensor& t);
  // The key of the stream that `scope` reduces with tensors like `t` (touched).
  uint64_t scopedKey(const std::string& scope, const at::Tensor& t, bool scatter);
  // The key scopedKey gives: a hash of the scope's name, size, dtype and kind (a pure function: tests and tools
  // compute the schedule of a scope's stream with it).
  static uint64_t scopeKey(const std::string& scope, int64_t numel, c10::ScalarType dtype, bool scatter);

  // Forgets the least recently used keys with nothing pending beyond maxKeys (never the most recent one).
  void evict();

  Stream* find(uint64_t key);
  const Stream* find(uint64_t key) const;
  std::map<uint64_t, Stream>& streams() { return streams_; }
  const std::map<uint64_t, Stream>& streams() const { return streams_; }
  size_t size() const { return streams_.size(); }

  // A key as users read it: "key 3" (explicit) or
  // "'<scope>' (reduce_scatter 1024 x Float on cpu)".
  std::string describe(uint64_t key) const;
  // "reduce_scatter" for a reduce-scatter stream, else "all_reduce".
  const char* opText(uint64_t key) const;

 private:
  const int size_;
  const int64_t maxKeys_;
  std::map<uint64_t, Stream> streams_;
  std::list<uint64_t> lru_;  // keys by last call, least recent first
};

}  // namespace delaycomm
