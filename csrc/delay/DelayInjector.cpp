#include "delay/DelayInjector.hpp"

#include <cxxabi.h>
#include <limits>
#include <stdexcept>

#include <c10/util/Exception.h>

#include "delay/DeferredWork.hpp"
#include "delay/DelayTimeout.hpp"
#include "delay/Profile.hpp"
#include "delay/Units.hpp"
#ifdef DELAYCOMM_WITH_CUDA
#include "delay/GpuDelay.hpp"
#endif

namespace delaycomm {

namespace {

using InjectorClock = std::chrono::steady_clock;

int64_t injectorNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(InjectorClock::now().time_since_epoch()).count();
}

}  // namespace

DelayInjector::DelayInjector(int rank, Options options, bool issuesCpuOps, std::shared_ptr<GroupStats> stats)
    : rank_(rank), options_(std::move(options)), stats_(std::move(stats)), timeoutMs_(options_.timeout.count()) {
  TORCH_INTERNAL_ASSERT(options_.slowdown >= 1.0, "delaycomm: DelayInjector: slowdown must be >= 1, got ",
                        options_.slowdown);
  if (options_.spec && !options_.spec->isNone() && options_.fraction > 0.0) {
    try {
      schedule_ = std::make_unique<DelaySchedule>(options_.spec, options_.fraction, options_.seed, options_.ranks,
                                                  options_.burst, options_.one_carrier ? options_.size : 0);
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK_VALUE(false, e.what());
    }
    if (options_.ops.empty()) {
      for (const auto& row : opTable()) {
        delayOp_[static_cast<int>(row.kind)] = row.delayable;
      }
    }
    for (const OpKind kind : options_.ops) {
      TORCH_INTERNAL_ASSERT(opInfo(kind).delayable, "delaycomm: DelayInjector: ", opName(kind), " is not delayable");
      delayOp_[static_cast<int>(kind)] = true;
    }
    if (const auto& profile = schedule_->sampler().distribution().profile()) {
      for (int k = 0; k < kNumOpKinds; ++k) {
        if (delayOp_[static_cast<size_t>(k)])
          fallbackNote_[static_cast<size_t>(k)] = profile->fallbackOf(k);
      }
    }
    if (options_.mode != DelayMode::kAdd) {
      local_ = std::make_shared<LocalLatency>();
      stats_->setOwnLatencySink(local_);  // the works record what their callers experience into it
      if (options_.place_step) {
        place_ = std::make_unique<StepPlace>();
      }
    }
    if (issuesCpuOps && options_.where == DelayWhere::kNetwork && schedule_->targets(rank)) {
      issuer_ = std::make_unique<IssuerThread>("dc-issue-" + options_.groupName);
    }
  }
  engaged_ = options_.slowdown > 1.0 || (schedule_ && schedule_->targets(rank));
}

DelayInjector::~DelayInjector() {
  // close() ran already unless the group was never destroyed (interpreter exit): no thread of this group may
  // outlive it (IssuerThread::stop() is safe from any thread, itself included).
  close();
}

void DelayInjector::close() {
  hostSleeper_.close();
  if (issuer_) {
    issuer_->stop();
  }
}

