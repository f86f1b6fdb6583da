#include "delay/Profile.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace delaycomm {

namespace {

uint64_t fnv(uint64_t h, uint64_t x) {
  for (int k = 0; k < 8; ++k) {
    h ^= (x >> (8 * k)) & 0xffu;
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t bitsOf(double v) {
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}

double bucketLow(int i) {
  return i == 0 ? 0.0 : std::pow(LogHistogram::kBase, i);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Distributions

double DelayProfile::Dist::quantileNs(double u) const {
  if (count == 0)
    return 0.0;
  const double target = std::clamp(u, 0.0, 1.0) * static_cast<double>(count);
  if (target < static_cast<double>(zeros) || buckets.empty())
    return 0.0;
  const size_t k =
      std::min<size_t>(std::upper_bound(cumEnd.begin(), cumEnd.end(), static_cast<uint64_t>(target)) - cumEnd.begin(),
                       cumEnd.size() - 1);
  const double start = static_cast<double>(k == 0 ? zeros : cumEnd[k - 1]);
  const double n = static_cast<double>(cumEnd[k]) - start;
  const double frac = std::clamp((target - start) / n, 0.0, 1.0);
  const int i = buckets[k];
  const double lo = bucketLow(i);
  const double hi = std::pow(LogHistogram::kBase, i + 1);
  const double v = lo > 0.0 ? lo * std::pow(hi / lo, frac) : frac * hi;
  return std::clamp(v, minNs, maxNs);
}

double DelayProfile::Dist::meanNs() const {
  if (count == 0)
    return 0.0;
  double s = 0.0;
  uint64_t before = zeros;
  for (size_t k = 0; k < buckets.size(); ++k) {
    s += static_cast<double>(cumEnd[k] - before) * std::clamp(LogHistogram::bucketValue(buckets[k]), minNs, maxNs);
    before = cumEnd[k];
  }
  return s / static_cast<double>(count);
}

void DelayProfile::Dist::add(const Dist& o) {
  if (o.count == 0)
    return;
  std::vector<std::pair<int, uint64_t>> merged;
  auto counts = [](const Dist& d) {
    std::vector<std::pair<int, uint64_t>> out;
    uint64_t before = d.zeros;
    for (size_t k = 0; k < d.buckets.size(); ++k) {
      out.emplace_back(d.buckets[k], d.cumEnd[k] - before);
      before = d.cumEnd[k];
    }
    return out;
  };
  const auto a = counts(*this);
  const auto b = counts(o);
  std::merge(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(merged));
  // The pooled size: the count-weighted mean of the parts' sizes, when every part has one.
  if (count == 0) {
    sizeBytes = o.sizeBytes;
  } else if (sizeBytes >= 0 && o.sizeBytes >= 0) {
    const double mine = static_cast<double>(sizeBytes);
    const double theirs = static_cast<double>(o.sizeBytes);
    const double mean = (mine * static_cast<double>(count) + theirs * static_cast<double>(o.count)) /
                        (static_cast<double>(count) + static_cast<double>(o.count));
    sizeBytes = std::clamp(static_cast<int64_t>(std::llround(mean)), std::min(sizeBytes, o.sizeBytes),
                           std::max(sizeBytes, o.sizeBytes));
  } else {
    sizeBytes = -1;
  }
  minNs = count ? std::min(minNs, o.minNs) : o.minNs;
  maxNs = count ? std::max(maxNs, o.maxNs) : o.maxNs;
  count += o.count;
  zeros += o.zeros;
  buckets.clear();
  cumEnd.clear();
  uint64_t total = zeros;
  for (const auto& [idx, c] : merged) {
    total += c;
    if (!buckets.empty() && buckets.back() == idx) {
      cumEnd.back() = total;
    } else {
      buckets.push_back(idx);
      cumEnd.push_back(total);
    }
  }
}

void DelayProfile::OpDists::finish() {
  pooled = Dist{};
  for (const auto& [c, d] : classes)
    pooled.add(d);
  // A rare class (fewer than kMinClassCalls calls: set-up and teardown calls) is not a distribution: its sizes
  // draw from the op's full classes as a size the op lacks does. An op with no full class keeps its own classes.
  std::vector<int> usable;  // indices into classes, by size
  for (int i = 0; i < static_cast<int>(classes.size()); ++i) {
    if (classes[static_cast<size_t>(i)].second.count >= kMinClassCalls)
      usable.push_back(i);
  }
  if (usable.empty()) {
    for (int i = 0; i < static_cast<int>(classes.size()); ++i)
      usable.push_back(i);
  }
  auto sizeOf = [&](size_t k) { return classes[static_cast<size_t>(usable[k])].first; };
  for (int c = 0; c < kSizeClasses; ++c) {
    Interp& t = table[static_cast<size_t>(c)];
    size_t hi = 0;
    while (hi < usable.size() && sizeOf(hi) < c)
      ++hi;
    if (hi < usable.size() && sizeOf(hi) == c) {
      t = {usable[hi], usable[hi], 0.0};
    } else if (hi == 0) {
      t = {usable[0], usable[0], 0.0};
    } else if (hi == usable.size()) {
      t = {usable[hi - 1], usable[hi - 1], 0.0};
    } else {
      const double w = static_cast<double>(c - sizeOf(hi - 1)) / static_cast<double>(sizeOf(hi) - sizeOf(hi - 1));
      t = {usable[hi - 1], usable[hi], w};
    }
  }
  finishBySize(usable);
}

namespace {

// Where size class c >= 1 starts on the axis of positions (sizePosition): log2 of its smallest size.
double classStart2(int c) {
  return static_cast<double>(c - 1);
}

}  // namespace

void DelayProfile::OpDists::finishBySize(const std::vector<int>& usable) {
  points.clear();
  zeroIndex = -1;
  bySize = false;
  for (const int i : usable) {
    const auto& [c, d] = classes[static_cast<size_t>(i)];
    if (c == 0) {
      zeroIndex = i;
      continue;
    }
    Point p{i, classStart2(c), std::nextafter(classStart2(c + 1), -1.0), false};
    if (d.sizeBytes >= 1) {
      p.lo2 = p.hi2 = DelayProfile::sizePosition(d.sizeBytes);
      p.sized = bySize = true;
    }
    points.push_back(p);
  }
  if (!bySize)
    return;
  floor2 = classStart2(classes[static_cast<size_t>(points.front().index)].first);
  ceil2 = std::nextafter(classStart2(classes[static_cast<size_t>(points.back().index)].first + 1), -1.0);
  // The log-log slope of the class means between two neighbouring points, clipped to [0, 1]: latency at most
  // linear in the size (bandwidth-bound), never falling with it.
  auto slope = [&](const Point& a, const Point& b) {
    const double ma = classes[static_cast<size_t>(a.index)].second.meanNs();
    const double mb = classes[static_cast<size_t>(b.index)].second.meanNs();
    if (!(ma > 0.0 && mb > 0.0 && b.lo2 > a.hi2))
      return 0.0;
    return std::clamp(std::log2(mb / ma) / (b.lo2 - a.hi2), 0.0, 1.0);
  };
  const size_t n = points.size();
  slopeLo = n >= 2 ? slope(points[0], points[1]) : 0.0;
  slopeHi = n >= 2 ? slope(points[n - 2], points[n - 1]) : 0.0;
}

int64_t DelayProfile::snappedBytes(int64_t bytes) {
  if (bytes > 1) {
    const int up = 64 - __builtin_clzll(static_cast<uint64_t>(bytes - 1));  // 2^up >= bytes
    if (up < 63) {
      const int64_t pow2 = int64_t{1} << up;
      if (pow2 != bytes && (pow2 - bytes) * 1000 <= pow2)
        return pow2;
    }
  }
  return bytes;
}

int DelayProfile::drawClassOf(int64_t bytes) {
  return sizeClassOf(snappedBytes(bytes));
}

double DelayProfile::sizePosition(int64_t bytes) {
  return std::log2(static_cast<double>(snappedBytes(bytes)));
}

double DelayProfile::OpDists::quantileNs(double u, int64_t bytes) const {
  if (bytes < 0 || classes.empty())
    return pooled.quantileNs(u);
  if (bySize)
    return quantileBySizeNs(u, bytes);
  const Interp& t = table[static_cast<size_t>(drawClassOf(bytes))];
  const double lo = classes[static_cast<size_t>(t.lo)].second.quantileNs(u);
  if (t.lo == t.hi)
    return lo;
  const double hi = classes[static_cast<size_t>(t.hi)].second.quantileNs(u);
  if (lo > 0.0 && hi > 0.0)
    return std::exp((1.0 - t.w) * std::log(lo) + t.w * std::log(hi));
  return (1.0 - t.w) * lo + t.w * hi;
}

double DelayProfile::OpDists::quantileBySizeNs(double u, int64_t bytes) const {
  if (bytes == 0 && zeroIndex >= 0)
    return classes[static_cast<size_t>(zeroIndex)].second.quantileNs(u);
  const double t = bytes > 0 ? sizePosition(bytes) : -std::numeric_limits<double>::infinity();
  const size_t n = points.size();
  // The first point that ends at or above t (points increase: each lies in its own class's range).
  const size_t k = static_cast<size_t>(
      std::lower_bound(points.begin(), points.end(), t, [](const Point& p, double v) { return p.hi2 < v; }) -
      points.begin());
  auto draw = [&](size_t i) { return classes[static_cast<size_t>(points[i].index)].second.quantileNs(u); };
  if (k < n && points[k].lo2 <= t)
    return draw(k);  // at a class's size (or on a class without one): that class, exactly
  if (k == 0) {      // below the first point: scaled down to the bottom of its class, then flat
    const Point& p = points.front();
    return p.sized ? draw(0) * std::exp2(slopeLo * (std::max(t, floor2) - p.lo2)) : draw(0);
  }
  if (k == n) {  // above the last point: scaled up to the top of its class, then flat
    const Point& p = points.back();
    return p.sized ? draw(n - 1) * std::exp2(slopeHi * (std::min(t, ceil2) - p.hi2)) : draw(n - 1);
  }
  const Point& a = points[k - 1];
  const Point& b = points[k];
  const double w = std::clamp((t - a.hi2) / (b.lo2 - a.hi2), 0.0, 1.0);
  const double lo = draw(k - 1);
  const double hi = draw(k);
  if (lo > 0.0 && hi > 0.0)
    return std::exp((1.0 - w) * std::log(lo) + w * std::log(hi));
  return (1.0 - w) * lo + w * hi;
}

int DelayProfile::familyOf(int op) {
  switch (static_cast<OpKind>(op)) {
    case OpKind::kAllreduce:
    case OpKind::kAllreduceCoalesced:
    case OpKind::kReduce:
    case OpKind::kReduceScatter:
    case OpKind::kReduceScatterBase:
    case OpKind::kReduceScatterTensorCoalesced:
      return 0;
    case OpKind::kAllgather:
    case OpKind::kAllgatherBase:
    case OpKind::kAllgatherCoalesced:
    case OpKind::kAllgatherIntoTensorCoalesced:
    case OpKind::kGather:
    case OpKind::kAlltoallBase:
    case OpKind::kAlltoall:
      return 1;
    case OpKind::kBroadcast:
    case OpKind::kScatter:
      return 2;
    case OpKind::kSend:
    case OpKind::kRecv:
    case OpKind::kRecvAnysource:
      return 3;
    default:
      return 4;
  }
}

std::string DelayProfile::fallbackOf(int op) const {
  if (op < 0 || op >= kNumOpKinds || present_[static_cast<size_t>(op)])
    return "";
  if (!familyPresent_[static_cast<size_t>(familyOf(op))])
    return "every op of the profile pooled (it has no op of the same kind)";
  return "the profile's ops of the same kind (" + kindNames(op) + "), nearest in size";
}

std::string DelayProfile::kindNames(int op) const {
  std::string names;
  for (int k = 0; k < kNumOpKinds; ++k) {
    if (k != op && present_[static_cast<size_t>(k)] && familyOf(k) == familyOf(op))
      names += std::string(names.empty() ? "" : ", ") + opName(static_cast<OpKind>(k));
  }
  return names;
}

bool DelayProfile::OpDists::covers(int c) const {
  const Interp& t = table[static_cast<size_t>(c)];
  return !classes.empty() && (t.lo != t.hi || classes[static_cast<size_t>(t.lo)].first == c);
}

int DelayProfile::OpDists::nearest(int c) const {
  // The classes the draws use (table: the full classes, or every class where none is full).
  int best = kSizeClasses;
  for (const Interp& t : table) {
    for (const int i : {t.lo, t.hi}) {
      if (i >= 0)
        best = std::min(best, std::abs(classes[static_cast<size_t>(i)].first - c));
    }
  }
  return best;
}

bool DelayProfile::drawsFromKind(int op, int64_t bytes) const {
  return op >= 0 && op < kNumOpKinds && bytes > 0 &&
         byKind_[static_cast<size_t>(op)][static_cast<size_t>(drawClassOf(bytes))];
}

std::string DelayProfile::kindFallbackOf(int op, int64_t bytes) const {
  if (!drawsFromKind(op, bytes))
    return "";
  const int own = ops_[static_cast<size_t>(op)].nearest(drawClassOf(bytes));
  return "the profile's ops of the same kind (" + kindNames(op) + "), nearer in size: the profile's own " +
         opName(static_cast<OpKind>(op)) + " classes are " + std::to_string(own) + " size classes away";
}

double DelayProfile::quantile(double u, int op, int64_t bytes) const {
  const bool known = op >= 0 && op < kNumOpKinds && present_[static_cast<size_t>(op)];
  if (op < 0 && bytes < 0)
    return all_.quantileNs(u) * 1e-9;
  if (known && drawsFromKind(op, bytes))
    return families_[static_cast<size_t>(familyOf(op))].quantileNs(u, bytes) * 1e-9;
  if (known)
    return ops_[static_cast<size_t>(op)].quantileNs(u, bytes) * 1e-9;
  if (op >= 0 && op < kNumOpKinds && familyPresent_[static_cast<size_t>(familyOf(op))])
    return families_[static_cast<size_t>(familyOf(op))].quantileNs(u, bytes) * 1e-9;
  return pooledOps_.quantileNs(u, bytes) * 1e-9;
}

double DelayProfile::mean() const {
  return all_.meanNs() * 1e-9;
}

int DelayProfile::ops() const {
  return static_cast<int>(std::count(present_.begin(), present_.end(), true));
}

std::vector<ProfileClassInfo> DelayProfile::classInfo() const {
  std::vector<ProfileClassInfo> out;
  for (size_t kind = 0; kind < ops_.size(); ++kind) {
    for (const auto& [c, d] : ops_[kind].classes) {
      out.push_back({static_cast<OpKind>(kind), static_cast<int64_t>(sizeClassBytes(c)), d.count, d.zeros, d.minNs,
                     d.maxNs, d.count < kMinClassCalls, d.sizeBytes});
    }
  }
  return out;
}

int DelayProfile::classes() const {
  return static_cast<int>(pooledOps_.classes.size());
}

namespace {

[[noreturn]] void badClass(const ProfileClass& c, const std::string& why) {
  throw std::invalid_argument(std::string("delaycomm: DelayProfile: the size class of ") + std::to_string(c.bytes) +
                              " bytes of op " + opName(c.op) + " " + why +
                              " (profiles are checked by delaycomm.profile before they reach the native code)");
}

// The class as a distribution; the invariants delaycomm.profile's schema check guarantees, asserted.
DelayProfile::Dist distOf(const ProfileClass& c) {
  if (c.bucketIndex.size() != c.bucketCount.size())
    badClass(c, "has " + std::to_string(c.bucketIndex.size()) + " bucket indices and " +
                    std::to_string(c.bucketCount.size()) + " counts");
  if (!(c.minNs >= 0.0 && c.minNs <= c.maxNs && std::isfinite(c.maxNs)))
    badClass(c, "has min_ns and max_ns out of order or range");
  DelayProfile::Dist d;
  d.count = c.count;
  d.zeros = c.zeros;
  d.minNs = c.minNs;
  d.maxNs = c.maxNs;
  uint64_t total = c.zeros;
  int prev = -1;
  for (size_t k = 0; k < c.bucketIndex.size(); ++k) {
    const int idx = c.bucketIndex[k];
    if (idx <= prev || idx >= LogHistogram::kBuckets || c.bucketCount[k] == 0)
      badClass(c, "has bucket indices that do not increase in [0, 1699], or an empty bucket");
    prev = idx;
    total += c.bucketCount[k];
    d.buckets.push_back(idx);
    d.cumEnd.push_back(total);
  }
  if (c.count == 0 || total != c.count)
    badClass(c, "has a count that is not zeros plus the buckets' counts, or none");
  if (c.sizeBytes != -1 &&
      (c.bytes == 0 ? c.sizeBytes != 0
                    : c.sizeBytes < 1 || DelayProfile::drawClassOf(c.sizeBytes) != sizeClassOf(c.bytes)))
    badClass(c, "has a size (" + std::to_string(c.sizeBytes) + " bytes) the sampler does not read as this class");
  d.sizeBytes = c.sizeBytes;
  return d;
}

}  // namespace

std::shared_ptr<const DelayProfile> DelayProfile::fromClasses(const std::vector<ProfileClass>& classes) {
  auto p = std::make_shared<DelayProfile>();
  if (classes.empty())
    throw std::invalid_argument("delaycomm: DelayProfile: a profile has at least one size class");
  for (const ProfileClass& c : classes) {
    if (c.bytes < 0 || (c.bytes != 0 && (c.bytes & (c.bytes - 1)) != 0))
      badClass(c, "is not 0 or a power of two");
    auto& od = p->ops_[static_cast<size_t>(c.op)];
    const int cls = sizeClassOf(c.bytes);
    for (const auto& [known, _] : od.classes) {
      if (known == cls)
        badClass(c, "is given twice");
    }
    od.classes.emplace_back(cls, distOf(c));
    p->present_[static_cast<size_t>(c.op)] = true;
  }
  // The digest: every op in OpKind order, its classes by size (the content, whatever the order of the file).
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t kind = 0; kind < p->ops_.size(); ++kind) {
    auto& od = p->ops_[kind];
    if (!p->present_[kind])
      continue;
    std::sort(od.classes.begin(), od.classes.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    od.finish();
    h = fnv(h, static_cast<uint64_t>(kind));
    for (const auto& [c, d] : od.classes) {
      h = fnv(fnv(fnv(fnv(h, static_cast<uint64_t>(c)), d.zeros), bitsOf(d.minNs)), bitsOf(d.maxNs));
      for (size_t b = 0; b < d.buckets.size(); ++b)
        h = fnv(fnv(h, static_cast<uint64_t>(d.buckets[b])), d.cumEnd[b]);
      if (d.sizeBytes >= 0)  // only when given: a profile without sizes keeps its digest
        h = fnv(fnv(h, 0x73697a65ull), static_cast<uint64_t>(d.sizeBytes));
    }
  }
  p->digest_ = h;
  // The fallback: every op pooled per size class.
  for (int c = 0; c < kSizeClasses; ++c) {
    Dist pooled;
    for (const auto& od : p->ops_) {
      for (const auto& [cls, d] : od.classes) {
        if (cls == c)
          pooled.add(d);
      }
    }
    if (pooled.count)
      p->pooledOps_.classes.emplace_back(c, std::move(pooled));
  }
  p->pooledOps_.finish();
  p->all_ = p->pooledOps_.pooled;
  // The fallback of an op the profile lacks: the ops of its kind pooled per size class.
  for (int fam = 0; fam < kFamilies; ++fam) {
    OpDists& f = p->families_[static_cast<size_t>(fam)];
    for (int c = 0; c < kSizeClasses; ++c) {
      Dist pooled;
      for (int k = 0; k < kNumOpKinds; ++k) {
        if (!p->present_[static_cast<size_t>(k)] || familyOf(k) != fam)
          continue;
        for (const auto& [cls, d] : p->ops_[static_cast<size_t>(k)].classes) {
          if (cls == c)
            pooled.add(d);
        }
      }
      if (pooled.count)
        f.classes.emplace_back(c, std::move(pooled));
    }
    p->familyPresent_[static_cast<size_t>(fam)] = !f.classes.empty();
    if (!f.classes.empty())
      f.finish();
  }
  // A size beyond an op's classes, more than one class from the nearest, draws from its kind where that is nearer.
  for (int k = 0; k < kNumOpKinds; ++k) {
    if (!p->present_[static_cast<size_t>(k)])
      continue;
    const OpDists& own = p->ops_[static_cast<size_t>(k)];
    const OpDists& kind = p->families_[static_cast<size_t>(familyOf(k))];
    for (int c = 1; c < kSizeClasses; ++c) {
      if (own.covers(c))
        continue;
      const int mine = own.nearest(c);
      p->byKind_[static_cast<size_t>(k)][static_cast<size_t>(c)] = mine > 1 && kind.nearest(c) < mine;
    }
  }
  return p;
}

}  // namespace delaycomm
