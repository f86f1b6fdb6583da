#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace delaycomm {

// The consistency model of a group (docs/staleness.md): bsp leaves the staleness engine off.
enum class StalenessMode { kBsp, kSsp, kAsp };

// stale_policy=: what a late contribution does (docs/staleness.md, "The model").
enum class StalePolicy { kApply, kDrop, kEma };

// The staleness engine's settings, nested in the backend's (BackendOptions::stale). Typed and already validated:
// Python's delaycomm._config checks the user's values once (its messages name the option, where the value came from
// and what is accepted); the engine only asserts what it relies on.
struct StalenessOptions {
  StalenessMode mode = StalenessMode::kBsp;
  int64_t bound = 0;  // S of ssp:S (>= 1 under ssp)
  StalePolicy policy = StalePolicy::kEma;
  double alpha = 0.1;        // ema weight of the stale contributions, in (0, 1]
  double stepMs = 0.0;       // <= 0: calibrated (step_ms=auto)
  int64_t maxPending = 64;   // asp: contributions in flight per key and rank before an error
  bool updateStats = false;  // update_stats: the opt-in update statistics (stats/UpdateStats.hpp)
  bool check = false;        // stale_check: the conservation check's reference (docs/staleness.md, "The check")

  // Internal knobs (no option: tests and docs/staleness.md name them).
  int64_t calibrationSteps = 5;         // intervals of one key that calibrate step_ms=auto
  int64_t calibrationWarnCalls = 4096;  // warn once when no key has calibrated after this many calls
  int64_t maxKeys = 1024;               // bound of the key table
  int64_t window = 100;                 // steps of the windowed stale:fresh ratio
  int64_t probationCalls = 4;           // runtime checks a recognised stream passes before it may defer
  double warnRatio = 0.4;

  // Set by the backend from its own options: the group's timeout bounds every wait of the engine (the SSP gate,
  // the agreements through the store); the group's name is for messages.
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  std::string groupName;
};

}  // namespace delaycomm
