// The staleness engine (stale/StalenessEngine.hpp): one step and flush. Keys and step_ms=auto are in
// stale/Streams.cpp. Design notes: docs/staleness.md.

#include "stale/StalenessEngine.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <thread>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "kernels/Blend.hpp"
#include "stale/FsdpScope.hpp"

namespace delaycomm {

namespace {

// ceil(d / step) for d, step > 0, without the overflow of (d + step - 1) / step near INT64_MAX.
int64_t stepsOf(int64_t d, int64_t stepNs) {
  return d / stepNs + (d % stepNs != 0 ? 1 : 0);
}

std::string msText(int64_t ns) {
  std::ostringstream s;
  s.precision(ns >= 1000000000 ? 6 : 3);
  s << static_cast<double>(ns) * 1e-6;
  return s.str();
}

}  // namespace

StalenessEngine::StalenessEngine(int rank, int size, Options options, const DelaySchedule* schedule,
                                 c10::intrusive_ptr<c10d::Store> store, std::shared_ptr<GroupStats> stats)
    : rank_(rank),
      size_(size),
      options_(std::move(options)),
      schedule_(schedule),
      store_(std::move(store)),
      stats_(std::move(stats)) {
  TORCH_CHECK_VALUE(options_.mode == Mode::kAsp || options_.bound >= 1,
                    "delaycomm: StalenessEngine: ssp bound must be >= 1 (ssp:0 is bsp), got ", options_.bound);
  TORCH_CHECK_VALUE(options_.alpha > 0.0 && options_.alpha <= 1.0,
                    "delaycomm: StalenessEngine: ema_alpha must be in (0, 1], got ", options_.alpha);
  TORCH_CHECK_VALUE(options_.maxPending >= 1, "delaycomm: StalenessEngine: max_pending must be >= 1, got ",
                    options_.maxPending);
  TORCH_CHECK_VALUE(options_.calibrationSteps >= 1, "delaycomm: StalenessEngine: calibrationSteps must be >= 1, got ",
                    options_.calibrationSteps);
  TORCH_CHECK_VALUE(options_.maxKeys >= 1, "delaycomm: StalenessEngine: maxKeys must be >= 1, got ", options_.maxKeys);
  TORCH_CHECK_VALUE(options_.timeout.count() > 0, "delaycomm: StalenessEngine: timeout must be > 0 ms, got ",
                    options_.timeout.count());
  TORCH_CHECK_VALUE(std::isfinite(options_.stepMs) && options_.stepMs < 9.2e12,
                    "delaycomm: StalenessEngine: step_ms must be a finite number of milliseconds below 9.2e12 "
                    "(it is held in int64 nanoseconds), got ",
                    options_.stepMs);
  if (options_.stepMs > 0.0) {
    stepNs_ = std::max<int64_t>(1, static_cast<int64_t>(std::llround(options_.stepMs * 1e6)));
    source_.kind = StepSource::Kind::kConfigured;
    source_.stepNs = stepNs_;
  }
  fsdp_scope::acquire();
}

StalenessEngine::~StalenessEngine() {
  fsdp_scope::release();
}

// ---------------------------------------------------------------------------------------------------------------
// One step

StalenessEngine::Plan StalenessEngine::planLocked(uint64_t key, uint64_t step, int64_t stepNs) const {
  Plan plan;
  plan.k.assign(static_cast<size_t>(size_), 0);
  plan.waitNs.assign(static_cast<size_t>(size_), 0);
  plan.delayNs.assign(static_cast<size_t>(size_), 0);
  // No deferral on a key's first step (DDP's bucket rebuild) nor before the step time is known.
  const bool canDefer = step >= 1 && stepNs > 0 && schedule_ != nullptr && schedule_->active();
  plan.deferrable = canDefer;
  for (int r = 0; r < size_; ++r) {
    int64_t k = 0;
    if (canDefer) {
      const int64_t d = schedule_->delayNs(r, DelaySchedule::keyStream(key), step);
      plan.delayNs[static_cast<size_t>(r)] = d;
      if (d > 0) {
        k = stepsOf(d, stepNs);
        if (options_.mode == Mode::kSsp && k > options_.bound) {
          // k > S means d > S * step, so the product does not overflow.
          plan.waitNs[static_cast<size_t>(r)] = d - options_.bound * stepNs;
          k = options_.bound;
        }
      }
    }
    plan.k[static_cast<size_t>(r)] = k;
    if (k == 0) {
      ++plan.nFresh;
    }
  }
  return plan;
}

// asp: a late contribution beyond max_pending in flight for its rank. Computed for every rank from the shared
// schedule, so every rank raises the same error at the same step, before any state changes.
void StalenessEngine::checkPendingLocked(const KeyState& ks, uint64_t key, uint64_t step, const Plan& plan) const {
  if (options_.mode != Mode::kAsp || options_.policy == Policy::kDrop) {
    return;
  }
  std::vector<int64_t> dueNow(static_cast<size_t>(size_), 0);
  if (auto it = ks.arrivals.find(step); it != ks.arrivals.end()) {
    for (const auto& a : it->second) {
      ++dueNow[static_cast<size_t>(a.rank)];
    }
  }
  for (int r = 0; r < size_; ++r) {
    const auto i = static_cast<size_t>(r);
    if (plan.k[i] > 0 && ks.pendingOf[i] - dueNow[i] >= options_.maxPending) {
      TORCH_CHECK(false, "delaycomm: stale ", opTextLocked(key), " on group '", options_.groupName, "': at step ", step,
                  " of ", describeKeyLocked(key), ", rank ", r, "'s contribution is late again while it already has ",
                  ks.pendingOf[i] - dueNow[i],
                  " in flight: staleness=asp holds at most max_pending=", options_.maxPending,
                  " per rank and key. Raise max_pending (DELAYCOMM_MAX_PENDING), lower the delay or delay_fraction, "
                  "or bound staleness with staleness=ssp:S. Every rank raises this error at this step; nothing of "
                  "the step was applied");
    }
  }
}

void StalenessEngine::throwGateTimeout(uint64_t key, uint64_t step, int late, const Plan& plan, int64_t stepNs) const {
  const auto i = static_cast<size_t>(late);
  // The wording follows the timeout of an op held back on the network path (backend/DelayWork.cpp).
  C10_THROW_ERROR(
      DistBackendError,
      c10::str("delaycomm: ", opTextLocked(key), " (step ", step, " of ", describeKeyLocked(key), ", group '",
               options_.groupName, "'): the ssp:", options_.bound, " gate timed out after ", options_.timeout.count(),
               " ms (the group's timeout): rank ", late, "'s contribution is held back by an injected delay of ",
               msText(plan.delayNs[i]), " ms, of which ", options_.bound, " step(s) of staleness (step ",
               msText(stepNs), " ms) cover ", msText(options_.bound * stepNs), " ms and ", msText(plan.waitNs[i]),
               " ms are paid as waiting; a delay longer than the timeout is a timeout"));
}

StalenessEngine::StepInfo StalenessEngine::prepare(at::Tensor& t, uint64_t key, bool average) {
  return prepareScaled(t, key, average ? 1.0 / static_cast<double>(size_) : 1.0, /*scatter=*/false);
}

StalenessEngine::StepInfo StalenessEngine::prepareScaled(at::Tensor& t, uint64_t key, double resultScale,
                                                         bool scatter) {
  TORCH_CHECK_VALUE(std::isfinite(resultScale),
                    "delaycomm: stale reduction: the result scale (PREMUL_SUM factor) "
                    "must be finite, got ",
                    resultScale);
  std::vector<std::string> warnings;
  auto emitWarnings = [&] {
    if (onWarn) {
      for (const auto& w : warnings) {
        onWarn(w);
      }
    }
    warnings.clear();
  };
  std::unique_lock<std::mutex> lock(mutex_);
  ++calls_;
  std::string warning;
  touchLocked(key, t);
  evictLocked(&warning);
  int64_t stepNs = stepNs_;
  if (stepNs == 0) {
    auto proposal = calibrationLocked(keys_.at(key), key, &warning);
    if (proposal) {
      lock.unlock();
      if (!warning.empty()) {
        warnings.push_back(std::move(warning));
        warning.clear();
        emitWarnings();
      }
      int64_t agreed = 0;
      try {
        agreed = agreeOnStep(*proposal);
      } catch (...) {
        lock.lock();
        calibrating_ = false;
        throw;
      }
      lock.lock();
      stepNs_ = agreed;
      calibrating_ = false;
      source_ =
          StepSource{StepSource::Kind::kCalibrated, agreed, proposal->keyText, proposal->intervals, proposal->call};
      stepNs = agreed;
    }
  }
  if (!warning.empty()) {
    warnings.push_back(std::move(warning));
  }
  // Re-find: the lock may have been released above.
  KeyState& ks = touchLocked(key, t);
  const uint64_t step = ks.step;

  // Checks first: each raises on every rank alike, before this step changes anything.
  if (options_.policy != Policy::kDrop && !ks.arrivals.empty()) {
    TORCH_CHECK_VALUE(t.numel() == ks.numel && t.scalar_type() == ks.prototype.scalar_type(), "delaycomm: stale ",
                      opTextLocked(key), ": ", describeKeyLocked(key), " changed from ", ks.numel, " x ",
                      ks.prototype.scalar_type(), " to ", t.numel(), " x ", t.scalar_type(),
                      " while contributions were in flight; give each stream its own key (delaycomm.ddp_hook, "
                      "delaycomm.stale_allreduce(key=...))");
  }
  const Plan plan = planLocked(key, step, stepNs);
  const auto timeoutNs = std::chrono::duration_cast<std::chrono::nanoseconds>(options_.timeout).count();
  int late = -1;
  for (int r = 0; r < size_; ++r) {
    if (plan.waitNs[static_cast<size_t>(r)] > timeoutNs &&
        (late < 0 || plan.waitNs[static_cast<size_t>(r)] > plan.waitNs[static_cast<size_t>(late)])) {
      late = r;
    }
  }
  if (late >= 0) {
    // Every rank waits out the timeout (the late rank at the gate, the others as they would in the collective)
    // and raises the same error; no rank issues the reduction, so the inner group stays in step.
    lock.unlock();
    emitWarnings();
    std::this_thread::sleep_for(options_.timeout);
    lock.lock();
    throwGateTimeout(key, step, late, plan, stepNs);
  }
  checkPendingLocked(ks, key, step, plan);

  // The step.
  ks.step++;
  ks.seen++;
  ks.resultScale = resultScale;
  ks.scatter = scatter;
  ks.numel = t.numel();
  if (ks.prototype.scalar_type() != t.scalar_type() || ks.prototype.device() != t.device()) {
    ks.prototype = at::empty({0}, t.options());
  }
  for (int r = 0; r < size_; ++r) {
    const int64_t k = plan.k[static_cast<size_t>(r)];
    if (k > 0) {
      ks.arrivals[step + static_cast<uint64_t>(k)].push_back(Arrival{r, k});
      if (options_.policy != Policy::kDrop) {
        ++ks.pendingOf[static_cast<size_t>(r)];
      }
    }
  }
  std::vector<Arrival> arriving;
  if (auto it = ks.arrivals.find(step); it != ks.arrivals.end()) {
    arriving = std::move(it->second);
    ks.arrivals.erase(it);
  }
  const int64_t nStale = static_cast<int64_t>(arriving.size());
  const int64_t nFresh = plan.nFresh;
  if (options_.policy != Policy::kDrop) {
    for (const auto& a : arriving) {
      --ks.pendingOf[static_cast<size_t>(a.rank)];
    }
  }

  // This rank's own due contributions.
  std::vector<at::Tensor> due;
  for (auto it = ks.mine.begin(); it != ks.mine.end();) {
    if (it->due == step) {
      due.push_back(std::move(it->tensor));
      it = ks.mine.erase(it);
    } else {
      ++it;
    }
  }

  const int64_t myK = plan.k[static_cast<size_t>(rank_)];
  const int64_t myWaitNs = plan.waitNs[static_cast<size_t>(rank_)];
  const double n = static_cast<double>(size_);
  const bool fresh = myK == 0;
  double a = 0.0;
  double b = 0.0;
  switch (options_.policy) {
    case Policy::kApply:
      a = fresh ? 1.0 : 0.0;
      b = 1.0;
      break;
    case Policy::kDrop:
      a = (fresh && nFresh > 0) ? n / static_cast<double>(nFresh) : 0.0;
      b = 0.0;
      due.clear();
      break;
    case Policy::kEma:
      if (nStale > 0 && nFresh > 0) {
        a = fresh ? n * (1.0 - options_.alpha) / static_cast<double>(nFresh) : 0.0;
        b = n * options_.alpha / static_cast<double>(nStale);
      } else if (nStale > 0) {
        a = 0.0;
        b = n / static_cast<double>(nStale);
      } else {
        a = (fresh && nFresh > 0) ? n / static_cast<double>(nFresh) : 0.0;
      }
      break;
  }
  a *= resultScale;
  b *= resultScale;

  std::optional<at::Tensor> stash;
  if (!fresh && options_.policy != Policy::kDrop) {
    stash = at::empty_like(t, at::MemoryFormat::Contiguous);
    ks.mine.push_back(Pending{step + static_cast<uint64_t>(myK), step, *stash});
  }
  std::vector<double> scales(due.size(), b);
  kernels::fusedBlend(t, a, due, scales, stash);

  auto& st = stats_->staleness();
  st.steps.fetch_add(1, std::memory_order_relaxed);
  st.fresh.fetch_add(static_cast<uint64_t>(nFresh), std::memory_order_relaxed);
  if (options_.policy == Policy::kDrop) {
    st.dropped.fetch_add(static_cast<uint64_t>(nStale), std::memory_order_relaxed);
  } else {
    st.stale.fetch_add(static_cast<uint64_t>(nStale), std::memory_order_relaxed);
    for (const auto& arrival : arriving) {
      st.stalenessSteps.record(static_cast<double>(arrival.staleness));
    }
  }
  recordWindow(nFresh, options_.policy == Policy::kDrop ? 0 : nStale);
  if (!warnedRatio_ && static_cast<int64_t>(window_.size()) >= std::min<int64_t>(options_.window, 20) &&
      windowedRatioLocked() > options_.warnRatio) {
    warnedRatio_ = true;
    std::ostringstream msg;
    msg << "delaycomm: the stale:fresh ratio over the last " << window_.size() << " steps is " << windowedRatioLocked()
        << " (> " << options_.warnRatio << "): stale gradients dominate the updates. Lower delay_fraction "
        << "(DELAYCOMM_DELAY_FRACTION) or the delay, raise step_ms, or bound staleness with a smaller staleness=ssp:S";
    warnings.push_back(msg.str());
  }

  StepInfo info;
  info.key = key;
  info.step = step;
  info.nFresh = nFresh;
  info.nStale = nStale;
  info.mineFresh = fresh;
  info.mineDue = static_cast<int64_t>(due.size());
  info.freshScale = a;
  info.deferrable = plan.deferrable;
  info.delayNs = plan.delayNs[static_cast<size_t>(rank_)];
  lock.unlock();
  emitWarnings();
  if (myWaitNs > 0) {
    // SSP gate: the delay beyond S steps is paid in wall clock before this rank joins the step (at most the
    // group's timeout: longer waits raised above).
    std::this_thread::sleep_for(std::chrono::nanoseconds(myWaitNs));
    st.blockedNs.fetch_add(static_cast<uint64_t>(myWaitNs), std::memory_order_relaxed);
    info.blockedNs = myWaitNs;
  }
  return info;
}

void StalenessEngine::recordWindow(int64_t nFresh, int64_t nStale) {
  window_.emplace_back(nFresh, nStale);
  windowFresh_ += nFresh;
  windowStale_ += nStale;
  while (static_cast<int64_t>(window_.size()) > options_.window) {
    windowFresh_ -= window_.front().first;
    windowStale_ -= window_.front().second;
    window_.pop_front();
  }
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
// flush (docs/staleness.md, "flush")

std::vector<std::pair<uint64_t, at::Tensor>> StalenessEngine::takeFlush() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<uint64_t, at::Tensor>> out;
  auto& st = stats_->staleness();
  for (auto& [key, ks] : keys_) {
    int64_t global = 0;
    for (const auto& [step, list] : ks.arrivals) {
      global += static_cast<int64_t>(list.size());
    }
    if (global == 0) {
      continue;
    }
    ks.arrivals.clear();
    std::fill(ks.pendingOf.begin(), ks.pendingOf.end(), 0);
    if (options_.policy == Policy::kDrop) {
      st.dropped.fetch_add(static_cast<uint64_t>(global), std::memory_order_relaxed);
      continue;
    }
    std::vector<at::Tensor> mine;
    for (auto& p : ks.mine) {
      mine.push_back(std::move(p.tensor));
    }
    ks.mine.clear();
    // As the policy delivers due contributions when no fresh one is present, and as the stream averages.
    double scale = options_.policy == Policy::kEma ? static_cast<double>(size_) / static_cast<double>(global) : 1.0;
    scale *= ks.resultScale;
    at::Tensor local = mine.empty() ? at::empty({ks.numel}, ks.prototype.options()) : at::empty_like(mine[0]);
    std::vector<double> scales(mine.size(), scale);
    kernels::fusedBlend(local, 0.0, mine, scales, std::nullopt);
    st.stale.fetch_add(static_cast<uint64_t>(global), std::memory_order_relaxed);
    out.emplace_back(key, std::move(local));
  }
  return out;
}

bool StalenessEngine::scatters(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = keys_.find(key);
  return it != keys_.end() && it->second.scatter;
}

int64_t StalenessEngine::pendingHere() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t n = 0;
  for (const auto& [key, ks] : keys_) {
    n += static_cast<int64_t>(ks.mine.size());
  }
  return n;
}

int64_t StalenessEngine::pendingGlobal() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t n = 0;
  for (const auto& [key, ks] : keys_) {
    for (const auto& [step, list] : ks.arrivals) {
      n += static_cast<int64_t>(list.size());
    }
  }
  return n;
}

}  // namespace delaycomm
