// The staleness engine's key table (stale/KeyTable.hpp). Design notes: docs/staleness.md, "Keys" and "Memory".

#include "stale/KeyTable.hpp"

#include <sstream>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace delaycomm {

namespace {

// FNV-1a, 64-bit: a hash that every rank computes alike (std::hash is not specified to).
uint64_t fnv1aBytes(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h = (h ^ p[i]) * 0x100000001b3ull;
  }
  return h;
}

}  // namespace

int64_t KeyTable::Stream::pendingGlobal() const {
  int64_t n = 0;
  for (const auto& [step, list] : arrivals) {
    n += static_cast<int64_t>(list.size());
  }
  return n;
}

KeyTable::KeyTable(int size, int64_t maxKeys) : size_(size), maxKeys_(maxKeys) {
  TORCH_INTERNAL_ASSERT(maxKeys_ >= 1, "delaycomm: KeyTable: maxKeys must be >= 1, got ", maxKeys_);
}

KeyTable::Stream& KeyTable::touch(uint64_t key, const at::Tensor& t) {
  auto [it, inserted] = streams_.try_emplace(key);
  Stream& stream = it->second;
  if (inserted) {
    stream.prototype = at::empty({0}, t.options());
    stream.numel = t.numel();
    stream.pendingOf.assign(static_cast<size_t>(size_), 0);
    stream.lru = lru_.insert(lru_.end(), key);
  } else {
    lru_.splice(lru_.end(), lru_, stream.lru);
  }
  return stream;
}

uint64_t KeyTable::scopeKey(const std::string& scope, int64_t numel, c10::ScalarType dtype, bool scatter) {
  // The stream is (name, size, dtype, kind): a parameter group whose set of gradients changes (a parameter without
  // a gradient in some step) reduces a tensor of another size, which is another stream, not a changed one.
  uint64_t h = fnv1aBytes(0xcbf29ce484222325ull, scope.data(), scope.size());
  const auto type = static_cast<int32_t>(dtype);
  const uint8_t kind = scatter ? 1 : 0;
  h = fnv1aBytes(h, &numel, sizeof numel);
  h = fnv1aBytes(h, &type, sizeof type);
  h = fnv1aBytes(h, &kind, sizeof kind);
  return kScopeKeyBase + (h & (kExplicitKeyLimit - 1));
}

uint64_t KeyTable::scopedKey(const std::string& scope, const at::Tensor& t, bool scatter) {
  const uint64_t key = scopeKey(scope, t.numel(), t.scalar_type(), scatter);
  Stream& stream = touch(key, t);
  if (stream.scope.empty()) {
    stream.scope = scope;
    stream.scatter = scatter;
  }
  return key;
}

void KeyTable::evict() {
  auto it = lru_.begin();
  while (static_cast<int64_t>(streams_.size()) > maxKeys_ && it != lru_.end()) {
    auto found = streams_.find(*it);
    TORCH_INTERNAL_ASSERT(found != streams_.end(), "delaycomm: KeyTable: the key table and its LRU list disagree");
    const Stream& stream = found->second;
    if (stream.holdsPending() || std::next(it) == lru_.end()) {
      ++it;  // holds contributions in flight (never forgotten), or the key being prepared
      continue;
    }
    streams_.erase(found);
    it = lru_.erase(it);
  }
}

KeyTable::Stream* KeyTable::find(uint64_t key) {
  auto it = streams_.find(key);
  return it == streams_.end() ? nullptr : &it->second;
}

const KeyTable::Stream* KeyTable::find(uint64_t key) const {
  auto it = streams_.find(key);
  return it == streams_.end() ? nullptr : &it->second;
}

const char* KeyTable::opText(uint64_t key) const {
  const Stream* stream = find(key);
  return stream != nullptr && stream->scatter ? "reduce_scatter" : "all_reduce";
}

std::string KeyTable::describe(uint64_t key) const {
  std::ostringstream s;
  if (key < kExplicitKeyLimit) {
    s << "key " << key;
    return s.str();
  }
  const Stream* stream = find(key);
  s << "'" << (stream != nullptr ? stream->scope : std::string("?")) << "'";
  if (stream != nullptr) {
    s << " (" << (stream->scatter ? "reduce_scatter " : "all_reduce ") << stream->numel << " x "
      << stream->prototype.scalar_type() << " on " << stream->prototype.device() << ")";
  }
  return s.str();
}

}  // namespace delaycomm
