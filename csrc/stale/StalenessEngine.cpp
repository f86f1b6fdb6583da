#include "stale/StalenessEngine.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <thread>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "kernels/Blend.hpp"

namespace delaycomm {

namespace {
constexpr const char* kStepKey = "delaycomm/stale/step_ns";

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

StalenessEngine::StalenessEngine(int rank, int size, Options options, const DelaySchedule* schedule,
                                 c10::intrusive_ptr<c10d::Store> store, std::shared_ptr<GroupStats> stats)
    : rank_(rank),
      size_(size),
      options_(options),
      schedule_(schedule),
      store_(std::move(store)),
      stats_(std::move(stats)) {
  TORCH_CHECK_VALUE(options_.mode == Mode::kAsp || options_.bound >= 1,
                    "delaycomm: StalenessEngine: ssp bound must be >= 1 (ssp:0 is bsp), got ", options_.bound);
  TORCH_CHECK_VALUE(options_.alpha > 0.0 && options_.alpha <= 1.0,
                    "delaycomm: StalenessEngine: ema_alpha must be in (0, 1], got ", options_.alpha);
  TORCH_CHECK_VALUE(options_.maxPending >= 1, "delaycomm: StalenessEngine: max_pending must be >= 1, got ",
                    options_.maxPending);
  if (options_.stepMs > 0.0) {
    stepNs_ = std::max<int64_t>(1, static_cast<int64_t>(std::llround(options_.stepMs * 1e6)));
  }
}

uint64_t StalenessEngine::keyOf(const at::Tensor& t) {
  std::ostringstream id;
  id << t.data_ptr() << '/' << t.numel() << '/' << t.scalar_type() << '/' << t.device();
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, inserted] = identityKeys_.try_emplace(id.str(), nextIdentityKey_);
  if (inserted) {
    ++nextIdentityKey_;
  }
  return it->second;
}

int64_t StalenessEngine::stepNsLocked(KeyState& ks, uint64_t key) {
  if (stepNs_ > 0) {
    return stepNs_;
  }
  // Calibrate on the first key seen a second time: intervals between its consecutive steps.
  if (calibrationKey_ < 0 && ks.step >= 1) {
    calibrationKey_ = static_cast<int64_t>(key);
    lastCalibrationCall_ = std::chrono::steady_clock::now();
    return 0;
  }
  if (calibrationKey_ != static_cast<int64_t>(key)) {
    return 0;
  }
  const auto now = std::chrono::steady_clock::now();
  calibrationIntervals_.push_back(
      std::chrono::duration_cast<std::chrono::nanoseconds>(now - lastCalibrationCall_).count());
  lastCalibrationCall_ = now;
  if (static_cast<int64_t>(calibrationIntervals_.size()) < options_.calibrationSteps) {
    return 0;
  }
  // Every rank reaches this step of this key (same call order); rank 0's median is the group's step.
  if (rank_ == 0) {
    auto v = calibrationIntervals_;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    const std::string text = std::to_string(std::max<int64_t>(1, v[v.size() / 2]));
    store_->set(kStepKey, std::vector<uint8_t>(text.begin(), text.end()));
  }
  const auto bytes = store_->get(kStepKey);
  stepNs_ = std::stoll(std::string(bytes.begin(), bytes.end()));
  return stepNs_;
}

StalenessEngine::StepInfo StalenessEngine::prepare(at::Tensor& t, uint64_t key, bool average) {
  std::unique_lock<std::mutex> lock(mutex_);
  KeyState& ks = keys_[key];
  if (!ks.prototype.defined()) {
    ks.prototype = at::empty({0}, t.options());
  }
  ks.numel = t.numel();
  StepInfo info;
  info.key = key;
  info.step = ks.step;
  const uint64_t step = ks.step++;
  ks.seen++;
  const int64_t stepNs = stepNsLocked(ks, key);
  // No deferral on a key's first step (DDP's bucket rebuild) nor before the step time is known.
  const bool canDefer = step >= 1 && stepNs > 0 && schedule_ != nullptr && schedule_->active();

  int64_t myK = 0;
  int64_t myWaitNs = 0;
  int64_t nFresh = 0;
  for (int r = 0; r < size_; ++r) {
    int64_t k = 0;
    int64_t waitNs = 0;
    if (canDefer) {
      const int64_t d = schedule_->delayNs(r, DelaySchedule::keyStream(key), step);
      if (d > 0) {
        k = (d + stepNs - 1) / stepNs;
        if (options_.mode == Mode::kSsp && k > options_.bound) {
          waitNs = d - options_.bound * stepNs;
          k = options_.bound;
        }
      }
    }
    if (k == 0) {
      ++nFresh;
    } else {
      ks.arrivals[step + static_cast<uint64_t>(k)] += 1;
      ks.arrivalStaleness[step + static_cast<uint64_t>(k)].push_back(k);
    }
    if (r == rank_) {
      myK = k;
      myWaitNs = waitNs;
    }
  }
  int64_t nStale = 0;
  if (auto it = ks.arrivals.find(step); it != ks.arrivals.end()) {
    nStale = it->second;
    ks.arrivals.erase(it);
  }
  std::vector<int64_t> staleness;
  if (auto it = ks.arrivalStaleness.find(step); it != ks.arrivalStaleness.end()) {
    staleness = std::move(it->second);
    ks.arrivalStaleness.erase(it);
  }

  // This rank's own due contributions.
  std::vector<at::Tensor> due;
  for (auto it = ks.mine.begin(); it != ks.mine.end();) {
    if (it->due == step) {
      TORCH_CHECK_VALUE(it->tensor.numel() == t.numel() && it->tensor.scalar_type() == t.scalar_type(),
                        "delaycomm: stale all_reduce: key ", key, " changed from ", it->tensor.numel(), " ",
                        it->tensor.scalar_type(), " elements to ", t.numel(), " ", t.scalar_type(),
                        " while a contribution was pending; give each stream its own key (delaycomm.ddp_hook)");
      due.push_back(std::move(it->tensor));
      it = ks.mine.erase(it);
    } else {
      ++it;
    }
  }

  const double n = static_cast<double>(size_);
  const double avg = average ? 1.0 / n : 1.0;
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
  a *= avg;
  b *= avg;

  std::optional<at::Tensor> stash;
  if (!fresh && options_.policy != Policy::kDrop) {
    if (options_.mode == Mode::kAsp) {
      TORCH_CHECK(static_cast<int64_t>(ks.mine.size()) < options_.maxPending, "delaycomm: stale all_reduce: key ",
                  key, " already holds max_pending=", options_.maxPending,
                  " deferred contributions on rank ", rank_, " under asp; raise max_pending (DELAYCOMM_MAX_PENDING), "
                  "lower the delay, or bound staleness with staleness=ssp:S");
    }
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
    for (auto k : staleness) {
      st.stalenessSteps.record(static_cast<double>(k));
    }
  }
  recordWindow(nFresh, options_.policy == Policy::kDrop ? 0 : nStale);
  std::string warning;
  if (!warned_ && static_cast<int64_t>(window_.size()) >= std::min<int64_t>(options_.window, 20) &&
      windowedRatio() > options_.warnRatio) {
    warned_ = true;
    std::ostringstream msg;
    msg << "delaycomm: the stale:fresh ratio over the last " << window_.size() << " steps is " << windowedRatio()
        << " (> " << options_.warnRatio << "): stale gradients dominate the updates. Lower delay_fraction "
        << "(DELAYCOMM_DELAY_FRACTION) or the delay, raise step_ms, or bound staleness with a smaller staleness=ssp:S";
    warning = msg.str();
  }

  info.nFresh = nFresh;
  info.nStale = nStale;
  info.mineFresh = fresh;
  info.mineDue = static_cast<int64_t>(due.size());
  info.freshScale = a;
  lock.unlock();
  if (!warning.empty() && onWarn) {
    onWarn(warning);
  }
  if (myWaitNs > 0) {
    // SSP gate: the delay beyond S steps is paid in wall clock before this rank joins the step.
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
  if (windowFresh_ == 0) {
    return windowStale_ > 0 ? INFINITY : 0.0;
  }
  return static_cast<double>(windowStale_) / static_cast<double>(windowFresh_);
}

std::vector<std::pair<uint64_t, at::Tensor>> StalenessEngine::takeFlush() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<uint64_t, at::Tensor>> out;
  for (auto& [key, ks] : keys_) {
    int64_t global = 0;
    for (const auto& [step, count] : ks.arrivals) {
      global += count;
    }
    if (global == 0) {
      continue;
    }
    at::Tensor local;
    std::vector<at::Tensor> mine;
    for (auto& p : ks.mine) {
      mine.push_back(std::move(p.tensor));
    }
    TORCH_CHECK(!mine.empty() || ks.prototype.defined(), "delaycomm: flush: key ", key, " has no shape");
    const double scale = options_.policy == Policy::kEma ? static_cast<double>(size_) / static_cast<double>(global)
                                                         : 1.0;
    if (!mine.empty()) {
      local = at::empty_like(mine[0]);
    } else {
      local = at::empty({ks.numel}, ks.prototype.options());
    }
    std::vector<double> scales(mine.size(), scale);
    kernels::fusedBlend(local, 0.0, mine, scales, std::nullopt);
    stats_->staleness().stale.fetch_add(static_cast<uint64_t>(global), std::memory_order_relaxed);
    ks.arrivals.clear();
    ks.arrivalStaleness.clear();
    ks.mine.clear();
    out.emplace_back(key, std::move(local));
  }
  return out;
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
    for (const auto& [step, count] : ks.arrivals) {
      n += count;
    }
  }
  return n;
}

}  // namespace delaycomm
