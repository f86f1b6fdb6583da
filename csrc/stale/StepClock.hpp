#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "stale/Agreement.hpp"
#include "stale/KeyTable.hpp"
#include "stale/StaleOptions.hpp"

namespace delaycomm {

// Where the step time comes from (telemetry: stats()["staleness"]).
struct StepSource {
  enum class Kind { kConfigured, kCalibrated, kCalibrating };
  Kind kind = Kind::kCalibrating;
  int64_t stepNs = 0;     // 0 while calibrating
  std::string key;        // the calibrating key, described (kCalibrated)
  int64_t intervals = 0;  // how many intervals the median was taken over (kCalibrated)
  uint64_t atCall = 0;    // the engine call (1-based) at which the ranks agreed (kCalibrated)
};

// The name telemetry gives a step source ("step_ms", "calibrated", "calibrating"; docs/staleness.md).
const char* stepSourceName(StepSource::Kind kind);

// The step time that turns a delay into steps of staleness (docs/staleness.md, "Calibration").
//
// step_ms when configured; otherwise calibrated once, on the first key that has been called calibrationSteps + 1
// times (which key and which call depend only on the sequence of keys, the same on every rank): the median of that
// key's calibrationSteps intervals between consecutive calls, measured on rank 0 and agreed through the group's
// store (stale/Agreement.hpp): every rank checks that every rank proposes the same key at the same call, and all
// get the same step or the same error. Nothing is deferred until then.
//
// Threads: the engine calls observe(), settle(), abandon() and the getters under its lock; agree() blocks on the
// store and is called without it (at most one agreement is in flight: observe() proposes nothing meanwhile).
class StepClock {
 public:
  struct Proposal {
    uint64_t key;
    std::string keyText;
    uint64_t call;
    int64_t medianNs;
    int64_t intervals;
    int64_t attempt;
  };

  StepClock(int rank, const StalenessOptions& options, StoreAgreement* agreement);

  // The step in ns; 0 while not calibrated.
  int64_t stepNs() const { return stepNs_; }
  StepSource source() const { return source_; }

  // Records call number `call` of `key` (times: its stream's). Returns the proposal to agree on when this call
  // completes the key's calibration intervals; nullopt otherwise (and always once the step is known).
  std::optional<Proposal> observe(KeyTable::CallTimes& times, uint64_t key, uint64_t call);
  // The agreed step of `proposal` (every rank gets the same), or the same error on every rank: DistBackendError
  // when a rank did not propose within the timeout, c10::Error when the ranks proposed different streams.
  int64_t agree(const Proposal& proposal) const;
  // After agree(): adopt its step, or (it raised) allow a later call to propose again.
  void settle(const Proposal& proposal, int64_t stepNs);
  void abandon() { agreeing_ = false; }

  // The one-time warning that no stream recurs enough to calibrate, when due after `calls` engine calls.
  std::optional<std::string> notEngagedWarning(uint64_t calls, const KeyTable& keys) const;

 private:
  const int rank_;
  const StalenessOptions& options_;
  StoreAgreement* agreement_;
  int64_t stepNs_ = 0;     // 0 = not calibrated yet
  bool agreeing_ = false;  // a proposal is being agreed on
  int64_t attempts_ = 0;
  StepSource source_;
};

}  // namespace delaycomm
