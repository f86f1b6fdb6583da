#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace delaycomm {

// How the ranks of a group agree on what the staleness engine cannot derive from the shared schedule alone: the
// step time (step_ms=auto; docs/staleness.md, "The ranks' agreement"). It goes through the group's store, never
// through a collective, so a rank that is elsewhere (in another collective, or stuck) never pairs with it: the
// ranks that arrived raise at the timeout.
//
// Every rank publishes its record and reads every rank's, then decides by itself from the same records: the same
// verdict, or the same error, on every rank, with no round for a decision.
//
// Threads: exchange() blocks on the store (bounded by the timeout); callers hold no lock of theirs meanwhile.
class StoreAgreement {
 public:
  StoreAgreement(int rank, int size, c10::intrusive_ptr<c10d::Store> store, std::chrono::milliseconds timeout);

  struct Records {
    std::vector<std::string> byRank;  // every rank's record, in rank order (empty when some rank is missing)
    std::vector<int> missing;         // the ranks that had not published within the timeout
  };
  // Publishes `mine` as this rank's record of `round` (a name no earlier round used) and waits, up to the timeout,
  // for every rank's.
  Records exchange(const std::string& round, const std::string& mine);
  // After a verdict that fails on every rank, before raising it: every rank marks that it has read the records and
  // rank 0 waits (bounded by the timeout) for every mark. Rank 0 hosts the store under env:// and mp.spawn; were it
  // to raise and exit first, a rank still reading would get a network error instead of the verdict.
  void holdStoreUntilRead(const std::string& round);

  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  const int rank_;
  const int size_;
  c10::intrusive_ptr<c10d::Store> store_;
  const std::chrono::milliseconds timeout_;
};

// "1, 3" from {1, 3}.
std::string rankList(const std::vector<int>& ranks);

}  // namespace delaycomm
