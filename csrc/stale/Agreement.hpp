#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "stale/EngineWaits.hpp"

namespace delaycomm {

// How the ranks of a group agree on what the staleness engine cannot derive from the shared schedule alone: the
// step time (step_ms=auto) and, at flush, that their stale bookkeeping is the same (docs/staleness.md, "The
// ranks' agreement"). Both go through the group's store, never through a collective, so a rank that is elsewhere
// (in another collective, or stuck) never pairs with them: the ranks that arrived raise at the timeout.
//
// Every rank publishes its record and reads every rank's, then decides by itself from the same records: the same
// verdict, or the same error, on every rank, with no round for a decision. What ends a round without every record
// (the timeout, a member found gone) is a verdict too, and it is sealed: the first rank to reach it writes it under
// the round's seal (Store::compareSet, so there is one), and every rank, a late one included, takes the verdict
// from the seal. So no rank goes on with the records while another gave up at its own deadline.
//
// Threads: exchange() and holdStoreUntilRead() wait through EngineWaits (stale/EngineWaits.hpp: bounded by the
// group's current timeout, ended by close() and by a member found gone); callers hold no lock of theirs meanwhile.
class StoreAgreement {
 public:
  StoreAgreement(int rank, int size, c10::intrusive_ptr<c10d::Store> store, EngineWaits* waits);

  struct Records {
    std::vector<std::string> byRank;  // every rank's record, in rank order (empty unless agreed())
    // Otherwise the sealed verdict, the same on every rank:
    std::vector<int> missing;      // the ranks that had not published at the sealer's deadline
    std::vector<int> gone;         // the members found gone (their process ended, or their group closed)
    std::vector<int> unpublished;  // the ranks without a record when the verdict was sealed
    int sealer = -1;               // the rank that sealed the verdict
    int64_t timeoutMs = 0;         // the timeout it had waited (missing)
    std::string context;           // what the sealer was doing (the `context` it passed to exchange)
    bool agreed() const { return missing.empty() && gone.empty(); }
  };
  // Publishes `mine` as this rank's record of `round` (a name no earlier round used) and waits, up to the
  // timeout, for every rank's, or for the round's sealed verdict. Raises c10::DistBackendError when the group is
  // closed meanwhile or the store fails (its host has gone), naming `where` (the message's prefix) and `what`
  // this rank was doing. `context`: this rank's position in words, kept in the seal when this rank seals a
  // verdict.
  Records exchange(const std::string& round, const std::string& mine, const std::string& where, const std::string& what,
                   const std::string& context);
  // After a verdict that fails on every rank, before raising it: every rank marks that it has read the verdict and
  // rank 0 waits (bounded by the timeout) for the mark of every rank that took part in the round (had published
  // when the verdict was sealed, and is not gone). Rank 0 hosts the store under env:// and mp.spawn; were it to raise
  // and exit first, a rank still reading would get a network error instead of the verdict. Never raises: the verdict is
  // what the caller raises.
  void holdStoreUntilRead(const std::string& round, const Records& records);

  // The group's timeout now (setTimeout() included).
  std::chrono::milliseconds timeout() const;
  // What ended a round without every record, in the same words on every rank: "rank(s) 1 did not <notDone> within
  // 4000 ms (the group's timeout, as rank 0 waited it, having <context>)" or "rank(s) 1 left the group (...) while
  // rank 0 waited for every rank to <notDone>, having <context>".
  static std::string absentText(const Records& records, const std::string& notDone);

 private:
  const int rank_;
  const int size_;
  c10::intrusive_ptr<c10d::Store> store_;
  EngineWaits* waits_;
};

// "1, 3" from {1, 3}.
std::string rankList(const std::vector<int>& ranks);

// A running digest of a rank's sequence of stale reductions (per call: the key, size, dtype and kind), with
// checkpoints after calls 1, 2, 4, 8, ...: the same on every rank whose stale reductions are the same streams in
// the same order. Compared at flush: ranks whose digests differ diverged, and the checkpoints bound where.
// Cost: a few multiplications per call, no allocation but one checkpoint per doubling.
class SequenceDigest {
 public:
  void add(uint64_t key, int64_t numel, c10::ScalarType dtype, bool scatter);
  uint64_t calls() const { return calls_; }
  uint64_t value() const { return value_; }
  // checkpoints()[i]: the digest after call 2^i.
  const std::vector<uint64_t>& checkpoints() const { return checkpoints_; }

 private:
  uint64_t calls_ = 0;
  uint64_t value_ = 0xcbf29ce484222325ull;
  std::vector<uint64_t> checkpoints_;
};

// What one rank brings to flush: its digest and the streams it holds anything pending of.
struct FlushRecord {
  struct Stream {
    uint64_t key = 0;
    int64_t numel = 0;
    c10::ScalarType dtype = c10::ScalarType::Float;
    bool scatter = false;
    int64_t pendingGlobal = 0;  // contributions in flight over all ranks, by this rank's bookkeeping
    bool operator==(const Stream& o) const {
      return key == o.key && numel == o.numel && dtype == o.dtype && scatter == o.scatter &&
             pendingGlobal == o.pendingGlobal;
    }
  };
  uint64_t calls = 0;
  uint64_t digest = 0;
  std::vector<uint64_t> checkpoints;
  std::vector<Stream> pending;  // in key order

  std::string encode() const;
  static FlushRecord decode(const std::string& text);
};

// The verdict of flush from every rank's record: empty when the records agree (every rank then flushes the same
// streams, in key order), else what differs, in words that depend on the records alone (the same on every rank).
std::string flushDivergence(const std::vector<FlushRecord>& records);

}  // namespace delaycomm
