#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "delay/Distribution.hpp"
#include "ops/OpTable.hpp"

namespace delaycomm {

// delay_where: where a delay is paid (docs/delay.md).
enum class DelayWhere { kNetwork, kHost };
// delay_mode: add (a call's injected delay is the schedule's) or match (docs/delay.md, "Match mode"). kMatchCpu is
// delay_mode=auto under a profile: match on CPU ops; on cuda ops, whose own latency match mode cannot time on the
// host, the whole target is added (warned once per op, counted as uncalibrated), where kMatch raises.
enum class DelayMode { kAdd, kMatch, kMatchCpu };

// The delay injector's settings, nested in the backend's (BackendOptions::delay), as the staleness engine's are
// (stale/StaleOptions.hpp). Typed and already validated: Python's delaycomm._config checks the user's values once
// (its messages name the option, where the value came from and what is accepted) and fills this from its option
// table (each delay option names its field here); the injector only asserts what it relies on.
//
// The fields that Python sets, one row each: (type, name, default, what it is). The row is the field and its
// binding (bindings/Backend.cpp binds every row by its name), so a new option is one row here, one row of
// delaycomm._config.OPTIONS and its use in the injector (docs/core.md, "Options").
#define DELAYCOMM_DELAY_OPTION_FIELDS(X)                                                                          \
  X(double, fraction, 0.0, "per-call probability that a targeted rank's call is delayed, in [0, 1]")              \
  X(std::vector<int64_t>, ranks, {}, "the delayed ranks (group ranks), sorted; empty: all")                       \
  X(std::vector<OpKind>, ops, {}, "the delayed ops (delayable ones, ops/OpTable.hpp); empty: every one")          \
  X(DelayWhere, where, DelayWhere::kNetwork, "host: the caller blocks; network: the op is held back")             \
  X(DelayMode, mode, DelayMode::kAdd, "match: only what the call needs on top of this machine's own latency")     \
  X(double, burst, 0.0, "mean burst length in calls (delay/Schedule.hpp); 0: calls delayed independently")        \
  X(bool, one_carrier, false, "delay_carrier=one: one targeted rank per call, from the schedule, may be late")    \
  X(bool, place_step, false, "delay_place=step: overlapping calls draw at their run's draw (delay/Schedule.hpp)") \
  X(uint64_t, seed, 0, "the schedule's seed (mixed with the members for a group of some ranks)")                  \
  X(double, slowdown, 1.0, "this rank's compute slowdown factor K (>= 1; 1: none)")

struct DelayOptions {
  // The parsed delay spec (delaycomm._C.DelaySpec): the one object every reader of the distribution shares; null
  // for none. The injector never sees the spec's text.
  std::shared_ptr<const DelayDistribution> spec;
#define DELAYCOMM_DELAY_OPTION_MEMBER(type, name, init, doc) type name = init;
  DELAYCOMM_DELAY_OPTION_FIELDS(DELAYCOMM_DELAY_OPTION_MEMBER)
#undef DELAYCOMM_DELAY_OPTION_MEMBER

  // Set by the backend from its own options: the group's size (match mode computes every rank's delay of a call),
  // its timeout (bounds every wait of the injector, until setTimeout()) and its name (the issuer thread's).
  int size = 1;
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  std::string groupName;
};

}  // namespace delaycomm
