#include "delay/Profile.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "delay/DelaySpec.hpp"

namespace delaycomm {

namespace {

// ---------------------------------------------------------------------------------------------------------------
// A small JSON reader (RFC 8259): the profile file is the only JSON the native code reads.

struct Json {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  double number = 0.0;
  std::string string;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;

  const Json* get(const std::string& key) const {
    for (const auto& [k, v] : object) {
      if (k == key)
        return &v;
    }
    return nullptr;
  }
};

const char* typeName(Json::Type t) {
  switch (t) {
    case Json::Type::kNull:
      return "null";
    case Json::Type::kBool:
      return "a boolean";
    case Json::Type::kNumber:
      return "a number";
    case Json::Type::kString:
      return "a string";
    case Json::Type::kArray:
      return "an array";
    case Json::Type::kObject:
      return "an object";
  }
  return "?";
}

class JsonReader {
 public:
  explicit JsonReader(std::string_view text) : s_(text) {}

  // The document, or throws std::runtime_error("line L column C: WHY").
  Json document() {
    Json v = value(0);
    skipSpace();
    if (i_ != s_.size())
      fail("unexpected text after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < i_ && k < s_.size(); ++k) {
      if (s_[k] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw std::runtime_error("line " + std::to_string(line) + " column " + std::to_string(col) + ": " + why);
  }

  void skipSpace() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r'))
      ++i_;
  }

  bool literal(std::string_view word) {
    if (s_.substr(i_, word.size()) == word) {
      i_ += word.size();
      return true;
    }
    return false;
  }

  Json value(int depth) {
    if (depth > 64)
      fail("nested more than 64 levels deep");
    skipSpace();
    if (i_ >= s_.size())
      fail("unexpected end of the file");
    Json v;
    const char c = s_[i_];
    if (c == '{') {
      v.type = Json::Type::kObject;
      ++i_;
      skipSpace();
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return v;
      }
      while (true) {
        skipSpace();
        if (i_ >= s_.size() || s_[i_] != '"')
          fail("expected a quoted key");
        std::string key = str();
        for (const auto& kv : v.object) {
          if (kv.first == key)
            fail("key " + quoted(key) + " is given twice");
        }
        skipSpace();
        if (i_ >= s_.size() || s_[i_] != ':')
          fail("expected ':' after a key");
        ++i_;
        v.object.emplace_back(std::move(key), value(depth + 1));
        skipSpace();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < s_.size() && s_[i_] == '}') {
          ++i_;
          return v;
        }
        fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.type = Json::Type::kArray;
      ++i_;
      skipSpace();
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return v;
      }
      while (true) {
        v.array.push_back(value(depth + 1));
        skipSpace();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < s_.size() && s_[i_] == ']') {
          ++i_;
          return v;
        }
        fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.type = Json::Type::kString;
      v.string = str();
      return v;
    }
    if (literal("true")) {
      v.type = Json::Type::kBool;
      v.boolean = true;
      return v;
    }
    if (literal("false")) {
      v.type = Json::Type::kBool;
      return v;
    }
    if (literal("null"))
      return v;
    v.type = Json::Type::kNumber;
    v.number = num();
    return v;
  }

  double num() {
    const size_t start = i_;
    auto digits = [&] {
      const size_t d = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9')
        ++i_;
      return i_ > d;
    };
    if (i_ < s_.size() && s_[i_] == '-')
      ++i_;
    if (!digits())
      fail("expected a value (a number, a string, an array, an object, true, false or null)");
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (!digits())
        fail("expected digits after '.'");
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-'))
        ++i_;
      if (!digits())
        fail("expected digits in the exponent");
    }
    const std::string token(s_.substr(start, i_ - start));
    const double v = std::strtod(token.c_str(), nullptr);
    if (!std::isfinite(v))
      fail("the number " + token + " is out of range");
    return v;
  }

