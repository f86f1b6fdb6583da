// The ranks' agreement through the group's store (stale/Agreement.hpp). Design notes: docs/staleness.md, "The
// ranks' agreement".

#include "stale/Agreement.hpp"

#include <algorithm>
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

// One word into the digest: a multiply and a shift (the same on every rank; no allocation).
uint64_t digestMix(uint64_t h, uint64_t v) {
  h = (h ^ v) * 0x9e3779b97f4a7c15ull;
  return h ^ (h >> 29);
}

// A stream as every rank can name it from a record alone.
std::string streamText(const FlushRecord::Stream& s) {
  constexpr uint64_t kExplicitKeyLimit = uint64_t{1} << 40;  // KeyTable::kExplicitKeyLimit
  constexpr uint64_t kScopeKeyBase = uint64_t{1} << 41;      // KeyTable's
  std::ostringstream out;
  if (s.key < kExplicitKeyLimit) {
    out << "key " << s.key;
  } else {
    out << "stream " << std::hex << (s.key - kScopeKeyBase) << std::dec;
  }
  out << " (" << (s.scatter ? "reduce_scatter " : "all_reduce ") << s.numel << " x " << s.dtype << ", "
      << s.pendingGlobal << " in flight)";
  return out.str();
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

// ---------------------------------------------------------------------------------------------------------------
// SequenceDigest

void SequenceDigest::add(uint64_t key, int64_t numel, c10::ScalarType dtype, bool scatter) {
  value_ = digestMix(value_, key);
  value_ = digestMix(value_, static_cast<uint64_t>(numel));
  value_ = digestMix(value_, (static_cast<uint64_t>(dtype) << 1) | (scatter ? 1 : 0));
  ++calls_;
  if ((calls_ & (calls_ - 1)) == 0) {  // a power of two
    checkpoints_.push_back(value_);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// FlushRecord

std::string FlushRecord::encode() const {
  std::ostringstream out;
  out << calls << ' ' << digest << ' ' << checkpoints.size();
  for (uint64_t c : checkpoints) {
    out << ' ' << c;
  }
  out << ' ' << pending.size();
  for (const auto& s : pending) {
    out << ' ' << s.key << ' ' << s.numel << ' ' << static_cast<int>(s.dtype) << ' ' << (s.scatter ? 1 : 0) << ' '
        << s.pendingGlobal;
  }
  return out.str();
}

FlushRecord FlushRecord::decode(const std::string& text) {
  std::istringstream in(text);
  FlushRecord r;
  size_t n = 0;
  in >> r.calls >> r.digest >> n;
  r.checkpoints.resize(n);
  for (auto& c : r.checkpoints) {
    in >> c;
  }
  in >> n;
  r.pending.resize(n);
  for (auto& s : r.pending) {
    int dtype = 0;
    int scatter = 0;
    in >> s.key >> s.numel >> dtype >> scatter >> s.pendingGlobal;
    s.dtype = static_cast<c10::ScalarType>(dtype);
    s.scatter = scatter != 0;
  }
  TORCH_INTERNAL_ASSERT(!in.fail(), "delaycomm: flush: a rank's record could not be read: '", text, "'");
  return r;
}

std::string flushDivergence(const std::vector<FlushRecord>& records) {
  const FlushRecord& first = records.at(0);
  const bool sameSequence = std::all_of(records.begin(), records.end(), [&](const FlushRecord& r) {
    return r.calls == first.calls && r.digest == first.digest;
  });
  const bool samePending =
      std::all_of(records.begin(), records.end(), [&](const FlushRecord& r) { return r.pending == first.pending; });
  if (sameSequence && samePending) {
    return "";
  }
  std::ostringstream out;
  if (!sameSequence) {
    // The longest prefix 2^i that every rank made alike.
    size_t agreed = 0;
    while (std::all_of(records.begin(), records.end(), [&](const FlushRecord& r) {
      return agreed < r.checkpoints.size() && agreed < first.checkpoints.size() &&
             r.checkpoints[agreed] == first.checkpoints[agreed];
    })) {
      ++agreed;
    }
    out << "their sequences of stale reductions differ (";
    for (size_t r = 0; r < records.size(); ++r) {
      out << (r ? "; " : "") << "rank " << r << ": " << records[r].calls << " stale reductions";
    }
    out << ")";
    if (agreed == 0) {
      out << ", from the first one";
    } else {
      out << ": the first " << (uint64_t{1} << (agreed - 1)) << " are the same streams on every rank, the first "
          << (uint64_t{1} << agreed) << " are not";
    }
  }
  if (!samePending) {
    out << (sameSequence ? "" : "; ") << "they hold different contributions pending (";
    for (size_t r = 0; r < records.size(); ++r) {
      out << (r ? "; " : "") << "rank " << r << ": ";
      if (records[r].pending.empty()) {
        out << "none";
      }
      for (size_t i = 0; i < records[r].pending.size(); ++i) {
        out << (i ? ", " : "") << streamText(records[r].pending[i]);
      }
    }
    out << ")";
  }
  return out.str();
}

}  // namespace delaycomm
