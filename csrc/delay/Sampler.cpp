#include "delay/Sampler.hpp"

#include <cstdio>
#include <utility>

namespace delaycomm {

namespace {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A uniform in (0, 1) from 53 random bits: (k + 0.5) / 2^53 is never 0 or 1, so quantiles stay finite.
double toUnit(uint32_t hi, uint32_t lo) {
  const uint64_t k = ((static_cast<uint64_t>(hi) << 32) | lo) >> 11;
  return (static_cast<double>(k) + 0.5) * 0x1.0p-53;
}

}  // namespace

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kPhiloxW0;
      key[1] += kPhiloxW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * ctr[0];
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * ctr[2];
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<uint32_t>(p0)};
  }
  return ctr;
}

std::pair<double, double> counterUniforms(uint64_t seed, uint64_t rank, uint64_t stream, uint64_t seq) {
  const uint64_t k = splitmix64(seed ^ splitmix64(rank + 0x632BE59BD9B4E019ull));
  const auto r = philox4x32({static_cast<uint32_t>(seq), static_cast<uint32_t>(seq >> 32),
                             static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)},
                            {static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32)});
  return {toUnit(r[0], r[1]), toUnit(r[2], r[3])};
}

DelaySampler::DelaySampler(std::shared_ptr<const DelayDistribution> distribution, uint64_t seed, uint64_t rank)
    : distribution_(std::move(distribution)), seed_(seed), rank_(rank) {}

double DelaySampler::sampleFor(uint64_t rank, uint64_t stream, uint64_t seq, CallSize at) const {
  if (distribution_->isNone())
    return 0.0;
  return distribution_->quantile(counterUniforms(seed_, rank, stream, seq).first, at);
}

namespace {

// The percentiles a description reports, with their key names.
constexpr std::pair<double, const char*> kDescribedQuantiles[] = {
    {0.5, "p50_s"}, {0.9, "p90_s"}, {0.99, "p99_s"}, {0.999, "p999_s"}, {0.9999, "p9999_s"}};

}  // namespace

std::string digestText(uint64_t digest) {
  char text[24];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(digest));
  return text;
}

SamplerDescription describeSampler(const DelaySampler& s) {
  const auto& spec = s.spec();
  SamplerDescription d;
  d.spec = spec.text;
  d.family = familyName(spec.family);
  d.parameters = s.parameters();
  d.requested = spec.percentiles;
  if (spec.namesFile()) {
    d.source = familyName(spec.family);
    d.sourcePath = spec.path;
    d.sourceDigest = digestText(s.distribution().digest());
  }
  if (!spec.isNone()) {
    for (const auto& [q, name] : kDescribedQuantiles) {
      d.percentiles.emplace_back(name, s.quantile(q));
    }
  }
  d.mean = s.mean();
  d.seed = s.seed();
  d.rank = s.rank();
  return d;
}

}  // namespace delaycomm
