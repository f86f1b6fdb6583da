#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ops/OpTable.hpp"
#include "stats/Histogram.hpp"

namespace delaycomm {

// A latency profile (delay spec profile:FILE; the schema is docs/profile.md): per op and size class, the latency
// histogram its calls experienced, as `python -m delaycomm profile` writes it. This is the one parser and
// validator of profile files: Python reads a file's metadata only after loadProfile() accepted it.
//
// Draws: quantile(u, op, bytes) is the quantile function of the call's (op, size class) distribution, each
// bucket spread geometrically between its bounds and clipped to the class's min and max. A size class the op
// lacks interpolates between the op's nearest classes below and above (geometrically in the latency, linearly in
// the class index, i.e. in log2 of the size); beyond its smallest or largest class, the nearest one is used. An
// op the profile lacks (or op < 0) draws from every op of the profile pooled per size class; bytes < 0 (a draw
// without a call, e.g. DelayedLoader's) draws from the op's classes pooled.
//
// Threads: immutable after loading; safe from any thread.
class DelayProfile {
 public:
  static constexpr int kVersion = 1;

  // One (op, size class) distribution.
  struct Dist {
    uint64_t count = 0;
    uint64_t zeros = 0;
    double minNs = 0.0;
    double maxNs = 0.0;
    std::vector<int> buckets;      // bucket indices, increasing
    std::vector<uint64_t> cumEnd;  // zeros + counts up to and including buckets[i]
    double quantileNs(double u) const;
    double meanNs() const;
    void add(const Dist& other);  // pools other into this (merged histograms)
  };

  double quantile(double u, int op, int64_t bytes) const;  // seconds
  double mean() const;                                     // seconds, of every call pooled
  uint64_t digest() const { return digest_; }
  uint64_t calls() const { return all_.count; }
  int ops() const;
  int classes() const;

  // Loads and validates `path` (a regular file of at most kMaxTraceBytes). Errors: std::invalid_argument,
  // "profile file 'PATH' field FIELD: WHY (expected ...)" or "profile file 'PATH' is not JSON: line L column C:
  // WHY", without the "delaycomm: " prefix (the caller wraps it, as for trace files).
  static std::shared_ptr<const DelayProfile> load(const std::string& path);

 private:
  struct OpDists {
    std::vector<std::pair<int, Dist>> classes;  // sorted by size class
    Dist pooled;                                // every class of this op
    struct Interp {
      int lo = -1;  // index into classes
      int hi = -1;
      double w = 0.0;  // weight of hi
    };
    std::array<Interp, kSizeClasses> table{};
    void finish();
    double quantileNs(double u, int64_t bytes) const;
  };

  std::array<OpDists, kNumOpKinds> ops_{};
  std::array<bool, kNumOpKinds> present_{};
  OpDists pooledOps_;  // every op pooled per size class (the fallback)
  Dist all_;
  uint64_t digest_ = 0;
};

}  // namespace delaycomm