  static void utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  uint32_t hex4() {
    if (i_ + 4 > s_.size())
      fail("expected four hex digits after \\u");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s_[i_++];
      v <<= 4;
      if (h >= '0' && h <= '9')
        v |= static_cast<uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f')
        v |= static_cast<uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F')
        v |= static_cast<uint32_t>(h - 'A' + 10);
      else
        fail("expected four hex digits after \\u");
    }
    return v;
  }

  std::string str() {
    ++i_;  // the opening quote
    std::string out;
    while (true) {
      if (i_ >= s_.size())
        fail("a string is not closed");
      const char c = s_[i_++];
      if (c == '"')
        return out;
      if (static_cast<unsigned char>(c) < 0x20)
        fail("a control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size())
        fail("a string is not closed");
      const char e = s_[i_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xd800 && cp <= 0xdbff && s_.substr(i_, 2) == "\\u") {
            i_ += 2;
            const uint32_t lo = hex4();
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          }
          utf8(out, cp);
          break;
        }
        default:
          fail("an unknown escape in a string");
      }
    }
  }

  std::string_view s_;
  size_t i_ = 0;
};

// ---------------------------------------------------------------------------------------------------------------
// Validation: every error names the field (a path such as ops.allreduce[2].buckets[5]).

struct Invalid {
  std::string field;
  std::string why;
};

[[noreturn]] void invalid(const std::string& field, const std::string& why) {
  throw Invalid{field, why};
}

const Json& need(const Json& obj, const std::string& path, const std::string& key, Json::Type type,
                 const char* expected) {
  const Json* v = obj.get(key);
  const std::string field = path.empty() ? key : path + "." + key;
  if (v == nullptr)
    invalid(field, std::string("is missing (expected ") + expected + ")");
  if (v->type != type)
    invalid(field, std::string("is ") + typeName(v->type) + " (expected " + expected + ")");
  return *v;
}

// A whole number in [lo, hi].
uint64_t whole(const Json& v, const std::string& field, double lo, double hi, const char* expected) {
  if (v.type != Json::Type::kNumber || v.number != std::floor(v.number) || v.number < lo || v.number > hi) {
    invalid(field,
            (v.type == Json::Type::kNumber ? "is " + std::to_string(v.number) : std::string("is ") + typeName(v.type)) +
                " (expected " + expected + ")");
  }
  return static_cast<uint64_t>(v.number);
}

double nonNegative(const Json& obj, const std::string& path, const std::string& key) {
  const Json& v = need(obj, path, key, Json::Type::kNumber, "a number of nanoseconds >= 0");
  if (!(v.number >= 0.0))
    invalid(path + "." + key, "is " + std::to_string(v.number) + " (expected a number of nanoseconds >= 0)");
  return v.number;
}

constexpr double kMaxCount = 9007199254740992.0;  // 2^53: counts stay exact in JSON numbers

