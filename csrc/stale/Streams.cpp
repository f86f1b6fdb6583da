// The staleness engine's streams (stale/StalenessEngine.hpp): keys, the bounded key table, and the step time
// (step_ms=auto: calibration and the ranks' agreement through the store). Design notes: docs/staleness.md,
// "Keys" and "Calibration".

#include <algorithm>
#include <sstream>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "stale/FsdpScope.hpp"
#include "stale/StalenessEngine.hpp"

namespace delaycomm {

namespace {

constexpr const char* kCalibrationPrefix = "calibration/";

std::vector<uint8_t> bytesOf(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::string textOf(const std::vector<uint8_t>& b) {
  return std::string(b.begin(), b.end());
}

// FNV-1a, 64-bit: a hash that every rank computes alike (std::hash is not specified to).
uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h = (h ^ p[i]) * 0x100000001b3ull;
  }
  return h;
}

}  // namespace

size_t StalenessEngine::IdentityHash::operator()(const Identity& id) const {
  size_t h = std::hash<const void*>()(id.storage);
  h ^= std::hash<int64_t>()(id.offset) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= std::hash<int64_t>()(id.numel) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= std::hash<int>()(static_cast<int>(id.dtype)) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= std::hash<c10::Device>()(id.device) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}

// ---------------------------------------------------------------------------------------------------------------
// Keys

StalenessEngine::KeyState& StalenessEngine::touchLocked(uint64_t key, const at::Tensor& t) {
  auto [it, inserted] = keys_.try_emplace(key);
  KeyState& ks = it->second;
  if (inserted) {
    ks.prototype = at::empty({0}, t.options());
    ks.numel = t.numel();
    ks.pendingOf.assign(static_cast<size_t>(size_), 0);
    ks.lru = lru_.insert(lru_.end(), key);
  } else {
    lru_.splice(lru_.end(), lru_, ks.lru);
  }
  return ks;
}

uint64_t StalenessEngine::keyOf(const at::Tensor& t) {
  const bool hasStorage = t.has_storage();
  const Identity id{hasStorage ? static_cast<const void*>(t.storage().unsafeGetStorageImpl()) : t.data_ptr(),
                    hasStorage ? t.storage_offset() : 0, t.numel(), t.scalar_type(), t.device()};
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, inserted] = identityKeys_.try_emplace(id, nextIdentityKey_);
  if (inserted) {
    ++nextIdentityKey_;
    KeyState& ks = touchLocked(it->second, t);
    ks.identity = id;
    if (hasStorage) {
      ks.storageRef = t.storage().getWeakStorageImpl();
    }
  }
  return it->second;
}

uint64_t StalenessEngine::scopeKey(const std::string& scope, int64_t numel, c10::ScalarType dtype, bool scatter) {
  // The stream is (scope, size, dtype): a parameter group whose set of gradients changes (a parameter without a
  // gradient in some step) reduces a tensor of another size, which is another stream, not a changed one.
  uint64_t h = fnv1a(0xcbf29ce484222325ull, scope.data(), scope.size());
  const auto type = static_cast<int32_t>(dtype);
  const uint8_t kind = scatter ? 1 : 0;
  h = fnv1a(h, &numel, sizeof numel);
  h = fnv1a(h, &type, sizeof type);
  h = fnv1a(h, &kind, sizeof kind);
  return kScopeKeyBase + (h & (kIdentityKeyBase - 1));
}

uint64_t StalenessEngine::keyOfScope(const std::string& scope, const at::Tensor& t, bool scatter) {
  const uint64_t key = scopeKey(scope, t.numel(), t.scalar_type(), scatter);
  std::lock_guard<std::mutex> lock(mutex_);
  KeyState& ks = touchLocked(key, t);
  if (ks.scope.empty()) {
    ks.scope = scope;
    ks.scatter = scatter;
  }
  return key;
}

uint64_t StalenessEngine::streamKey(const at::Tensor& t, bool scatter) {
  const std::string* scope = fsdp_scope::current();
  if (scope == nullptr) {
    return keyOf(t);
  }
  if (scatter) {
    fsdp_scope::noteReduceScatter();
  } else {
    // HSDP's all-reduce across replicas follows its shard group's reduce-scatter in the same FSDP2 scope; an
    // all-reduce alone in a scope (FSDP2 over a replicate-only mesh, or HSDP with the reduce-scatter BSP) is the
    // scope's one stale reduction.
    TORCH_CHECK_NOT_IMPLEMENTED(
        !fsdp_scope::reduceScattered(),
        "delaycomm: staleness does not support HSDP (fully_shard on a 2-D mesh) with both stages stale: the "
        "all-reduce across replicas in '",
        *scope,
        "' would go stale on its own schedule after its shard group's "
        "reduce-scatter did. Use fully_shard on a 1-D mesh (every rank one shard group); or make one stage stale "
        "with delay_ops (DELAYCOMM_DELAY_OPS): delay_ops=_reduce_scatter_base for staleness within each shard "
        "group (the all-reduce across replicas synchronous), delay_ops=allreduce for staleness across replicas "
        "(the reduce-scatter synchronous); or staleness=bsp");
  }
  return keyOfScope(*scope, t, scatter);
}

