// The step clock (stale/StepClock.hpp). Design notes: docs/staleness.md, "Calibration".

#include "stale/StepClock.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include <c10/util/Exception.h>

namespace delaycomm {

const char* stepSourceName(StepSource::Kind kind) {
  switch (kind) {
    case StepSource::Kind::kConfigured:
      return "step_ms";
    case StepSource::Kind::kCalibrated:
      return "calibrated";
    case StepSource::Kind::kCalibrating:
      break;
  }
  return "calibrating";
}

namespace {

// The advice every calibration error ends with.
constexpr const char* kCalibrationAdvice =
    "Make the same gradient reductions on every rank, or set step_ms (DELAYCOMM_STEP_MS)";

}  // namespace

StepClock::StepClock(int rank, const StalenessOptions& options, StoreAgreement* agreement)
    : rank_(rank), options_(options), agreement_(agreement) {
  TORCH_INTERNAL_ASSERT(options_.calibrationSteps >= 1, "delaycomm: StepClock: calibrationSteps must be >= 1");
  if (options_.stepMs > 0.0) {
    stepNs_ = std::max<int64_t>(1, static_cast<int64_t>(std::llround(options_.stepMs * 1e6)));
    source_.kind = StepSource::Kind::kConfigured;
    source_.stepNs = stepNs_;
  }
}

std::optional<StepClock::Proposal> StepClock::observe(KeyTable::CallTimes& times, uint64_t key, uint64_t call) {
  if (stepNs_ > 0 || agreeing_) {
    return std::nullopt;
  }
  const auto now = std::chrono::steady_clock::now();
  if (times.last != std::chrono::steady_clock::time_point{} &&
      static_cast<int64_t>(times.intervals.size()) < options_.calibrationSteps) {
    times.intervals.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(now - times.last).count());
  }
  times.last = now;
  if (static_cast<int64_t>(times.intervals.size()) < options_.calibrationSteps) {
    return std::nullopt;
  }
  agreeing_ = true;
  auto v = times.intervals;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return Proposal{key, "", call, std::max<int64_t>(1, v[v.size() / 2]), static_cast<int64_t>(v.size()), attempts_++};
}

int64_t StepClock::agree(const Proposal& p) const {
  // One round per attempt: after a failed agreement (raised on every rank) a caller that goes on tries again at a
  // later call, and must not read the failed attempt's records.
  const std::string round = "calibration/" + std::to_string(p.attempt);
  std::ostringstream mine;
  mine << p.call << ' ' << p.key << ' ' << p.medianNs;
  const std::string where = c10::str("delaycomm: staleness on group '", options_.groupName, "': ");
  const auto records = agreement_->exchange(round, mine.str(), where, "waited to agree on step_ms=auto",
                                            c10::str("calibrated on ", p.keyText, " at all-reduce #", p.call));
  if (!records.agreed()) {
    // The same sealed verdict on every rank (stale/Agreement.hpp), held until every rank that took part read it.
    agreement_->holdStoreUntilRead(round, records);
    const std::string absent = StoreAgreement::absentText(records, "reach the point of calibration");
    if (!records.missing.empty()) {
      C10_THROW_ERROR(DistBackendError, c10::str(where, "agreeing on step_ms=auto timed out: ", absent,
                                                 ": the ranks' all-reduce sequences differ (or those ranks are "
                                                 "stuck). ",
                                                 kCalibrationAdvice));
    }
    C10_THROW_ERROR(DistBackendError, c10::str(where, "agreeing on step_ms=auto failed: ", absent,
                                               ". Nothing was calibrated; the group cannot go on without it"));
  }
  bool same = true;
  int64_t stepOfRank0 = 0;
  std::ostringstream proposals;
  for (size_t r = 0; r < records.byRank.size(); ++r) {
    std::istringstream in(records.byRank[r]);
    uint64_t call = 0;
    uint64_t key = 0;
    int64_t median = 0;
    in >> call >> key >> median;
    same = same && call == p.call && key == p.key;
    stepOfRank0 = r == 0 ? median : stepOfRank0;
    proposals << (r ? "; " : "") << "rank " << r << ": all-reduce #" << call << ", key " << key;
  }
  if (same) {
    return stepOfRank0;
  }
  agreement_->holdStoreUntilRead(round, records);
  C10_THROW_ERROR(Error, c10::str(where, "the ranks calibrated step_ms=auto on different streams (", proposals.str(),
                                  "): their sequences of gradient reductions differ (the ranks run different "
                                  "programs, or make different stale_allreduce calls), so they would disagree on "
                                  "who is late. ",
                                  kCalibrationAdvice));
}

void StepClock::settle(const Proposal& p, int64_t stepNs) {
  agreeing_ = false;
  stepNs_ = stepNs;
  source_ = StepSource{StepSource::Kind::kCalibrated, stepNs, p.keyText, p.intervals, p.call};
}

std::optional<std::string> StepClock::notEngagedWarning(uint64_t calls, const KeyTable& keys) const {
  if (stepNs_ > 0 || static_cast<int64_t>(calls) < options_.calibrationWarnCalls) {
    return std::nullopt;
  }
  size_t most = 0;
  for (const auto& [key, stream] : keys.streams()) {
    most = std::max(most, stream.times.calls());
  }
  std::ostringstream msg;
  msg << "delaycomm: staleness on group '" << options_.groupName << "' has not engaged after " << calls
      << " all-reduces: step_ms=auto is measured on the first stream (key) called " << options_.calibrationSteps + 1
      << " times, and no stream was (of the " << keys.size() << " keys tracked, the most called was called " << most
      << " times), so every all-reduce ran fresh. Only the gradient reductions of a recognised owner (DDP's buckets, "
         "FSDP's parameter groups) and explicit keys (delaycomm.stale_allreduce(tensor, key=...)) are streams; the "
         "one-time 'kept fresh' warnings and kept_fresh_calls say why the others are not. Set step_ms "
         "(DELAYCOMM_STEP_MS) so that no calibration is needed. See docs/staleness.md";
  return msg.str();
}

}  // namespace delaycomm
