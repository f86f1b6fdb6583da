#pragma once

// The bound on every wait that delaycomm adds, and the one error it ends in.
//
// Every wait that delaycomm adds to a call (an op held back by the issuer thread, the host delay, the compute
// slowdown, the staleness gate) is bounded by the group's timeout. A wait that would outlast it ends, on the waiting
// rank, in a c10::DistBackendError (Python: torch.distributed.DistBackendError, the error torch raises when a
// collective times out) that reads, in one wording for every wait:
//
//   delaycomm: <op> (sequence number <seq>): <method> timed out after <limit> ms (<whose timeout>): <cause>;
//   a delay longer than the timeout is a timeout
//
// Header-only; used by the backend (csrc/backend) and free for every other waiting component.

#include <chrono>
#include <cstdint>
#include <exception>
#include <limits>
#include <string>
#include <string_view>

#include <c10/util/Exception.h>

namespace delaycomm {

// t + ns, saturating at the clock's largest time point (a delay of 1e300 ms is "never", not an overflow into the
// past). ns < 0 counts as 0.
template <typename Clock>
typename Clock::time_point addSaturated(typename Clock::time_point t, int64_t ns) {
  using Tp = typename Clock::time_point;
  using Dur = typename Clock::duration;
  if (ns <= 0) {
    return t;
  }
  const auto d = std::chrono::duration_cast<Dur>(std::chrono::nanoseconds(ns));
  if (t.time_since_epoch() > Tp::max().time_since_epoch() - d) {
    return Tp::max();
  }
  return t + d;
}

template <typename Clock>
typename Clock::time_point addSaturated(typename Clock::time_point t, std::chrono::milliseconds d) {
  const int64_t ms = d.count();
  constexpr int64_t kMaxMs = std::numeric_limits<int64_t>::max() / 1000000;
  return addSaturated<Clock>(t, ms >= kMaxMs ? std::numeric_limits<int64_t>::max() : ms * 1000000);
}

// The message above. `groupTimeout`: the limit is the group's timeout (else a timeout the caller passed to wait()).
inline std::string delayTimeoutMessage(std::string_view op, uint64_t seq, std::string_view method,
                                       std::chrono::milliseconds limit, bool groupTimeout, std::string_view cause) {
  return c10::str("delaycomm: ", op, " (sequence number ", seq, "): ", method, " timed out after ", limit.count(),
                  " ms (", groupTimeout ? "the group's timeout" : "the wait timeout", "): ", cause,
                  "; a delay longer than the timeout is a timeout");
}

inline std::exception_ptr delayTimeoutError(std::string_view op, uint64_t seq, std::string_view method,
                                            std::chrono::milliseconds limit, bool groupTimeout,
                                            std::string_view cause) {
  return std::make_exception_ptr(
      c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                            delayTimeoutMessage(op, seq, method, limit, groupTimeout, cause)));
}

[[noreturn]] inline void throwDelayTimeout(std::string_view op, uint64_t seq, std::string_view method,
                                           std::chrono::milliseconds limit, bool groupTimeout, std::string_view cause) {
  C10_THROW_ERROR(DistBackendError, delayTimeoutMessage(op, seq, method, limit, groupTimeout, cause));
}

}  // namespace delaycomm