const char* StalenessEngine::opTextLocked(uint64_t key) const {
  auto it = keys_.find(key);
  return it != keys_.end() && it->second.scatter ? "reduce_scatter" : "all_reduce";
}

// Forgets the least recently used keys with nothing pending beyond maxKeys (docs/staleness.md, "Memory"). The
// order depends only on the sequence of keys, so every rank forgets the same keys at the same call.
void StalenessEngine::evictLocked(std::string* warning) {
  auto it = lru_.begin();
  while (static_cast<int64_t>(keys_.size()) > options_.maxKeys && it != lru_.end()) {
    auto ks = keys_.find(*it);
    TORCH_INTERNAL_ASSERT(ks != keys_.end(), "delaycomm: StalenessEngine: key table and LRU list disagree");
    auto& st = ks->second;
    if (!st.mine.empty() || !st.arrivals.empty() || std::next(it) == lru_.end()) {
      ++it;  // holds contributions in flight (never forgotten), or the key being prepared
      continue;
    }
    if (st.identity && st.seen <= 1 && !warnedUnengaged_) {
      warnedUnengaged_ = true;
      std::ostringstream msg;
      msg << "delaycomm: " << opTextLocked(*it) << " on group '" << options_.groupName << "': more than "
          << options_.maxKeys << " reduced tensors were each seen once: the tensors are new storage on (almost) "
          << "every call, so "
          << "they cannot be keyed as one stream by storage identity, and staleness never engages for them (they "
          << "are reduced fresh; the key table keeps the " << options_.maxKeys << " most recent). Key the stream "
          << "explicitly: for DDP, ddp.register_comm_hook(None, delaycomm.ddp_hook); otherwise "
          << "delaycomm.stale_allreduce(tensor, key=...). See docs/staleness.md";
      *warning = msg.str();
    }
    if (st.identity) {
      identityKeys_.erase(*st.identity);
    }
    keys_.erase(ks);
    it = lru_.erase(it);
  }
}

std::string StalenessEngine::describeKeyLocked(uint64_t key) const {
  std::ostringstream s;
  if (key < kIdentityKeyBase) {
    s << "key " << key;
    return s.str();
  }
  if (key >= kScopeKeyBase) {
    auto it = keys_.find(key);
    s << "'" << (it != keys_.end() ? it->second.scope : std::string("?")) << "'";
    if (it != keys_.end()) {
      s << " (" << (it->second.scatter ? "reduce_scatter " : "all_reduce ") << it->second.numel << " x "
        << it->second.prototype.scalar_type() << " on " << it->second.prototype.device() << ")";
    }
    return s.str();
  }
  s << "tensor #" << (key - kIdentityKeyBase) << " (keyed by storage";
  if (auto it = keys_.find(key); it != keys_.end()) {
    s << ": " << it->second.numel << " x " << it->second.prototype.scalar_type() << " on "
      << it->second.prototype.device();
  }
  s << ")";
  return s.str();
}

std::string StalenessEngine::describeKey(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return describeKeyLocked(key);
}

int64_t StalenessEngine::keyCount() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(keys_.size());
}

// ---------------------------------------------------------------------------------------------------------------
// step_ms=auto (docs/staleness.md, "Calibration")

std::optional<StalenessEngine::Proposal> StalenessEngine::calibrationLocked(KeyState& ks, uint64_t key,
                                                                            std::string* warning) {
  if (stepNs_ > 0 || calibrating_) {
    return std::nullopt;
  }
  const auto now = std::chrono::steady_clock::now();
  if (ks.lastCall != std::chrono::steady_clock::time_point{} &&
      static_cast<int64_t>(ks.intervals.size()) < options_.calibrationSteps) {
    ks.intervals.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(now - ks.lastCall).count());
  }
  ks.lastCall = now;
  if (static_cast<int64_t>(ks.intervals.size()) >= options_.calibrationSteps) {
    calibrating_ = true;
    auto v = ks.intervals;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return Proposal{key,
                    describeKeyLocked(key),
                    calls_,
                    std::max<int64_t>(1, v[v.size() / 2]),
                    static_cast<int64_t>(v.size()),
                    calibrationAttempts_++};
  }
  if (!warnedUnengaged_ && static_cast<int64_t>(calls_) >= options_.calibrationWarnCalls) {
    warnedUnengaged_ = true;
    size_t most = 0;
    for (const auto& [k, s] : keys_) {
      most = std::max(most, s.intervals.size() + (s.lastCall != std::chrono::steady_clock::time_point{} ? 1 : 0));
    }
    std::ostringstream msg;
    msg << "delaycomm: staleness on group '" << options_.groupName << "' has not engaged after " << calls_
        << " all-reduces: step_ms=auto is measured on the first stream (key) called " << options_.calibrationSteps + 1
        << " times, and no stream was (of the " << keys_.size() << " keys tracked, the most called was called " << most
        << " times), so every all-reduce ran fresh. Plain all_reduce calls are keyed by their tensor's storage, "
           "which changes when the tensor is new on every call: key the stream explicitly (for DDP, "
           "ddp.register_comm_hook(None, delaycomm.ddp_hook); otherwise delaycomm.stale_allreduce(tensor, "
           "key=...)), or set step_ms (DELAYCOMM_STEP_MS) so that no calibration is needed. See "
           "docs/staleness.md";
    *warning = msg.str();
  }
  return std::nullopt;
}

