// The owners of gradient reductions (stale/Owners.hpp; docs/staleness.md, "Which reductions go stale").

#include "stale/Owners.hpp"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <unordered_map>

#include <ATen/ATen.h>

namespace delaycomm::owners {

namespace {

struct ParamEntry {
  explicit ParamEntry(c10::weak_intrusive_ptr<c10::TensorImpl> r) : ref(std::move(r)) {}
  c10::weak_intrusive_ptr<c10::TensorImpl> ref;
  uint64_t lastStep = 0;  // the event count of the last step that consumed it (0: never)
  uint64_t lastSkip = 0;  // the event count of the last step that threw its gradient away (0: never)
  uint64_t lastZero = 0;  // the event count of its last zero_grad
  std::vector<std::pair<int64_t, size_t>> consumers;  // (consumer, the parameter's index there)
  int64_t ddp = -1;                                   // the DDP whose reducer holds it, and its bucket there
  int64_t bucket = -1;
};

struct ConsumerEntry {
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> params;
  std::vector<Ranges> ranges;
  // Each of its streams' last reduction (openReduction, by the stream's key: streams of one layout share the
  // consumer): each parameter's first fate after it, set by the first optimizer event that touches the parameter
  // (a later event does not change it).
  std::map<uint64_t, std::vector<Fate>> open;
};

void settle(ParamEntry& e, Fate fate);

struct DdpEntry {
  std::string group;
  std::vector<DdpBucket> buckets;
  bool dynamicUnused = false;
  bool ownReducer = true;
  size_t next = 0;  // the bucket the reducer launches next in this round
};

std::mutex ownersMutex;
std::unordered_map<const c10::TensorImpl*, ParamEntry> paramTable;
std::vector<ConsumerEntry> consumerTable;
std::unordered_map<uint64_t, int64_t> openConsumerOf;  // stream key -> the consumer of its last reduction
std::map<int64_t, DdpEntry> ddpTable;
uint64_t optimizerSteps = 0;  // optimizer events: steps, skips, zero_grads
uint64_t reductions = 0;
std::atomic<double> currentLossScale{1.0};
std::atomic<bool> sawScaler{false};

thread_local std::vector<Scope> tlsOwnerScopes;
thread_local std::vector<int64_t> tlsShadows;

// The live entry of `impl` (a dead tensor's entry at a reused address is dropped), or nullptr.
ParamEntry* liveParamEntry(const c10::TensorImpl* impl) {
  auto it = paramTable.find(impl);
  if (it == paramTable.end()) {
    return nullptr;
  }
  if (it->second.ref.expired()) {
    paramTable.erase(it);
    return nullptr;
  }
  return &it->second;
}

ParamEntry& paramEntryOf(const at::Tensor& t) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (ParamEntry* e = liveParamEntry(impl)) {
    return *e;
  }
  return paramTable.emplace(impl, ParamEntry(c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr())))
      .first->second;
}

// The first optimizer event after a consumer's reduction settles each of its parameters' fate.
void settle(ParamEntry& e, Fate fate) {
  for (const auto& [id, index] : e.consumers) {
    for (auto& [key, first] : consumerTable[static_cast<size_t>(id)].open) {
      if (index < first.size() && first[index] == Fate::kOpen) {
        first[index] = fate;
      }
    }
  }
}

}  // namespace

int64_t addConsumer(const std::vector<at::Tensor>& ps) {
  std::lock_guard<std::mutex> lock(ownersMutex);
  ConsumerEntry c;
  const auto id = static_cast<int64_t>(consumerTable.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    paramEntryOf(ps[i]).consumers.emplace_back(id, i);
    c.params.emplace_back(ps[i].getIntrusivePtr());
  }
  consumerTable.push_back(std::move(c));
  return static_cast<int64_t>(consumerTable.size()) - 1;
}

void setRanges(int64_t consumer, const std::vector<Ranges>& ranges) {
  std::lock_guard<std::mutex> lock(ownersMutex);
  if (consumer >= 0 && consumer < static_cast<int64_t>(consumerTable.size()) &&
      ranges.size() == consumerTable[static_cast<size_t>(consumer)].params.size()) {
    consumerTable[static_cast<size_t>(consumer)].ranges = ranges;
  }
}

