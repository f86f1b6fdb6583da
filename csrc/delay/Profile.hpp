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

// One (op, size class) of a profile as Python hands it over (delaycomm/profile.py reads the file with Python's json
// and checks it against the schema, docs/profile.md; this is its numbers, in arrays).
struct ProfileClass {
  OpKind op{};
  int64_t bytes = 0;  // the class's smallest size: 0 or a power of two
  uint64_t count = 0;
  uint64_t zeros = 0;
  double minNs = 0.0;
  double maxNs = 0.0;
  std::vector<int> bucketIndex;       // increasing, in [0, LogHistogram::kBuckets)
  std::vector<uint64_t> bucketCount;  // >= 1 each; zeros + their sum = count
  // The size its latencies were measured at (the schema's optional size_bytes): a size the sampler reads as this
  // class (DelayProfile::drawClassOf), 0 for the class of 0 bytes; -1 when the profile does not say.
  int64_t sizeBytes = -1;
};

// What a profile says about one of its classes (per-class metadata for Python: calls, the range).
struct ProfileClassInfo {
  OpKind op{};
  int64_t bytes = 0;
  uint64_t count = 0;
  uint64_t zeros = 0;
  double minNs = 0.0;
  double maxNs = 0.0;
  // Fewer than DelayProfile::kMinClassCalls calls: not replayed as a distribution of its own (see there).
  bool rare = false;
  int64_t sizeBytes = -1;  // ProfileClass::sizeBytes
};

// A latency profile (delay spec profile:FILE; the schema is docs/profile.md): per op and size class, the latency
// histogram its calls experienced, as `python -m delaycomm profile` writes it. Files are read and checked in
// Python, once (delaycomm.profile: the one schema check, whose messages name the file and the field); this holds
// the numbers and draws from them.
//
// Draws: quantile(u, op, bytes) is the quantile function of the call's (op, size class) distribution, each
// bucket spread geometrically between its bounds and clipped to the class's min and max. A size class the op
// lacks interpolates between the op's nearest classes below and above (geometrically in the latency, linearly in
// the class index, i.e. in log2 of the size); beyond its smallest or largest class, the nearest one is used.
// Within a class (docs/profile.md, "Replay"): where the op's classes say the size their latencies were measured
// at (sizeBytes), a call of b bytes draws by its own size, continuous in log2(b) (sizePosition: a size within 0.1%
// under a power of two counts as that power): a call at a class's size draws that class exactly, one between two
// classes' sizes interpolates between them as above (linearly in log2 b). Past the op's first or last size, up to
// the edge of that class, the class is scaled by (b / size)^slope, slope the log-log slope of the means of the two
// end classes, clipped to [0, 1] (at most linear in the size: a bandwidth-bound class at most doubles up to its
// top); beyond the edge it stays as at the edge. A class without a size is drawn for every size in its class (a
// plateau between its neighbours' sizes); class 0 only for 0 bytes; an op none of whose classes has a size draws
// by class, as above. Rare classes (kMinClassCalls) count as lacking where the op has a class that is not rare. An
// op the profile lacks draws from the profile's ops of the same kind (familyOf: reductions, gathers, broadcasts,
// point-to-point) pooled per size class, nearest in size as above, and from every op pooled only when the profile
// has no op of its kind (or op < 0); fallbackOf says which. bytes < 0 (a draw without a call, e.g. DelayedLoader's)
// draws from the op's classes pooled.
//
// Threads: immutable after loading; safe from any thread.
class DelayProfile {
 public:
  static constexpr int kVersion = 1;
  // A class with fewer calls is rare (set-up and teardown calls, docs/profile.md "Replay"): its sizes draw from the
  // op's other classes, interpolated as a size the op lacks, unless the op has no class of this many calls.
  static constexpr uint64_t kMinClassCalls = 16;

  // One (op, size class) distribution.
  struct Dist {
    uint64_t count = 0;
    uint64_t zeros = 0;
    double minNs = 0.0;
    double maxNs = 0.0;
    std::vector<int> buckets;      // bucket indices, increasing
    std::vector<uint64_t> cumEnd;  // zeros + counts up to and including buckets[i]
    // The size it was measured at (ProfileClass::sizeBytes), or -1; pooled classes: the count-weighted mean of
    // their parts' sizes when every part has one.
    int64_t sizeBytes = -1;
    double quantileNs(double u) const;
    double meanNs() const;
    void add(const Dist& other);  // pools other into this (merged histograms)
  };