// Rank 0 checks that every rank proposes the same key at the same call and publishes its median; every rank
// waits for the decision (bounded by the group's timeout) and gets the same step or the same error.
int64_t StalenessEngine::agreeOnStep(const Proposal& p) {
  // One set of store keys per attempt: after a failed agreement (raised on every rank) a caller that goes on
  // tries again at a later call, and must not read the failed attempt's decision.
  const std::string prefix = kCalibrationPrefix + std::to_string(p.attempt) + "/";
  const std::string decisionKey = prefix + "decision";
  {
    std::ostringstream mine;
    mine << p.call << ' ' << p.key << ' ' << p.medianNs;
    store_->set(prefix + std::to_string(rank_), bytesOf(mine.str()));
  }
  const auto timeoutMs = options_.timeout.count();
  if (rank_ == 0) {
    std::vector<std::string> all;
    for (int r = 0; r < size_; ++r) {
      all.push_back(prefix + std::to_string(r));
    }
    std::string decision;
    try {
      store_->wait(all, options_.timeout);
    } catch (const c10::Error&) {
      std::ostringstream missing;
      for (int r = 0; r < size_; ++r) {
        if (!store_->check({all[static_cast<size_t>(r)]})) {
          missing << (missing.tellp() > 0 ? ", " : "") << r;
        }
      }
      std::ostringstream msg;
      msg << "delaycomm: staleness on group '" << options_.groupName << "': agreeing on step_ms=auto timed out "
          << "after " << timeoutMs << " ms (the group's timeout): rank 0 calibrated on " << p.keyText
          << " at all-reduce #" << p.call << ", and rank(s) " << missing.str()
          << " did not reach that point: the ranks' all-reduce sequences differ (or those ranks are stuck). "
             "Key the streams explicitly (ddp_hook, stale_allreduce(key=...)) or set step_ms (DELAYCOMM_STEP_MS)";
      decision = "fail " + msg.str();
    }
    if (decision.empty()) {
      bool agree = true;
      std::ostringstream detail;
      for (int r = 0; r < size_; ++r) {
        std::istringstream in(textOf(store_->get(all[static_cast<size_t>(r)])));
        uint64_t call = 0;
        uint64_t key = 0;
        int64_t median = 0;
        in >> call >> key >> median;
        agree = agree && call == p.call && key == p.key;
        detail << (r ? "; " : "") << "rank " << r << ": all-reduce #" << call << ", key " << key;
      }
      if (agree) {
        decision = "ok " + std::to_string(p.medianNs);
      } else {
        std::ostringstream msg;
        msg << "delaycomm: staleness on group '" << options_.groupName << "': the ranks calibrated step_ms=auto "
            << "on different streams (" << detail.str() << "): their all-reduce sequences differ, so they would "
            << "disagree on who is late. Plain all_reduce calls are keyed by tensor storage, which can differ "
               "across ranks: key the streams explicitly (ddp_hook, stale_allreduce(key=...)) or set step_ms "
               "(DELAYCOMM_STEP_MS)";
        decision = "fail " + msg.str();
      }
    }
    store_->set(decisionKey, bytesOf(decision));
  }
  std::string decision;
  try {
    store_->wait({decisionKey}, options_.timeout);
    decision = textOf(store_->get(decisionKey));
  } catch (const c10::Error&) {
    C10_THROW_ERROR(DistBackendError,
                    c10::str("delaycomm: staleness on group '", options_.groupName,
                             "': agreeing on step_ms=auto "
                             "timed out after ",
                             timeoutMs, " ms (the group's timeout): this rank (", rank_, ") calibrated on ", p.keyText,
                             " at all-reduce #", p.call,
                             " and rank 0 did not "
                             "publish the step: the ranks' all-reduce sequences differ (or rank 0 is stuck). Key "
                             "the streams explicitly (ddp_hook, stale_allreduce(key=...)) or set step_ms "
                             "(DELAYCOMM_STEP_MS)"));
  }
  if (decision.rfind("ok ", 0) == 0) {
    return std::stoll(decision.substr(3));
  }
  const std::string why = decision.rfind("fail ", 0) == 0 ? decision.substr(5) : decision;
  if (why.find("timed out") != std::string::npos) {
    C10_THROW_ERROR(DistBackendError, why);
  }
  C10_THROW_ERROR(Error, why);
}

StalenessEngine::StepSource StalenessEngine::stepSource() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return source_;
}

}  // namespace delaycomm