namespace {
// The step now counted skipped `ps`; ownersMutex held.
void markSkipped(const std::vector<at::Tensor>& ps) {
  for (const auto& p : ps) {
    ParamEntry& e = paramEntryOf(p);
    e.lastSkip = optimizerSteps;
    settle(e, Fate::kSkipped);
  }
}
}  // namespace

void optimizerStepped(const std::vector<at::Tensor>& consumed, const std::vector<at::Tensor>& skipped) {
  std::lock_guard<std::mutex> lock(ownersMutex);
  ++optimizerSteps;
  for (const auto& p : consumed) {
    ParamEntry& e = paramEntryOf(p);
    e.lastStep = optimizerSteps;
    settle(e, Fate::kTaken);
  }
  markSkipped(skipped);
}

void optimizerSkipped(const std::vector<at::Tensor>& ps) {
  std::lock_guard<std::mutex> lock(ownersMutex);
  ++optimizerSteps;
  markSkipped(ps);
}

void gradsDiscarded(const std::vector<at::Tensor>& ps) {
  std::lock_guard<std::mutex> lock(ownersMutex);
  ++optimizerSteps;
  for (const auto& p : ps) {
    ParamEntry& e = paramEntryOf(p);
    // No step consumed (or skipped) it since its last zero_grad: what it held was thrown away.
    if (e.lastStep <= e.lastZero && e.lastSkip <= e.lastZero) {
      e.lastSkip = optimizerSteps;
      settle(e, Fate::kSkipped);
    }
    e.lastZero = optimizerSteps;
  }
}

uint64_t stepCount() {
  std::lock_guard<std::mutex> lock(ownersMutex);
  return optimizerSteps;
}

void openReduction(int64_t consumer, uint64_t stream) {
  std::lock_guard<std::mutex> lock(ownersMutex);
  if (consumer < 0 || consumer >= static_cast<int64_t>(consumerTable.size())) {
    return;
  }
  // A stream whose owner registered its layout anew (DDP rebuilding its buckets) keeps its key: its record moves.
  if (auto it = openConsumerOf.find(stream); it != openConsumerOf.end() && it->second != consumer) {
    consumerTable[static_cast<size_t>(it->second)].open.erase(stream);
  }
  openConsumerOf[stream] = consumer;
  ConsumerEntry& c = consumerTable[static_cast<size_t>(consumer)];
  c.open[stream].assign(c.params.size(), Fate::kOpen);
}

std::optional<std::vector<Fate>> fates(uint64_t stream) {
  std::lock_guard<std::mutex> lock(ownersMutex);
  const auto at = openConsumerOf.find(stream);
  if (at == openConsumerOf.end()) {
    return std::nullopt;
  }
  const ConsumerEntry& c = consumerTable[static_cast<size_t>(at->second)];
  const auto it = c.open.find(stream);
  std::vector<Fate> out = it != c.open.end() ? it->second : std::vector<Fate>(c.params.size(), Fate::kOpen);
  for (size_t i = 0; i < out.size(); ++i) {
    if (c.params[i].expired()) {
      out[i] = Fate::kOpen;  // a parameter whose tensor died
    }
  }
  return out;
}

std::vector<Ranges> rangesOf(int64_t consumer) {
  std::lock_guard<std::mutex> lock(ownersMutex);
  if (consumer < 0 || consumer >= static_cast<int64_t>(consumerTable.size())) {
    return {};
  }
  return consumerTable[static_cast<size_t>(consumer)].ranges;
}

bool consumedSince(uint64_t stream) {
  const auto fs = fates(stream);
  return fs && std::all_of(fs->begin(), fs->end(), [](Fate f) { return f == Fate::kTaken; });
}

void setLossScale(double scale) {
  currentLossScale.store(scale, std::memory_order_relaxed);
  sawScaler.store(true, std::memory_order_relaxed);
}

double lossScale() {
  return currentLossScale.load(std::memory_order_relaxed);
}