DelayProfile::Dist readDist(const Json& e, const std::string& path) {
  DelayProfile::Dist d;
  d.count = whole(need(e, path, "count", Json::Type::kNumber, "a whole number >= 1"), path + ".count", 1, kMaxCount,
                  "a whole number >= 1");
  if (const Json* z = e.get("zeros"))
    d.zeros = whole(*z, path + ".zeros", 0, kMaxCount, "a whole number >= 0");
  d.minNs = nonNegative(e, path, "min_ns");
  d.maxNs = nonNegative(e, path, "max_ns");
  if (d.minNs > d.maxNs)
    invalid(path + ".min_ns", "is larger than max_ns");
  const Json& buckets = need(e, path, "buckets", Json::Type::kArray, "an array of [index, count] pairs");
  uint64_t total = d.zeros;
  int prev = -1;
  for (size_t k = 0; k < buckets.array.size(); ++k) {
    const std::string f = path + ".buckets[" + std::to_string(k) + "]";
    const Json& pair = buckets.array[k];
    if (pair.type != Json::Type::kArray || pair.array.size() != 2)
      invalid(f, "is not an [index, count] pair");
    const int idx = static_cast<int>(
        whole(pair.array[0], f + "[0]", 0, LogHistogram::kBuckets - 1, "a bucket index from 0 to 1699"));
    if (idx <= prev)
      invalid(f + "[0]", "is not larger than the index before it (expected increasing bucket indices)");
    prev = idx;
    const uint64_t c = whole(pair.array[1], f + "[1]", 1, kMaxCount, "a whole count >= 1");
    total += c;
    d.buckets.push_back(idx);
    d.cumEnd.push_back(total);
  }
  if (total != d.count) {
    invalid(path + ".count", "is " + std::to_string(d.count) + " but zeros and buckets hold " + std::to_string(total) +
                                 " (expected their sum)");
  }
  return d;
}

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
  for (int c = 0; c < kSizeClasses; ++c) {
    Interp& t = table[static_cast<size_t>(c)];
    const auto it = std::lower_bound(classes.begin(), classes.end(), c,
                                     [](const std::pair<int, Dist>& e, int v) { return e.first < v; });
    const int hi = static_cast<int>(it - classes.begin());
    if (it != classes.end() && it->first == c) {
      t = {hi, hi, 0.0};
    } else if (hi == 0) {
      t = {0, 0, 0.0};
    } else if (it == classes.end()) {
      t = {hi - 1, hi - 1, 0.0};
    } else {
      const int lo = hi - 1;
      const double w = static_cast<double>(c - classes[static_cast<size_t>(lo)].first) /
                       static_cast<double>(it->first - classes[static_cast<size_t>(lo)].first);
      t = {lo, hi, w};
    }
  }
}

double DelayProfile::OpDists::quantileNs(double u, int64_t bytes) const {
  if (bytes < 0 || classes.empty())
    return pooled.quantileNs(u);
  const Interp& t = table[static_cast<size_t>(sizeClassOf(bytes))];
  const double lo = classes[static_cast<size_t>(t.lo)].second.quantileNs(u);
  if (t.lo == t.hi)
    return lo;
  const double hi = classes[static_cast<size_t>(t.hi)].second.quantileNs(u);
  if (lo > 0.0 && hi > 0.0)
    return std::exp((1.0 - t.w) * std::log(lo) + t.w * std::log(hi));
  return (1.0 - t.w) * lo + t.w * hi;
}

double DelayProfile::quantile(double u, int op, int64_t bytes) const {
  const bool known = op >= 0 && op < kNumOpKinds && present_[static_cast<size_t>(op)];
  if (op < 0 && bytes < 0)
    return all_.quantileNs(u) * 1e-9;
  const OpDists& d = known ? ops_[static_cast<size_t>(op)] : pooledOps_;
  return d.quantileNs(u, bytes) * 1e-9;
}

double DelayProfile::mean() const {
  return all_.meanNs() * 1e-9;
}

int DelayProfile::ops() const {
  return static_cast<int>(std::count(present_.begin(), present_.end(), true));
}

int DelayProfile::classes() const {
  return static_cast<int>(pooledOps_.classes.size());
}