void DelayInjector::abort() {
  hostSleeper_.close();  // callers sleeping in a host delay or slowdown raise (the op is not issued)
  if (issuer_) {
    issuer_->cancelAll(std::make_exception_ptr(c10::DistBackendError(
        {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
        "delaycomm: the group was aborted while this op was held back by an injected delay; the op was not issued")));
    issuer_->stop();  // nothing is left to issue: joins the thread
  }
}

namespace {

// Point-to-point ops: their peers are not the whole group, so match mode takes the rank's own delay alone.
bool pointToPoint(OpKind op) {
  return op == OpKind::kSend || op == OpKind::kRecv || op == OpKind::kRecvAnysource;
}

}  // namespace

void DelayInjector::noteFallback(OpKind op) const {
  const auto& note = fallbackNote_[static_cast<size_t>(op)];
  if (note.empty() || fallbackWarned_[static_cast<size_t>(op)].exchange(true, std::memory_order_relaxed)) {
    return;
  }
  warn(c10::str("delaycomm: the delay profile has no ", opName(op), ": its calls draw from ", note,
                " (docs/delay.md, \"Replay into another job\"); warned once per op"));
}

void DelayInjector::noteKindFallback(OpKind op, int64_t bytes) const {
  if (kindFallbackWarned_[static_cast<size_t>(op)].load(std::memory_order_relaxed))
    return;
  const auto& profile = schedule_->sampler().distribution().profile();
  if (!profile || !profile->drawsFromKind(static_cast<int>(op), bytes) ||
      kindFallbackWarned_[static_cast<size_t>(op)].exchange(true, std::memory_order_relaxed)) {
    return;
  }
  warn(c10::str("delaycomm: the delay profile has no ", opName(op), " near ", bytes, " bytes: such calls draw from ",
                profile->kindFallbackOf(static_cast<int>(op), bytes),
                " (docs/delay.md, \"Replay into another job\"); warned once per op"));
}

int64_t DelayInjector::delayNsFor(OpKind op, uint64_t seq, int64_t bytes) const {
  if (!schedule_ || !delayOp_[static_cast<int>(op)]) {
    return 0;
  }
  noteFallback(op);
  noteKindFallback(op, bytes);
  return schedule_->delayNs(rank_, static_cast<uint64_t>(op), seq, CallSize{static_cast<int>(op), bytes},
                            /*ownDraw=*/pointToPoint(op));
}

MatchCall matchCallFor(DelayMode mode, OpKind op, bool cuda) {
  if (mode == DelayMode::kAdd) {
    return MatchCall::kAdd;
  }
  if (!cuda) {
    return MatchCall::kMatch;
  }
  TORCH_CHECK(mode == DelayMode::kMatchCpu, "delaycomm: ", opName(op),
              ": delay_mode=match measures this machine's own latency on the host and supports CPU (Gloo) ops; for "
              "cuda tensors use delay_mode=add (or leave delay_mode at auto: a profile is then matched on CPU ops and "
              "added on cuda ops, with a warning)");
  return MatchCall::kUntimed;
}

int64_t DelayInjector::matchDelayNs(const Op& op, int64_t* observe, bool untimed) {
  *observe = -1;
  if (!schedule_ || !delayOp_[static_cast<int>(op.kind)]) {
    return 0;
  }
  noteFallback(op.kind);
  noteKindFallback(op.kind, op.bytes);
  const CallSize at{static_cast<int>(op.kind), op.bytes};
  const bool p2p = pointToPoint(op.kind);
  auto latest = schedule_->latest(static_cast<uint64_t>(op.kind), op.at(), options_.size, p2p ? rank_ : -1, at);
  // delay_place=step: every rank places every collective in its run (delay/Schedule.hpp, StepPlace), the carrier
  // to draw its target there, the others to know the run as the carrier of a later call will.
  const StepPlace* place = p2p ? nullptr : place_.get();
  const int64_t nowNs = place ? injectorNowNs() : 0;
  if (latest.rank < 0) {
    // No rank is late: what the caller sees is this machine's own latency, unless an earlier call's target still
    // runs (then it would count its wait for that call as its own latency).
    *observe = untimed || (place && place->behindNs(nowNs) > 0) ? -1 : 0;
    return 0;
  }
  // The machine's own latency X of this call is independent of the draw, so the call takes X + (T - L): with L
  // X's mean, the call's mean is the target's, and the tail is the target's shifted by X's spread about its mean,
  // where L at T's own quantile made the tail short by X's spread above its typical value (docs/delay.md, "Why
  // the mean").
  const int cls = sizeClassOf(op.bytes);
  const int64_t own = untimed ? -1 : local_->at(op.kind, cls).meanNs();
  // Before calibration a low provisional estimate (LocalLatency::provisionalNs) keeps the call from running long
  // by this machine's whole latency.
  const int64_t guess = own >= 0 || untimed ? own : local_->provisionalNs(op.kind, cls);
  bool behind = false;
  if (place) {
    // The carrier holds the call back until T - L after its call: the run's calls hold later ones back until then.
    // (The estimate L is this rank's: the carrier of an earlier call, another rank, has one of its own, close to it.)
    const auto placed = place_->place(
        nowNs, latest.u, [&](double u) { return schedule_->drawNs(u, at); }, std::max<int64_t>(0, guess), op.asyncOp);
    latest.ns = placed.ns;
    behind = placed.behindNs > 0;
  }
  if (latest.rank != rank_) {
    return 0;  // another rank carries the call: this one waits for it in the op (not observed: it holds a delay)
  }
  const int64_t added = std::max<int64_t>(0, latest.ns - std::max<int64_t>(0, guess));
  // Every peer already waits in the op when this rank issues it: the rest is this machine's own latency. Not so
  // for a call behind an earlier call whose target, on any rank, ends after its own: it waits for that one.
  *observe = untimed || behind ? -1 : added;
  auto& s = stats_->op(op.kind);
  s.delayedCalls.fetch_add(1, std::memory_order_relaxed);
  s.delayNs.record(static_cast<double>(added));
  s.matchCalls.fetch_add(1, std::memory_order_relaxed);
  if (own < 0) {
    s.matchUncalibrated.fetch_add(1, std::memory_order_relaxed);
    s.matchUncalibratedBySize[static_cast<size_t>(cls)].fetch_add(1, std::memory_order_relaxed);
    if (untimed) {
      if (!untimedWarned_[static_cast<size_t>(op.kind)].exchange(true, std::memory_order_relaxed)) {
        warn(c10::str("delaycomm: delay_mode=auto replays the profile in match mode on CPU ops only: ", opName(op.kind),
                      " on cuda tensors cannot have this machine's own latency timed on the host, "
                      "so its calls get the whole target added, as delay_mode=add does (their latency comes out long "
                      "by NCCL's own). Counted in stats()[\"ops\"][op][\"by_size\"][i][\"match\"][\"uncalibrated\"]; "
                      "set delay_mode=add to choose this explicitly; warned once per op"));
      }
      return added;
    }
    auto& warned = uncalibratedWarned_[static_cast<size_t>(op.kind) * kSizeClasses + static_cast<size_t>(cls)];
    if (!warned.exchange(true, std::memory_order_relaxed)) {
      warn(c10::str(
          "delaycomm: delay_mode=match: ", opName(op.kind), " of ", op.bytes, " bytes (size class ",
          sizeClassBytes(cls), "): this machine's own latency is not estimated yet (", local_->at(op.kind, cls).count(),
          " of ", LatencyEstimate::kMinSamples,
          " observations), so this call and the next ones of the class until it is get the target less a ",
          "low provisional estimate (the class's smallest observation so far, or the 10th percentile of the op's ",
          "nearest smaller calibrated class), or the whole target with neither, as delay_mode=add does. ",
          "Counted in "
          "stats()[\"ops\"][op][\"by_size\"][i][\"match\"][\"uncalibrated\"]; warned once per op and size "
          "class"));
    }
  } else if (own >= latest.ns) {
    s.matchNothingAdded.fetch_add(1, std::memory_order_relaxed);
    s.matchNothingAddedBySize[static_cast<size_t>(cls)].fetch_add(1, std::memory_order_relaxed);
    auto& warned = nothingAddedWarned_[static_cast<size_t>(op.kind) * kSizeClasses + static_cast<size_t>(cls)];
    if (!warned.exchange(true, std::memory_order_relaxed)) {
      warn(c10::str("delaycomm: delay_mode=match: ", opName(op.kind), " of ", op.bytes, " bytes (size class ",
                    sizeClassBytes(cls), "): the target latency ", msText(latest.ns),
                    " ms is shorter than this machine's own latency of ", msText(own),
                    " ms (its mean); nothing is added, and the call takes longer than its target (a call "
                    "cannot be made faster). Counted per size class in stats()[\"ops\"][op][\"by_size\"][i][\"match\"]"
                    "[\"nothing_added\"] and in report(); warned once per op and size class"));
    }
  }
  return added;
}

trace::Span DelayInjector::delaySpan(const char* name, const Op& op, int64_t delayNs) const {
  return trace::Span::begin(name, [&](trace::SpanArgs& args) {
    args.emplace("op", std::string(opName(op.kind)));
    args.emplace("seq", static_cast<int64_t>(op.seq));
    args.emplace("rank", static_cast<int64_t>(rank_));
    args.emplace("size_class_bytes", static_cast<int64_t>(sizeClassBytes(sizeClassOf(op.bytes))));
    args.emplace("bytes", op.bytes);
    args.emplace("delay_us", delayNs / 1000);
    args.emplace("where", std::string(options_.where == DelayWhere::kHost ? "host"
                                      : op.device.is_cuda()               ? "gpu"
                                                                          : "network"));
    args.emplace("carrier", carrierOf(op));
  });
}

int64_t DelayInjector::carrierOf(const Op& op) const {
  if (!schedule_ || !delayOp_[static_cast<int>(op.kind)]) {
    return -1;
  }
  return schedule_
      ->latest(static_cast<uint64_t>(op.kind), op.at(), options_.size, pointToPoint(op.kind) ? rank_ : -1,
               CallSize{static_cast<int>(op.kind), op.bytes})
      .rank;
}

std::optional<trace::TraceRecord> DelayInjector::holdRecord(const char* name, const Op& op, int64_t delayNs,
                                                            InjectorClock::time_point since) const {
  if (C10_LIKELY(trace::TraceLog::active() == nullptr)) {
    return std::nullopt;
  }
  trace::TraceRecord r;
  r.kind = trace::TraceRecord::kDelay;
  r.name = name;
  r.op = opName(op.kind);
  r.startNs = std::chrono::duration_cast<std::chrono::nanoseconds>(since.time_since_epoch()).count();
  r.seq = op.seq;
  r.args = {delayNs, carrierOf(op), static_cast<int64_t>(sizeClassBytes(sizeClassOf(op.bytes))), 0, 0};
  return r;
}

void DelayInjector::endHold(std::optional<trace::TraceRecord>& record) {
  if (!record) {
    return;
  }
  if (trace::TraceLog* log = trace::TraceLog::active()) {
    record->durNs = trace::TraceLog::nowNs() - record->startNs;
    log->record(*record);
  }
  record.reset();
}

void DelayInjector::warn(const std::string& message) const {
  if (onWarn) {
    onWarn(message);
  } else {
    TORCH_WARN(message);
  }
}

void DelayInjector::throwIfClosed(HostSleeper::Woke woke, OpKind op, uint64_t seq, const char* what) const {
  if (woke != HostSleeper::Woke::kClosed) {
    return;
  }
  stats_->op(op).errors.fetch_add(1, std::memory_order_relaxed);
  C10_THROW_ERROR(DistBackendError,
                  c10::str("delaycomm: ", opName(op), " (sequence number ", seq,
                           "): the group was shut down "
                           "(destroy_process_group or abort) while this call was held back on the calling thread by ",
                           what, "; the op was not issued"));
}

void DelayInjector::applySlowdown(OpKind op, uint64_t seq, InjectorClock::time_point deadline) {
  const int64_t last = lastReturnNs_.load(std::memory_order_relaxed);
  if (last < 0) {
    return;  // the first op: nothing measured yet
  }
  const int64_t gap = injectorNowNs() - last;
  // In double: gap x (K - 1) may not fit in int64 (a huge K), and must then saturate, not wrap.
  const double extra = static_cast<double>(gap) * (options_.slowdown - 1.0);
  if (!(extra >= 1.0)) {
    return;
  }
  const int64_t extraNs = extra >= 9.0e18 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(extra);
  const auto woke = hostSleeper_.sleepUntil(addSaturated<InjectorClock>(InjectorClock::now(), extraNs), deadline);
  const auto what =
      c10::str("the compute slowdown of ", options_.slowdown, "x (", msText(extraNs), " ms: ", options_.slowdown - 1.0,
               " x the ", msText(gap), " ms since its previous op returned)");
  throwIfClosed(woke, op, seq, what.c_str());
  if (woke == HostSleeper::Woke::kDeadline) {
    stats_->op(op).errors.fetch_add(1, std::memory_order_relaxed);
    throwDelayTimeout(opName(op), seq, "the call", timeout(), true, c10::str("held back by ", what));
  }
  auto& h = stats_->host();
  h.slowdownCalls.fetch_add(1, std::memory_order_relaxed);
  h.slowdownNs.record(static_cast<double>(extraNs));
}

DelayInjector::Issued DelayInjector::run(const Op& op, Issue issue) {
  // Every wait this call adds on the calling thread (slowdown, host delay) ends by the group's timeout.
  const auto callDeadline = addSaturated<InjectorClock>(InjectorClock::now(), timeout());
  const bool slow = options_.slowdown > 1.0;
  // Slowdown measures the time between ops from the moment each returns to its caller (or fails).
  struct ReturnStamp {
    std::atomic<int64_t>* last;
    ~ReturnStamp() {
      if (last)
        last->store(injectorNowNs(), std::memory_order_relaxed);
    }
  } stamp{slow ? &lastReturnNs_ : nullptr};
  if (slow) {
    applySlowdown(op.kind, op.seq, callDeadline);
  }

  // The stale path consumes the schedule itself (as staleness, not as network delay), in either delay_mode.
  const auto enteredAt = InjectorClock::now();
  const MatchCall how =
      local_ && op.applyDelay ? matchCallFor(options_.mode, op.kind, op.device.is_cuda()) : MatchCall::kAdd;
  const bool match = how != MatchCall::kAdd;
  int64_t observe = -1;
  const int64_t delayNs = match           ? matchDelayNs(op, &observe, how == MatchCall::kUntimed)
                          : op.applyDelay ? delayNsFor(op.kind, op.at(), op.bytes)
                                          : 0;
  if (delayNs > 0) {
    auto& s = stats_->op(op.kind);
    if (!match) {  // matchDelayNs() counted the calls it carries, zeros included
      s.delayedCalls.fetch_add(1, std::memory_order_relaxed);
      s.delayNs.record(static_cast<double>(delayNs));
    }
    if (options_.where == DelayWhere::kHost) {
      trace::Span span = delaySpan("delaycomm:delay", op, delayNs);
      auto record = holdRecord("delaycomm:delay", op, delayNs, InjectorClock::now());
      const auto woke =
          hostSleeper_.sleepUntil(addSaturated<InjectorClock>(InjectorClock::now(), delayNs), callDeadline);
      endHold(record);
      const auto what = c10::str("an injected delay of ", msText(delayNs), " ms (delay_where=host)");
      throwIfClosed(woke, op.kind, op.seq, what.c_str());
      if (woke == HostSleeper::Woke::kDeadline) {
        s.errors.fetch_add(1, std::memory_order_relaxed);
        throwDelayTimeout(opName(op.kind), op.seq, "the call", timeout(), true,
                          c10::str("held back on the calling thread by ", what));
      }
    }
  }
  const int64_t networkDelayNs = options_.where == DelayWhere::kHost ? 0 : delayNs;
  const auto calledAt = InjectorClock::now();

  if (op.afterWaits) {
    (*op.afterWaits)();
  }
  if (op.device.is_cuda()) {
    c10::intrusive_ptr<c10d::Work> innerWork;
    if (networkDelayNs > 0) {
#ifdef DELAYCOMM_WITH_CUDA
      trace::Span span = delaySpan("delaycomm:delay", op, networkDelayNs);  // the sleep kernel's launch
      if (auto record = holdRecord("delaycomm:delay", op, networkDelayNs, calledAt)) {
        record->durNs = networkDelayNs;  // on the GPU's stream, from about the launch
        trace::TraceLog::active()->record(*record);
      }
      issueWithGpuDelay(op.device, boundedGpuDelayNs(networkDelayNs, timeout()),
                        /*joinCurrentStream=*/!op.asyncOp, [&] { innerWork = issue(true); });
#else
      TORCH_CHECK(false, "delaycomm: ", opName(op.kind),
                  ": network delay on cuda tensors needs the GPU sleep kernel, "
                  "and this build of delaycomm has no CUDA sources (rebuild with nvcc, or use delay_where=host)");
#endif
    } else {
      innerWork = issue(true);
    }
    return {std::move(innerWork), false, calledAt, enteredAt, observe};
  }
  return issueCpu(op, issue, networkDelayNs, calledAt, enteredAt, observe);
}

DelayInjector::Issued DelayInjector::issueCpu(const Op& op, Issue& issue, int64_t networkDelayNs,
                                              InjectorClock::time_point calledAt, InjectorClock::time_point enteredAt,
                                              int64_t observe) {
  if (!issuer_) {
    return {issue(true), false, calledAt, enteredAt, observe};
  }
  if (networkDelayNs == 0) {
    // Nothing held back ahead of it: issue on the caller's thread (the issuer's lock keeps the call order).
    c10::intrusive_ptr<c10d::Work> innerWork;
    if (issuer_->runInlineIfIdle([&] { innerWork = issue(true); })) {
      return {std::move(innerWork), false, calledAt, enteredAt, observe};
    }
  }
  auto work =
      c10::make_intrusive<DeferredWorkCpu>(op.kind, op.seq, stats_, calledAt, *op.outputs, timeout(), networkDelayNs,
                                           CallTiming{sizeClassOf(op.bytes), enteredAt, observe});
  const OpKind kind = op.kind;
  // From the call to the op's issue: its injected delay, or its wait behind the held-back ops ahead of it.
  const char* holdName = networkDelayNs > 0 ? "delaycomm:delay" : "delaycomm:queued";
  auto span = std::make_shared<trace::Span>(delaySpan(holdName, op, networkDelayNs));
  issuer_->submit(
      addSaturated<InjectorClock>(calledAt, networkDelayNs),
      [issue = std::move(issue), work, kind, span,
       record = holdRecord(holdName, op, networkDelayNs, calledAt)]() mutable {
        span->end();
        endHold(record);
        try {
          auto w = issue(false);
          TORCH_CHECK(w, "delaycomm: ", opName(kind), ": the inner backend returned no work");
          work->attach(std::move(w));
        } catch (const abi::__forced_unwind&) {
          throw;  // the thread is being cancelled or exits (e.g. at interpreter exit): never swallow it
        } catch (...) {
          work->fail(std::current_exception());
        }
      },
      [work](std::exception_ptr error) { work->fail(error); },
      // Still held back at the call time + the group's timeout: the work fails with the timeout error.
      addSaturated<InjectorClock>(calledAt, timeout()), [work] { work->expire(); },
      // Under the issuer's lock, before the op can be issued: the wait behind the ops held back ahead of it.
      [&work](int64_t queuedNs) { work->setQueuedNs(queuedNs); });
  return {std::move(work), true, calledAt, enteredAt, observe};
}

}  // namespace delaycomm
