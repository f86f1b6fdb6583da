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

StoreAgreement::StoreAgreement(int rank, int size, c10::intrusive_ptr<c10d::Store> store, EngineWaits* waits)
    : rank_(rank), size_(size), store_(std::move(store)), waits_(waits) {}

std::chrono::milliseconds StoreAgreement::timeout() const {
  return waits_->timeout();
}

namespace {

// The round's seal: "agreed", or "<missing|gone> <sealer> <timeout ms> <n> <ranks...> <m> <unpublished...>
// <context>" (ranks: the missing or the gone ones).
void appendRanks(std::ostringstream& out, const std::vector<int>& ranks) {
  out << ' ' << ranks.size();
  for (int k : ranks) {
    out << ' ' << k;
  }
}

std::vector<int> readRanks(std::istringstream& in) {
  size_t n = 0;
  in >> n;
  std::vector<int> ranks(n);
  for (auto& k : ranks) {
    in >> k;
  }
  return ranks;
}

std::string sealText(const StoreAgreement::Records& r, const std::string& context) {
  std::ostringstream out;
  out << (r.missing.empty() ? "gone " : "missing ") << r.sealer << ' ' << r.timeoutMs;
  appendRanks(out, r.missing.empty() ? r.gone : r.missing);
  appendRanks(out, r.unpublished);
  out << ' ' << context;
  return out.str();
}

StoreAgreement::Records parseSeal(const std::string& text) {
  std::istringstream in(text);
  std::string kind;
  StoreAgreement::Records r;
  in >> kind >> r.sealer >> r.timeoutMs;
  (kind == "missing" ? r.missing : r.gone) = readRanks(in);
  r.unpublished = readRanks(in);
  in >> std::ws;
  std::getline(in, r.context);
  TORCH_INTERNAL_ASSERT(!in.bad() && (kind == "missing" || kind == "gone"),
                        "delaycomm: the ranks' agreement: a round's seal could not be read: '", text, "'");
  return r;
}

// The first line of a store error (c10d appends a C++ backtrace after it).
std::string firstLine(const std::exception& e) {
  std::string text = e.what();
  return text.substr(0, text.find('\n'));
}

}  // namespace

StoreAgreement::Records StoreAgreement::exchange(const std::string& round, const std::string& mine,
                                                 const std::string& where, const std::string& what,
                                                 const std::string& context) {
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    keys.push_back(round + "/" + std::to_string(r));
  }
  const std::string sealKey = round + "/seal";
  const auto timeout = waits_->timeout();
  Records out;
  std::string seal;
  EngineWaits::Woke woke = EngineWaits::Woke::kDone;
  try {
    store_->set(keys[static_cast<size_t>(rank_)], bytesOfText(mine));
    // NOTE: c10d's TCPStore does not acknowledge a set: this check makes sure the record is in the store before
    // this rank can go on (and leave), so that a member found gone has published all it ever will.
    store_->check({keys[static_cast<size_t>(rank_)]});
    bool all = false;
    woke = waits_->waitUntil(SteadyClock::now() + timeout, [&] {
      all = store_->check(keys);
      return all || store_->check({sealKey});
    });
    if (woke == EngineWaits::Woke::kClosed) {
      C10_THROW_ERROR(DistBackendError,
                      c10::str(where, "the group was shut down (destroy_process_group or abort) while this rank ", what,
                               "; nothing was agreed"));
    }
    Records verdict;
    if (!all && (woke == EngineWaits::Woke::kDeadline || woke == EngineWaits::Woke::kGone)) {
      for (int r = 0; r < size_; ++r) {
        if (!store_->check({keys[static_cast<size_t>(r)]})) {
          verdict.unpublished.push_back(r);
        }
      }
      verdict.sealer = rank_;
      verdict.timeoutMs = timeout.count();
      if (woke == EngineWaits::Woke::kGone) {
        verdict.gone = waits_->gone();
      } else {
        verdict.missing = verdict.unpublished;
      }
      if (verdict.unpublished.empty()) {
        verdict = Records{};  // every record came after all: agreed
      }
    }
    // The first verdict written is every rank's (compareSet writes only where there is none yet).
    const std::string proposal = verdict.agreed() ? "agreed" : sealText(verdict, context);
    seal = textOfBytes(store_->compareSet(sealKey, {}, bytesOfText(proposal)));
    if (seal == "agreed") {
      for (const auto& value : store_->multiGet(keys)) {
        out.byRank.push_back(textOfBytes(value));
      }
    }
  } catch (const c10::DistBackendError&) {
    throw;
  } catch (const std::exception& e) {
    const auto gone = waits_->gone();
    C10_THROW_ERROR(DistBackendError,
                    c10::str(where, "the group's store failed while this rank ", what, " (", firstLine(e),
                             "): its host has gone (under env:// and mp.spawn the store is rank 0's process, under "
                             "torchrun the agent's)",
                             gone.empty() ? "" : c10::str("; rank(s) ", rankList(gone), " left the group")));
  }
  return seal == "agreed" ? out : parseSeal(seal);
}

void StoreAgreement::holdStoreUntilRead(const std::string& round, const Records& records) {
  const std::string prefix = round + "/read/";
  try {
    store_->set(prefix + std::to_string(rank_), bytesOfText("1"));
    store_->check({prefix + std::to_string(rank_)});  // in the store before this rank raises (see exchange)
    if (rank_ != 0) {
      return;
    }
    auto absent = [&](int r) {  // not in the round when it was sealed: it reads later, or never
      const auto& u = records.unpublished;
      const auto& g = records.gone;
      return std::find(u.begin(), u.end(), r) != u.end() || std::find(g.begin(), g.end(), r) != g.end();
    };
    waits_->waitUntil(
        SteadyClock::now() + waits_->timeout(),
        [&] {
          const auto gone = waits_->gone();  // a member gone since reads nothing more
          std::vector<std::string> keys;
          for (int r = 0; r < size_; ++r) {
            if (!absent(r) && std::find(gone.begin(), gone.end(), r) == gone.end()) {
              keys.push_back(prefix + std::to_string(r));
            }
          }
          return store_->check(keys);
        },
        /*endWhenGone=*/false);
  } catch (const std::exception&) {
    // The store's host has gone: nobody is left to read. The caller raises its verdict now.
  }
}

std::string StoreAgreement::absentText(const Records& r, const std::string& notDone) {
  const std::string having = r.context.empty() ? "" : c10::str(", having ", r.context);
  if (!r.missing.empty()) {
    return c10::str("rank(s) ", rankList(r.missing), " did not ", notDone, " within ", r.timeoutMs,
                    " ms (the group's timeout, as rank ", r.sealer, " waited it", having, ")");
  }
  return c10::str("rank(s) ", rankList(r.gone),
                  " left the group (its process ended, or it destroyed or aborted the group: its peer-watch "
                  "connection closed) while rank ",
                  r.sealer, " waited for every rank to ", notDone, having);
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