std::shared_ptr<const DelayProfile> DelayProfile::load(const std::string& path) {
  const std::string name = "profile file " + quoted(path);
  std::string text;
  if (std::string why = readSmallFile(name, path, &text); !why.empty())
    throw std::invalid_argument(why);
  Json doc;
  try {
    doc = JsonReader(text).document();
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(name + " is not JSON: " + e.what() +
                                " (expected a profile written by "
                                "python -m delaycomm profile; docs/profile.md)");
  }
  auto p = std::make_shared<DelayProfile>();
  try {
    if (doc.type != Json::Type::kObject)
      invalid("(top level)", std::string("is ") + typeName(doc.type) + " (expected an object)");
    const Json& format = need(doc, "", "format", Json::Type::kString, "\"delaycomm-profile\"");
    if (format.string != "delaycomm-profile")
      invalid("format", "is " + quoted(format.string) + " (expected \"delaycomm-profile\")");
    const uint64_t version =
        whole(need(doc, "", "version", Json::Type::kNumber, "1"), "version", 0, 1e9, "a whole number");
    if (version != kVersion) {
      invalid("version",
              "is " + std::to_string(version) + " (this delaycomm reads version " + std::to_string(kVersion) + ")");
    }
    const Json& hist = need(doc, "", "histogram", Json::Type::kObject, "an object with base and unit");
    const Json& base = need(hist, "histogram", "base", Json::Type::kNumber, "1.02");
    if (base.number != LogHistogram::kBase)
      invalid("histogram.base", "is " + std::to_string(base.number) + " (expected 1.02)");
    const Json& unit = need(hist, "histogram", "unit", Json::Type::kString, "\"ns\"");
    if (unit.string != "ns")
      invalid("histogram.unit", "is " + quoted(unit.string) + " (expected \"ns\")");
    need(doc, "", "metadata", Json::Type::kObject, "an object");
    const Json& ops = need(doc, "", "ops", Json::Type::kObject, "an object of op name: [size class, ...]");
    uint64_t h = 0xcbf29ce484222325ull;
    std::vector<std::pair<OpKind, const Json*>> byOp;
    for (const auto& [opName, entries] : ops.object) {
      OpKind kind{};
      if (!opFromName(opName, &kind))
        invalid("ops." + opName, "is not an op delaycomm knows (expected a name such as allreduce, broadcast)");
      for (const auto& [k, _] : byOp) {
        if (k == kind)
          invalid("ops." + opName, "names an op given already under another name");
      }
      if (entries.type != Json::Type::kArray || entries.array.empty()) {
        invalid("ops." + opName, std::string("is ") + typeName(entries.type) +
                                     (entries.type == Json::Type::kArray ? " that is empty" : "") +
                                     " (expected an array of size classes)");
      }
      byOp.emplace_back(kind, &entries);
    }
    if (byOp.empty())
      invalid("ops", "is empty (expected at least one op)");
    std::sort(byOp.begin(), byOp.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [kind, entries] : byOp) {
      const std::string opPath = std::string("ops.") + opName(kind);
      auto& od = p->ops_[static_cast<size_t>(kind)];
      for (size_t k = 0; k < entries->array.size(); ++k) {
        const std::string f = opPath + "[" + std::to_string(k) + "]";
        const Json& e = entries->array[k];
        if (e.type != Json::Type::kObject)
          invalid(f, std::string("is ") + typeName(e.type) + " (expected an object)");
        const uint64_t bytes = whole(need(e, f, "bytes", Json::Type::kNumber, "0 or a power of two"), f + ".bytes", 0,
                                     4.611686018427388e18, "0 or a power of two");
        if (bytes != 0 && (bytes & (bytes - 1)) != 0)
          invalid(f + ".bytes", "is " + std::to_string(bytes) + " (expected 0 or a power of two: a size class)");
        const int cls = sizeClassOf(static_cast<int64_t>(bytes));
        for (const auto& [c, _] : od.classes) {
          if (c == cls)
            invalid(f + ".bytes", "names a size class given already for this op");
        }
        od.classes.emplace_back(cls, readDist(e, f));
      }
      std::sort(od.classes.begin(), od.classes.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      od.finish();
      p->present_[static_cast<size_t>(kind)] = true;
      h = fnv(h, static_cast<uint64_t>(kind));
      for (const auto& [c, d] : od.classes) {
        h = fnv(fnv(fnv(fnv(h, static_cast<uint64_t>(c)), d.zeros), bitsOf(d.minNs)), bitsOf(d.maxNs));
        for (size_t b = 0; b < d.buckets.size(); ++b)
          h = fnv(fnv(h, static_cast<uint64_t>(d.buckets[b])), d.cumEnd[b]);
      }
    }
    p->digest_ = h;
  } catch (const Invalid& e) {
    throw std::invalid_argument(name + " field " + e.field + " " + e.why + "; docs/profile.md has the schema");
  }
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
  return p;
}

}  // namespace delaycomm