  // The class a call of `bytes` draws from: its size class, except that a size just under a power of two (within
  // 1e-3: nccl-tests and frameworks round a count down to whole elements per rank) draws from that power of two's
  // class, as the profile builder snaps such a table row (delaycomm/sources/read.py, row_class_bytes).
  static int drawClassOf(int64_t bytes);
  static int64_t snappedBytes(int64_t bytes);  // the size drawClassOf reads: a power of two where it snaps
  // Where a size of >= 1 byte lies on the within-class draw's axis: log2 of its snapped size (a rounded size and its
  // power of two draw alike, as a rounded table row and its power of two are one row).
  static double sizePosition(int64_t bytes);

  double quantile(double u, int op, int64_t bytes) const;  // seconds
  // The kind an op draws with when the profile lacks it: 0 reductions (all-reduce, reduce, reduce-scatter), 1
  // gathers (all-gather, gather, all-to-all), 2 broadcasts (broadcast, scatter), 3 point-to-point, 4 the rest.
  static constexpr int kFamilies = 5;
  static int familyOf(int op);
  // For an op the profile lacks, what its calls draw from ("" when the profile has the op).
  std::string fallbackOf(int op) const;
  // For an op the profile has, whether a call of `bytes` draws from the op's kind instead: its size lies beyond
  // the op's classes, more than one size class from the nearest, and the profile's ops of the same kind (pooled)
  // have a class strictly nearer (a 1 MiB all-reduce of a profile whose all-reduces are a 4 B metric and whose
  // reduce-scatters are 512 KiB draws the reduce-scatters'). What such calls draw from ("" when they do not).
  bool drawsFromKind(int op, int64_t bytes) const;
  std::string kindFallbackOf(int op, int64_t bytes) const;
  double mean() const;  // seconds, of every call pooled
  uint64_t digest() const { return digest_; }
  uint64_t calls() const { return all_.count; }
  int ops() const;
  int classes() const;
  // Every (op, size class), in OpKind order, then by size.
  std::vector<ProfileClassInfo> classInfo() const;

  // The profile of `classes` (each (op, size class) once), checked by Python's schema check already: a class
  // that breaks an invariant the draws rely on is std::invalid_argument ("delaycomm: DelayProfile: ..."), never a
  // user's message.
  static std::shared_ptr<const DelayProfile> fromClasses(const std::vector<ProfileClass>& classes);

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
    // The draw by size (bySize: some usable class of >= 1 bytes has a size). Each usable class of >= 1 bytes, by
    // size, is a point (a class with a size: lo2 = hi2 = log2 of it) or a plateau (a class without: its draw
    // range, [lo2, hi2] in log2 bytes) of the log2-size axis; class 0 draws only for 0 bytes.
    struct Point {
      int index = -1;  // into classes
      double lo2 = 0.0;
      double hi2 = 0.0;
      bool sized = false;
    };
    bool bySize = false;
    std::vector<Point> points;
    int zeroIndex = -1;    // class 0, when usable
    double floor2 = 0.0;   // log2 of the bottom of the first point's class: extrapolation stops there
    double ceil2 = 0.0;    // log2 of the top of the last point's class
    double slopeLo = 0.0;  // d ln(latency) / d ln(size) below the first point, in [0, 1]
    double slopeHi = 0.0;  // above the last point, in [0, 1]
    void finish();
    void finishBySize(const std::vector<int>& usable);
    double quantileNs(double u, int64_t bytes) const;
    double quantileBySizeNs(double u, int64_t bytes) const;
    bool covers(int c) const;  // c is one of the classes the draws use, or between two of them
    int nearest(int c) const;  // size classes from c to the nearest class the draws use
  };

  std::string kindNames(int op) const;  // the profile's other ops of op's kind, by name
  std::array<OpDists, kNumOpKinds> ops_{};
  std::array<bool, kNumOpKinds> present_{};
  OpDists pooledOps_;  // every op pooled per size class (the fallback of an op whose kind the profile lacks)
  std::array<OpDists, kFamilies> families_{};  // the ops of each kind pooled per size class
  std::array<bool, kFamilies> familyPresent_{};
  std::array<std::array<bool, kSizeClasses>, kNumOpKinds> byKind_{};  // drawsFromKind per (op, size class)
  Dist all_;
  uint64_t digest_ = 0;
};

}  // namespace delaycomm
