// FSDP2's gradient-reduction scope, observed through a RecordFunction callback (stale/FsdpScope.hpp).

#include "stale/FsdpScope.hpp"

#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include <ATen/record_function.h>

namespace delaycomm::fsdp_scope {

namespace {

struct ScopeFrame {
  std::string name;
  bool reduceScattered = false;
};

thread_local std::vector<ScopeFrame> tlsScopes;

std::mutex scopeMutex;
int scopeUsers = 0;
at::CallbackHandle scopeHandle = at::INVALID_CALLBACK_HANDLE;

// Marks the RecordFunction whose start pushed a frame, so that its end pops exactly that frame.
struct PushedFrame : at::ObserverContext {};

std::unique_ptr<at::ObserverContext> onScopeStart(const at::RecordFunction& fn) {
  const char* name = fn.name();
  if (name == nullptr || std::strncmp(name, kReduceLabel, std::strlen(kReduceLabel)) != 0) {
    return nullptr;
  }
  tlsScopes.push_back(ScopeFrame{name, false});
  return std::make_unique<PushedFrame>();
}

void onScopeEnd(const at::RecordFunction& /*fn*/, at::ObserverContext* ctx) {
  if (ctx != nullptr && !tlsScopes.empty()) {
    tlsScopes.pop_back();
  }
}

}  // namespace

void acquire() {
  std::lock_guard<std::mutex> lock(scopeMutex);
  if (scopeUsers++ == 0) {
    scopeHandle = at::addGlobalCallback(
        at::RecordFunctionCallback(onScopeStart, onScopeEnd).scopes({at::RecordScope::USER_SCOPE}));
  }
}

void release() {
  std::lock_guard<std::mutex> lock(scopeMutex);
  if (scopeUsers > 0 && --scopeUsers == 0 && scopeHandle != at::INVALID_CALLBACK_HANDLE) {
    at::removeCallback(scopeHandle);
    scopeHandle = at::INVALID_CALLBACK_HANDLE;
  }
}

const std::string* current() {
  return tlsScopes.empty() ? nullptr : &tlsScopes.back().name;
}

void noteReduceScatter() {
  if (!tlsScopes.empty()) {
    tlsScopes.back().reduceScattered = true;
  }
}

bool reduceScattered() {
  return !tlsScopes.empty() && tlsScopes.back().reduceScattered;
}

}  // namespace delaycomm::fsdp_scope
