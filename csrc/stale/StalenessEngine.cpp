// The staleness engine (stale/StalenessEngine.hpp): one step as a sequence of its parts, and flush. Design notes:
// docs/staleness.md.

#include "stale/StalenessEngine.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "delay/Units.hpp"
#include "kernels/Blend.hpp"
#include "stale/Owners.hpp"
#include "stale/Weights.hpp"

namespace delaycomm {

StalenessEngine::StalenessEngine(int rank, int size, StalenessOptions options, const DelaySchedule* schedule,
                                 c10::intrusive_ptr<c10d::Store> store, std::shared_ptr<GroupStats> stats)
    : rank_(rank),
      size_(size),
      options_(std::move(options)),
      schedule_(schedule),
      stats_(std::move(stats)),
      waits_(rank, size, store, options_.groupName, options_.timeout),
      agreement_(rank, size, std::move(store), &waits_),
      keys_(size, options_.maxKeys),
      clock_(rank, options_, &agreement_) {
  // Validated once, by delaycomm._config (docs/config.md); what the engine relies on:
  TORCH_INTERNAL_ASSERT(options_.mode == StalenessMode::kSsp || options_.mode == StalenessMode::kAsp,
                        "delaycomm: StalenessEngine: staleness must be ssp or asp");
  TORCH_INTERNAL_ASSERT(options_.mode == StalenessMode::kAsp || options_.bound >= 1,
                        "delaycomm: StalenessEngine: ssp needs a bound >= 1, got ", options_.bound);
  TORCH_INTERNAL_ASSERT(options_.timeout.count() > 0, "delaycomm: StalenessEngine: the timeout must be > 0 ms");
  if (options_.updateStats) {
    stats_->enableUpdateStats();  // stats/UpdateStats.hpp
  }
}

StalenessEngine::~StalenessEngine() {
  waits_.close();
}

StalenessEngine::Admission StalenessEngine::admit(const std::string& name, const at::Tensor& t, bool scatter,
                                                  int64_t consumer, bool shadow) {
  std::lock_guard<std::mutex> lock(mutex_);
  Admission a;
  a.key = keys_.scopedKey(name, t, scatter);
  KeyTable::Stream& stream = *keys_.find(a.key);
  stream.consumer = consumer;
  KeyTable::Watch& w = stream.watch;
  if (w.fresh) {
    return a;
  }
  owners::countReduction();
  // The runtime check: every parameter's gradient of the last reduction was consumed by a step or thrown away
  // (a skipped step, .grad None, zero_grad with no step) before this one; else kept fresh from now on.
  std::string why;
  if (w.calls > 0 && !shadow) {
    const auto fates = owners::fates(a.key);
    if (!fates || std::any_of(fates->begin(), fates->end(), [](owners::Fate f) { return f == owners::Fate::kOpen; })) {
      why = "it was reduced again before an optimizer step consumed (or a skipped step threw away) its last result";
    } else if (!resolveLocked(stream, *fates)) {
      why =
          "an optimizer step consumed the gradients of some of its parameters and not of others, and the layout of "
          "its tensor is not known";
    }
  }
  if (!why.empty()) {
    w.fresh = true;
    stream.open = KeyTable::Open{};  // what landed on it stays in .grad with the gradients being accumulated
    stream.produced = at::Tensor();  // the check leaves a stream kept fresh out
    std::ostringstream detail;
    detail << keys_.describe(a.key) << ", at its reduction #" << w.calls << ": " << why << "; ";
    if (w.deferred == 0) {
      detail << "none of its contributions had gone stale";
    } else {
      detail << w.deferred << " of its contributions had gone stale before: those that landed on, or came from, a "
             << "reduction whose gradient was used differently were applied as gradients of the wrong step (the "
             << "ones still pending are delivered by flush)";
    }
    a.detail = detail.str();
    return a;
  }
  if (w.calls > 0) {
    ++w.passes;
  }
  ++w.calls;
  w.stepAt = owners::stepCount();
  if (!shadow) {
    owners::openReduction(consumer, a.key);
  }
  a.admitted = true;
  a.mayDefer = static_cast<int64_t>(w.passes) >= options_.probationCalls;
  return a;
}

namespace {

void zeroRanges(const at::Tensor& t, const owners::Ranges& ranges) {
  at::Tensor flat = t.view({-1});
  for (const auto& [offset, n] : ranges) {
    flat.narrow(0, offset, n).zero_();
  }
}

}  // namespace

// The rule (docs/staleness.md, "The rule"): a contribution is applied iff its own step's gradient is applied. The
// stream's last reduction was resolved by optimizer events (fates, one per parameter, none open): where its step was
// skipped, what landed on it is carried to the next reduction and what it deferred is discarded. Every rank
// resolves alike (the events are the program's: GradScaler's found_inf is the same on every rank). Returns false
// when the step was skipped for some parameters only and their layout is not known.
bool StalenessEngine::resolveLocked(KeyTable::Stream& stream, const std::vector<owners::Fate>& fates) {
  KeyTable::Open& o = stream.open;
  if (!o.active) {
    return true;
  }
  const auto taken = std::count(fates.begin(), fates.end(), owners::Fate::kTaken);
  const bool allTaken = taken == static_cast<int64_t>(fates.size());
  const bool allSkipped = taken == 0;
  owners::Ranges takenRanges;
  owners::Ranges skippedRanges;
  if (!allTaken && !allSkipped) {
    const auto ranges = owners::rangesOf(stream.consumer);
    if (ranges.size() != fates.size()) {
      return false;
    }
    for (size_t i = 0; i < fates.size(); ++i) {
      auto& into = fates[i] == owners::Fate::kTaken ? takenRanges : skippedRanges;
      into.insert(into.end(), ranges[i].begin(), ranges[i].end());
    }
  }
  if (!allTaken) {
    for (auto& term : o.landed) {
      zeroRanges(term.tensor, takenRanges);
      // A contribution that is not finite can never be applied (GradScaler skips every step holding it).
      if (!at::isfinite(term.tensor).all().item<bool>()) {
        stats_->staleness().dropped.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      stream.carry.push_back(std::move(term));
    }
    stream.carryPending = stream.carryPending || o.hadArrivals;
    discardDeferredLocked(stream, o.step, allSkipped, skippedRanges);
  }
  if (o.fresh.defined() && !allSkipped) {
    zeroRanges(o.fresh, skippedRanges);
    stream.produced = stream.produced.defined() ? stream.produced.add_(o.fresh) : o.fresh;
  }
  o = KeyTable::Open{};
  return true;
}

// What a skipped step deferred is discarded with it: on every rank the bookkeeping of its late contributions (all
// of its parameters skipped), and this rank's stash; of some parameters only, their elements of this rank's stash.
void StalenessEngine::discardDeferredLocked(KeyTable::Stream& stream, uint64_t origin, bool all,
                                            const owners::Ranges& skipped) {
  for (auto it = stream.mine.begin(); it != stream.mine.end();) {
    if (it->origin != origin) {
      ++it;
    } else if (all) {
      it = stream.mine.erase(it);
    } else {
      zeroRanges(it->tensor, skipped);
      ++it;
    }
  }
  if (!all) {
    return;
  }
  const bool keep = options_.policy != StalePolicy::kDrop;
  for (auto it = stream.arrivals.begin(); it != stream.arrivals.end();) {
    auto& list = it->second;
    for (auto a = list.begin(); a != list.end();) {
      if (it->first - static_cast<uint64_t>(a->staleness) == origin) {
        stream.pendingOf[static_cast<size_t>(a->rank)] -= keep ? 1 : 0;
        stats_->staleness().dropped.fetch_add(1, std::memory_order_relaxed);
        a = list.erase(a);
      } else {
        ++a;
      }
    }
    it = list.empty() ? stream.arrivals.erase(it) : std::next(it);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// One step: plan, check, update, weights, blend, record (docs/staleness.md, "The parts")

StalenessEngine::StepInfo StalenessEngine::prepareScaled(at::Tensor& t, uint64_t key, double resultScale, bool scatter,
                                                         bool mayDefer) {
  TORCH_INTERNAL_ASSERT(std::isfinite(resultScale), "delaycomm: stale reduction: the result scale must be finite");
  Warnings warnings;
  std::unique_lock<std::mutex> lock(mutex_);
  ++calls_;
  const int64_t stepNs = stepTimeLocked(lock, key, t, warnings);
  KeyTable::Stream& stream = keys_.touch(key, t);  // found again: the lock may have been released above
  const uint64_t step = stream.step;

  // A stream on probation plans as before step_ms is known: nothing defers, the delay is paid as under bsp.
  const StepPlan plan = planStep(schedule_, key, step, mayDefer ? stepNs : 0, options_.mode, options_.bound, size_);
  checkStepLocked(stream, t, key, plan, lock, warnings);
  const std::vector<KeyTable::Arrival> arriving = advanceLocked(stream, t, plan, resultScale, scatter);
  digest_.add(key, t.numel(), t.scalar_type(), scatter);

  // Recognised streams: each contribution is unscaled by the loss scale it was computed at (GradScaler), so the
  // weight of one computed at scale s landing now, at scale sNow, is w * sNow / s (docs/staleness.md, "The rule").
  const bool tracked = stream.consumer >= 0;
  const double sNow = tracked ? owners::lossScale() : 1.0;
  std::vector<KeyTable::Deferred> dueNow;  // this rank's own contributions due now (under asp not in deferral order)
  for (auto it = stream.mine.begin(); it != stream.mine.end();) {
    if (it->due == step) {
      dueNow.push_back(std::move(*it));
      it = stream.mine.erase(it);
    } else {
      ++it;
    }
  }
  const auto me = static_cast<size_t>(rank_);
  const bool fresh = plan.lateness[me] == 0;
  const BlendWeights w = stepWeights(options_.policy, options_.alpha, size_, plan.nFresh,
                                     static_cast<int64_t>(arriving.size()), fresh, resultScale);
  KeyTable::Open open;
  open.active = tracked;
  open.step = step;
  open.hadArrivals = !arriving.empty() || stream.carryPending;
  std::vector<at::Tensor> due;
  std::vector<double> dueScales;
  for (auto& d : dueNow) {
    due.push_back(d.tensor);
    dueScales.push_back(w.stale * sNow / d.scale);
    open.landed.push_back(KeyTable::Term{std::move(d.tensor), w.stale, d.scale});
  }
  // What landed on a skipped step, with the weight it landed with.
  for (auto& c : stream.carry) {
    due.push_back(c.tensor);
    dueScales.push_back(c.weight * sNow / c.scale);
    open.landed.push_back(std::move(c));
  }
  stream.carry.clear();
  stream.carryPending = false;
  if (tracked && options_.check) {
    open.fresh = t.to(at::kDouble, /*non_blocking=*/false, /*copy=*/true).mul_(resultScale / sNow);
  }

  std::optional<at::Tensor> stash;
  if (!fresh && options_.policy != StalePolicy::kDrop) {
    stash = at::empty_like(t, at::MemoryFormat::Contiguous);
    stream.mine.push_back(KeyTable::Deferred{step + static_cast<uint64_t>(plan.lateness[me]), step, *stash, sNow});
  }
  UpdateStats* const updates = stats_->updateStats();  // update_stats=1 only: the fresh gradient, unblended
  const at::Tensor unblended = updates != nullptr ? t.clone() : at::Tensor();
  kernels::fusedBlend(t, w.fresh, due, dueScales, stash);
  if (updates != nullptr) {
    updates->record(unblended, resultScale, t);
  }
  // Under GradScaler, an overflow in a deferred contribution makes its own step's result not finite, as under bsp:
  // every rank then skips that step and the contribution is discarded with it, instead of landing later.
  if (stash && tracked && owners::scalerSeen() && t.numel() > 0 && !at::isfinite(*stash).all().item<bool>()) {
    t.view({-1}).narrow(0, 0, 1).fill_(std::numeric_limits<double>::quiet_NaN());
  }
  if (tracked) {
    stream.open = std::move(open);
  }

  recordLocked(plan.nFresh, arriving, warnings);
  StepInfo info;
  info.key = key;
  info.step = step;
  info.nFresh = plan.nFresh;
  info.nStale = static_cast<int64_t>(arriving.size());
  info.mineFresh = fresh;
  info.mineDue = static_cast<int64_t>(due.size());
  info.freshScale = w.fresh;
  info.blockedNs = plan.gateWaitNs[me];
  info.deferrable = plan.deferrable;
  info.delayNs = plan.delayNs[me];
  info.mineLateness = plan.lateness[me];  // profiler spans (stats/Trace.hpp)
  for (const auto& a : arriving) {
    info.landedMaxSteps = std::max(info.landedMaxSteps, a.staleness);
  }
  const std::string keyText = info.blockedNs > 0 ? keys_.describe(key) : std::string();
  const char* op = keys_.opText(key);
  lock.unlock();
  emit(warnings);
  if (info.blockedNs > 0) {
    waitAtGate(key, step, info.blockedNs, op, keyText);
  }
  return info;
}

// The step time, calibrating it on the way (the key is touched first: it is a call of its stream).
int64_t StalenessEngine::stepTimeLocked(std::unique_lock<std::mutex>& lock, uint64_t key, const at::Tensor& t,
                                        Warnings& warnings) {
  KeyTable::Stream& stream = keys_.touch(key, t);
  keys_.evict();
  if (clock_.stepNs() > 0) {
    return clock_.stepNs();
  }
  auto proposal = clock_.observe(stream.times, key, calls_);
  if (!proposal) {
    if (!warnedUnengaged_) {
      if (auto warning = clock_.notEngagedWarning(calls_, keys_)) {
        warnedUnengaged_ = true;
        warnings.push_back(std::move(*warning));
      }
    }
    return 0;
  }
  proposal->keyText = keys_.describe(key);
  lock.unlock();
  emit(warnings);
  int64_t agreed = 0;
  try {
    agreed = clock_.agree(*proposal);
  } catch (...) {
    lock.lock();
    clock_.abandon();
    throw;
  }
  lock.lock();
  clock_.settle(*proposal, agreed);
  return agreed;
}

// Each check raises on every rank alike (all compute it from the shared schedule), before the step changes anything.
void StalenessEngine::checkStepLocked(const KeyTable::Stream& stream, const at::Tensor& t, uint64_t key,
                                      const StepPlan& plan, std::unique_lock<std::mutex>& lock, Warnings& warnings) {
  if (options_.policy != StalePolicy::kDrop && !stream.arrivals.empty()) {
    TORCH_CHECK_VALUE(t.numel() == stream.numel && t.scalar_type() == stream.prototype.scalar_type(),
                      "delaycomm: stale ", keys_.opText(key), ": ", keys_.describe(key), " changed from ", stream.numel,
                      " x ", stream.prototype.scalar_type(), " to ", t.numel(), " x ", t.scalar_type(),
                      " while contributions were in flight; give each stream of delaycomm.stale_allreduce its own key");
  }
  const auto timeout = waits_.timeout();
  const auto timeoutNs = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
  if (const int late = plan.gateTimeoutRank(timeoutNs); late >= 0) {
    // Every rank waits out the timeout (the late rank at the gate, the others as they would in the collective)
    // and raises the same error; no rank issues the reduction, so the inner group stays in step. A member found
    // gone early ends the wait at once (its process ended: nothing is left to wait for); one found gone in the last
    // stretch reached the same timeout first (the ranks enter the gate within a skew of each other), so the
    // verdict stays the timeout on every rank. A close() ends it at any point.
    const std::string keyText = keys_.describe(key);
    const char* op = keys_.opText(key);
    const uint64_t step = stream.step;
    lock.unlock();
    emit(warnings);
    const auto deadline = SteadyClock::now() + timeout;
    const auto skew = std::min<std::chrono::milliseconds>(
        timeout / 2, std::max<std::chrono::milliseconds>(std::chrono::seconds(2), timeout / 5));
    sleepAtGate(deadline - skew, op, step, keyText);
    sleepAtGate(deadline, op, step, keyText, /*endWhenGone=*/false);
    lock.lock();
    throwGateTimeout(key, step, late, plan, clock_.stepNs(), timeout);
  }
  if (options_.mode != StalenessMode::kAsp || options_.policy == StalePolicy::kDrop) {
    return;
  }
  // asp: a late contribution beyond max_pending in flight for its rank.
  std::vector<int64_t> dueNow(static_cast<size_t>(size_), 0);
  if (auto it = stream.arrivals.find(stream.step); it != stream.arrivals.end()) {
    for (const auto& arrival : it->second) {
      ++dueNow[static_cast<size_t>(arrival.rank)];
    }
  }
  for (size_t r = 0; r < dueNow.size(); ++r) {
    const int64_t inFlight = stream.pendingOf[r] - dueNow[r];
    TORCH_CHECK(plan.lateness[r] == 0 || inFlight < options_.maxPending, "delaycomm: stale ", keys_.opText(key),
                " on group '", options_.groupName, "': at step ", stream.step, " of ", keys_.describe(key), ", rank ",
                r, "'s contribution is late again while it already has ", inFlight,
                " in flight: staleness=asp holds at most max_pending=", options_.maxPending,
                " per rank and key. Raise max_pending (DELAYCOMM_MAX_PENDING), lower the delay or delay_fraction, "
                "or bound staleness with staleness=ssp:S. Every rank raises this error at this step; nothing of "
                "the step was applied");
  }
}

std::vector<KeyTable::Arrival> StalenessEngine::advanceLocked(KeyTable::Stream& stream, const at::Tensor& t,
                                                              const StepPlan& plan, double resultScale, bool scatter) {
  const uint64_t step = stream.step;
  const bool keep = options_.policy != StalePolicy::kDrop;
  stream.step++;
  stream.seen++;
  stream.resultScale = resultScale;
  stream.scatter = scatter;
  stream.numel = t.numel();
  if (stream.prototype.scalar_type() != t.scalar_type() || stream.prototype.device() != t.device()) {
    stream.prototype = at::empty({0}, t.options());
  }
  for (size_t r = 0; r < plan.lateness.size(); ++r) {
    const int64_t k = plan.lateness[r];
    if (k > 0) {
      stream.arrivals[step + static_cast<uint64_t>(k)].push_back(KeyTable::Arrival{static_cast<int>(r), k});
      stream.pendingOf[r] += keep ? 1 : 0;
      ++stream.watch.deferred;
    }
  }
  std::vector<KeyTable::Arrival> arriving;
  if (auto it = stream.arrivals.find(step); it != stream.arrivals.end()) {
    arriving = std::move(it->second);
    stream.arrivals.erase(it);
  }
  for (const auto& arrival : arriving) {
    stream.pendingOf[static_cast<size_t>(arrival.rank)] -= keep ? 1 : 0;
  }
  return arriving;
}

void StalenessEngine::recordLocked(int64_t nFresh, const std::vector<KeyTable::Arrival>& arriving, Warnings& warnings) {
  const auto nStale = static_cast<int64_t>(arriving.size());
  auto& counters = stats_->staleness();
  counters.steps.fetch_add(1, std::memory_order_relaxed);
  counters.fresh.fetch_add(static_cast<uint64_t>(nFresh), std::memory_order_relaxed);
  const bool drop = options_.policy == StalePolicy::kDrop;
  if (drop) {
    counters.dropped.fetch_add(static_cast<uint64_t>(nStale), std::memory_order_relaxed);
  } else {
    counters.stale.fetch_add(static_cast<uint64_t>(nStale), std::memory_order_relaxed);
    for (const auto& arrival : arriving) {
      counters.stalenessSteps.record(static_cast<double>(arrival.staleness));
    }
  }
  window_.emplace_back(nFresh, drop ? 0 : nStale);
  windowFresh_ += nFresh;
  windowStale_ += drop ? 0 : nStale;
  while (static_cast<int64_t>(window_.size()) > options_.window) {
    windowFresh_ -= window_.front().first;
    windowStale_ -= window_.front().second;
    window_.pop_front();
  }
  if (!warnedRatio_ && static_cast<int64_t>(window_.size()) >= std::min<int64_t>(options_.window, 20) &&
      windowedRatioLocked() > options_.warnRatio) {
    warnedRatio_ = true;
    std::ostringstream msg;
    msg << "delaycomm: the stale:fresh ratio over the last " << window_.size() << " steps is " << windowedRatioLocked()
        << " (> " << options_.warnRatio << "): stale gradients dominate the updates. Lower delay_fraction "
        << "(DELAYCOMM_DELAY_FRACTION) or the delay, raise step_ms, or bound staleness with a smaller staleness=ssp:S";
    warnings.push_back(msg.str());
  }
}

// SSP gate: the delay beyond S steps is paid in wall clock before this rank joins the step (at most the group's
// timeout: longer waits raised in checkStepLocked), and ends at once when the group is destroyed or aborted.
void StalenessEngine::waitAtGate(uint64_t key, uint64_t step, int64_t waitNs, const char* op,
                                 const std::string& keyText) {
  sleepAtGate(SteadyClock::now() + std::chrono::nanoseconds(waitNs), op, step, keyText);
  stats_->staleness().blockedNs.fetch_add(static_cast<uint64_t>(waitNs), std::memory_order_relaxed);
}

void StalenessEngine::sleepAtGate(SteadyClock::time_point until, const char* op, uint64_t step,
                                  const std::string& keyText, bool endWhenGone) {
  switch (waits_.sleepUntil(until, endWhenGone)) {
    case EngineWaits::Woke::kClosed:
      throwClosed(op, step, keyText);
    case EngineWaits::Woke::kGone:
      throwGone(op, step, keyText);
    default:
      break;
  }
}

void StalenessEngine::emit(Warnings& warnings) const {
  if (onWarn) {
    for (const auto& w : warnings) {
      onWarn(w);
    }
  }
  warnings.clear();
}

void StalenessEngine::throwGateTimeout(uint64_t key, uint64_t step, int late, const StepPlan& plan, int64_t stepNs,
                                       std::chrono::milliseconds timeout) const {
  const auto i = static_cast<size_t>(late);
  // The wording follows the timeout of an op held back on the network path (delay/DeferredWork.cpp).
  C10_THROW_ERROR(
      DistBackendError,
      c10::str("delaycomm: ", keys_.opText(key), " (step ", step, " of ", keys_.describe(key), ", group '",
               options_.groupName, "'): the ssp:", options_.bound, " gate timed out after ", timeout.count(),
               " ms (the group's timeout): rank ", late, "'s contribution is held back by an injected delay of ",
               msText(plan.delayNs[i]), " ms, of which ", options_.bound, " step(s) of staleness (step ",
               msText(stepNs), " ms) cover ", msText(options_.bound * stepNs), " ms and ", msText(plan.gateWaitNs[i]),
               " ms are paid as waiting; a delay longer than the timeout is a timeout"));
}

void StalenessEngine::throwClosed(const char* op, uint64_t step, const std::string& keyText) const {
  // The wording follows a host delay woken by the group's shutdown (delay/DelayInjector.cpp).
  C10_THROW_ERROR(DistBackendError,
                  c10::str("delaycomm: ", op, " (step ", step, " of ", keyText, ", group '", options_.groupName,
                           "'): the group was shut down (destroy_process_group or abort) while this call waited at "
                           "the ssp:",
                           options_.bound, " gate; the reduction was not issued"));
}

void StalenessEngine::throwGone(const char* op, uint64_t step, const std::string& keyText) const {
  const std::vector<int> gone = waits_.gone();
  C10_THROW_ERROR(DistBackendError,
                  c10::str("delaycomm: ", op, " (step ", step, " of ", keyText, ", group '", options_.groupName,
                           "'): rank(s) ", rankList(gone),
                           " left the group (its process ended, or it destroyed or aborted the group: its "
                           "peer-watch connection closed) while this call waited at the ssp:",
                           options_.bound, " gate; the reduction was not issued"));
}

double StalenessEngine::windowedRatio() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return windowedRatioLocked();
}

double StalenessEngine::windowedRatioLocked() const {
  if (windowFresh_ == 0) {
    return windowStale_ > 0 ? INFINITY : 0.0;
  }
  return static_cast<double>(windowStale_) / static_cast<double>(windowFresh_);
}

// ---------------------------------------------------------------------------------------------------------------
// flush (docs/staleness.md, "flush" and "Divergence")

std::vector<StalenessEngine::FlushStream> StalenessEngine::takeFlush() {
  FlushRecord mine;
  std::string round;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    round = "flush/" + std::to_string(flushes_++);
    mine.calls = digest_.calls();
    mine.digest = digest_.value();
    mine.checkpoints = digest_.checkpoints();
    for (auto& [key, stream] : keys_.streams()) {
      resolveAtFlushLocked(key, stream);
      if (stream.arrivals.empty() && !stream.carryPending) {
        continue;  // nothing in flight anywhere (this rank's own deferred ones are in flight too)
      }
      mine.pending.push_back(
          {key, stream.numel, stream.prototype.scalar_type(), stream.scatter, stream.pendingGlobal()});
    }
  }
  const std::string where = c10::str("delaycomm: flush on group '", options_.groupName, "': ");
  const auto records = agreement_.exchange(round, mine.encode(), where, "waited in flush for every rank's record",
                                           c10::str("called flush after ", mine.calls, " stale reductions"));
  if (!records.agreed()) {
    agreement_.holdStoreUntilRead(round, records);  // the same sealed verdict on every rank (stale/Agreement.hpp)
    if (!records.missing.empty()) {
      C10_THROW_ERROR(DistBackendError,
                      c10::str(where, "timed out after ", records.timeoutMs, " ms (the group's timeout): rank(s) ",
                               rankList(records.missing), " did not call flush (rank ", records.sealer,
                               " waited). flush is collective: every rank calls it at the same point of its "
                               "program. Nothing was flushed on the ranks that did"));
    }
    C10_THROW_ERROR(DistBackendError, c10::str(where, StoreAgreement::absentText(records, "call flush"),
                                               ". Nothing was flushed on the ranks that did"));
  }
  std::vector<FlushRecord> all;
  for (const auto& text : records.byRank) {
    all.push_back(FlushRecord::decode(text));
  }
  if (const std::string divergence = flushDivergence(all); !divergence.empty()) {
    agreement_.holdStoreUntilRead(round, records);
    C10_THROW_ERROR(
        Error, c10::str(where, "the ranks' stale bookkeeping differs: ", divergence,
                        ". The ranks would disagree on which reductions flush issues, and they disagreed on who was "
                        "late at the steps where their streams differ. Every rank must make the same stale "
                        "reductions in the same order (docs/staleness.md, \"Divergence\"): the ranks ran different "
                        "programs, or made different stale_allreduce calls. Every rank raises this error; nothing "
                        "was flushed"));
  }

  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<FlushStream> out;
  auto& counters = stats_->staleness();
  const double sNow = owners::lossScale();
  for (const auto& agreed : mine.pending) {
    KeyTable::Stream* stream = keys_.find(agreed.key);
    TORCH_INTERNAL_ASSERT(stream != nullptr, "delaycomm: flush: a pending stream left the key table");
    const int64_t global = stream->pendingGlobal();
    stream->arrivals.clear();
    std::fill(stream->pendingOf.begin(), stream->pendingOf.end(), 0);
    stream->carryPending = false;
    if (options_.policy == StalePolicy::kDrop) {
      counters.dropped.fetch_add(static_cast<uint64_t>(global), std::memory_order_relaxed);
      continue;
    }
    // Recognised streams are delivered at the current loss scale (what the next GradScaler.step unscales by).
    const bool tracked = stream->consumer >= 0;
    const double ratio = tracked ? sNow : 1.0;
    const double scale = flushScale(options_.policy, size_, global, stream->resultScale);
    std::vector<at::Tensor> deferred;
    std::vector<double> scales;
    for (auto& d : stream->mine) {
      deferred.push_back(d.tensor.view({-1}));
      scales.push_back(scale * (tracked ? ratio / d.scale : 1.0));
    }
    for (auto& c : stream->carry) {
      deferred.push_back(c.tensor.view({-1}));
      scales.push_back(c.weight * ratio / c.scale);
    }
    stream->mine.clear();
    stream->carry.clear();
    // Flat, whatever this rank's stashes' shapes: every rank returns the same shape for the stream.
    at::Tensor local = at::empty({stream->numel}, stream->prototype.options());
    kernels::fusedBlend(local, 0.0, deferred, scales, std::nullopt);
    counters.stale.fetch_add(static_cast<uint64_t>(global), std::memory_order_relaxed);
    out.push_back(FlushStream{agreed.key, std::move(local), stream->scatter, stream->consumer,
                              agreed.key < kExplicitKeyLimit ? std::string() : stream->scope});
  }
  if (options_.check) {
    out = withReferencesLocked(std::move(out));
  }
  return out;
}

// stale_check: the conservation check's reference (docs/staleness.md, "The check"): every recognised stream still
// staled, merged in key order into flush's streams (the same streams on every rank).
std::vector<StalenessEngine::FlushStream> StalenessEngine::withReferencesLocked(std::vector<FlushStream> out) {
  std::vector<FlushStream> all;
  size_t i = 0;
  for (auto& [key, stream] : keys_.streams()) {
    while (i < out.size() && out[i].key < key) {
      all.push_back(std::move(out[i++]));
    }
    if (!stream.produced.defined() || stream.watch.fresh) {
      continue;
    }
    if (i < out.size() && out[i].key == key) {
      out[i].reference = stream.produced.clone();
      all.push_back(std::move(out[i++]));
    } else {
      all.push_back(
          FlushStream{key, at::Tensor(), stream.scatter, stream.consumer, stream.scope, stream.produced.clone()});
    }
  }
  while (i < out.size()) {
    all.push_back(std::move(out[i++]));
  }
  return all;
}

// At flush, a recognised stream's last reduction is resolved as an optimizer event resolved it; one not resolved
// yet (flush before the step) counts as taken: what landed on it is in .grad.
void StalenessEngine::resolveAtFlushLocked(uint64_t key, KeyTable::Stream& stream) {
  if (!stream.open.active || stream.watch.fresh) {
    return;
  }
  auto fates = owners::fates(key);
  if (fates) {
    for (auto& f : *fates) {
      f = f == owners::Fate::kOpen ? owners::Fate::kTaken : f;
    }
  }
  if (!fates || !resolveLocked(stream, *fates)) {
    std::vector<owners::Fate> taken(1, owners::Fate::kTaken);
    resolveLocked(stream, taken);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Getters

int64_t StalenessEngine::pendingHere() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t n = 0;
  for (const auto& [key, stream] : keys_.streams()) {
    n += static_cast<int64_t>(stream.mine.size());
  }
  return n;
}

int64_t StalenessEngine::pendingGlobal() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t n = 0;
  for (const auto& [key, stream] : keys_.streams()) {
    n += stream.pendingGlobal();
  }
  return n;
}

StepSource StalenessEngine::stepSource() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return clock_.source();
}

int64_t StalenessEngine::keyCount() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(keys_.size());
}

void StalenessEngine::telemetry(StalenessTelemetry& out) const {
  out.staleFreshRatioWindowed = windowedRatio();
  out.pendingHere = pendingHere();
  out.keys = keyCount();
  const StepSource src = stepSource();
  out.stepMs = static_cast<double>(src.stepNs) * 1e-6;
  out.stepSource = stepSourceName(src.kind);
  out.stepKey = src.key;
  out.stepIntervals = src.intervals;
  out.stepCall = src.atCall;
}

std::string StalenessEngine::describeKey(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return keys_.describe(key);
}

}  // namespace delaycomm
