// The ranks' agreement through the group's store (stale/Agreement.hpp). Design notes: docs/staleness.md, "The
// ranks' agreement".

#include "stale/Agreement.hpp"

#include <sstream>

#include <c10/util/Exception.h>

namespace delaycomm {

namespace {

std::vector<uint8_t> bytesOfText(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::string textOfBytes(const std::vector<uint8_t>& b) {
  return std::string(b.begin(), b.end());
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// StoreAgreement

StoreAgreement::StoreAgreement(int rank, int size, c10::intrusive_ptr<c10d::Store> store,
                               std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), store_(std::move(store)), timeout_(timeout) {}

StoreAgreement::Records StoreAgreement::exchange(const std::string& round, const std::string& mine) {
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    keys.push_back(round + "/" + std::to_string(r));
  }
  store_->set(keys[static_cast<size_t>(rank_)], bytesOfText(mine));
  Records out;
  try {
    store_->wait(keys, timeout_);
  } catch (const c10::Error&) {
    for (int r = 0; r < size_; ++r) {
      if (!store_->check({keys[static_cast<size_t>(r)]})) {
        out.missing.push_back(r);
      }
    }
    if (!out.missing.empty()) {
      return out;
    }
  }
  for (const auto& value : store_->multiGet(keys)) {
    out.byRank.push_back(textOfBytes(value));
  }
  return out;
}

void StoreAgreement::holdStoreUntilRead(const std::string& round) {
  const std::string prefix = round + "/read/";
  store_->set(prefix + std::to_string(rank_), bytesOfText("1"));
  if (rank_ != 0) {
    return;
  }
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) {
    keys.push_back(prefix + std::to_string(r));
  }
  try {
    store_->wait(keys, timeout_);
  } catch (const c10::Error&) {
    // A rank that never reads has its own timeout to report; rank 0 raises its verdict now.
  }
}

std::string rankList(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    out << (i ? ", " : "") << ranks[i];
  }
  return out.str();
}

}  // namespace delaycomm