bool scalerSeen() {
  return sawScaler.load(std::memory_order_relaxed);
}

uint64_t reductionCount() {
  std::lock_guard<std::mutex> lock(ownersMutex);
  return reductions;
}

void countReduction() {
  std::lock_guard<std::mutex> lock(ownersMutex);
  ++reductions;
}

void enterScope(Scope scope) {
  if (scope.kind == ScopeKind::kDdpShadow) {
    tlsShadows.push_back(scope.ddp);
  }
  tlsOwnerScopes.push_back(std::move(scope));
}

bool exitScope() {
  if (tlsOwnerScopes.empty()) {
    return false;
  }
  const Scope& s = tlsOwnerScopes.back();
  const bool scatterStale = s.scatterStale;
  if (s.kind == ScopeKind::kDdpShadow && !tlsShadows.empty()) {
    tlsShadows.pop_back();
  }
  tlsOwnerScopes.pop_back();
  return scatterStale;
}

Scope* innermostScope() {
  return tlsOwnerScopes.empty() ? nullptr : &tlsOwnerScopes.back();
}

int64_t shadowDdp() {
  return tlsShadows.empty() ? -1 : tlsShadows.back();
}

void ddpLayout(int64_t ddp, const std::string& group, std::vector<DdpBucket> buckets, bool dynamicUnused,
               bool ownReducer) {
  std::lock_guard<std::mutex> lock(ownersMutex);
  DdpEntry& d = ddpTable[ddp];
  for (auto& [impl, e] : paramTable) {
    if (e.ddp == ddp) {
      e.ddp = -1;
      e.bucket = -1;
    }
  }
  for (size_t i = 0; i < buckets.size(); ++i) {
    for (const auto& p : buckets[i].params) {
      ParamEntry& e = paramEntryOf(p);
      e.ddp = ddp;
      e.bucket = static_cast<int64_t>(i);
    }
    // The entries above hold the parameters weakly; the layout keeps no reference to them.
    buckets[i].params.clear();
  }
  d.group = group;
  d.buckets = std::move(buckets);
  d.dynamicUnused = dynamicUnused;
  d.ownReducer = ownReducer;
  d.next = 0;
}

void ddpRound(int64_t ddp) {
  std::lock_guard<std::mutex> lock(ownersMutex);
  if (auto it = ddpTable.find(ddp); it != ddpTable.end()) {
    it->second.next = 0;
  }
}

void ddpForget(int64_t ddp) {
  std::lock_guard<std::mutex> lock(ownersMutex);
  ddpTable.erase(ddp);
}

DdpMatch matchDdpReduction(const c10::TensorImpl* param, int64_t shadow, const std::string& group,
                           const at::Tensor& t) {
  std::lock_guard<std::mutex> lock(ownersMutex);
  DdpMatch m;
  int64_t ddp = shadow;
  int64_t bucketOfParam = -1;
  if (param != nullptr) {
    const ParamEntry* e = liveParamEntry(param);
    if (e == nullptr || e->ddp < 0) {
      return m;
    }
    ddp = e->ddp;
    bucketOfParam = e->bucket;
  }
  auto it = ddpTable.find(ddp);
  if (it == ddpTable.end() || it->second.group != group) {
    return m;
  }
  DdpEntry& d = it->second;
  m.kind = DdpMatch::Kind::kOther;
  if (!d.ownReducer || d.next >= d.buckets.size()) {
    return m;
  }
  // The reducer launches its buckets in index order, each once per round, and only once the bucket is ready: the
  // bucket launched from a parameter's gradient accumulation is that parameter's or a later one.
  const DdpBucket& b = d.buckets[d.next];
  if (t.numel() != b.numel || t.scalar_type() != b.dtype || bucketOfParam > static_cast<int64_t>(d.next)) {
    return m;
  }
  ++d.next;
  m.kind = d.dynamicUnused ? DdpMatch::Kind::kUnused : DdpMatch::Kind::kBucket;
  m.stream = b.stream;
  m.consumer = b.consumer;
  return m;
}

}  // namespace delaycomm::owners
