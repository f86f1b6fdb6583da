// DelayBackend's stale path (backend/DelayBackend.hpp): the reductions that StaleRouter routes to the staleness
// engine, stale_allreduce and flush. Each is the engine's pre-scaling in place, then one SUM reduction of the
// original size issued through the backend's one helper, run(), with the delay already consumed as staleness.
// Design notes: docs/staleness.md.

#include <sstream>

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "backend/Arguments.hpp"
#include "backend/DelayBackend.hpp"
#include "stats/Trace.hpp"

namespace delaycomm {

namespace {

// The profiler's mark of one stale decision (stats/Trace.hpp; docs/telemetry.md, "Spans"): this rank's
// contribution deferred k steps, fresh, or (a step that cannot defer) delayed as under bsp; with the contributions
// that land at this step.
void markStaleStep(OpKind op, const StalenessEngine::StepInfo& info, bool mayDefer) {
  const char* name = !info.deferrable ? "delaycomm:stale bsp step"
                     : info.mineFresh ? "delaycomm:stale fresh"
                                      : "delaycomm:stale deferred";
  if (trace::TraceLog* log = trace::TraceLog::active()) {  // DELAYCOMM_TRACE
    trace::TraceRecord r;
    r.kind = trace::TraceRecord::kStale;
    r.name = name;
    r.op = opName(op);
    r.startNs = trace::TraceLog::nowNs();
    r.seq = info.step;
    r.args = {static_cast<int64_t>(info.key), info.mineLateness, info.nStale, info.landedMaxSteps, info.delayNs};
    log->record(r);
  }
  trace::Span::mark(name, [&](trace::SpanArgs& args) {
    args.emplace("op", std::string(opName(op)));
    args.emplace("stream", static_cast<int64_t>(info.key));
    args.emplace("step", static_cast<int64_t>(info.step));
    args.emplace("deferred_steps", info.mineLateness);
    args.emplace("delay_us", info.delayNs / 1000);
    args.emplace("landed", info.nStale);
    args.emplace("landed_max_steps", info.landedMaxSteps);
    args.emplace("own_landed", info.mineDue);
    args.emplace("fresh", info.nFresh);
    args.emplace("gate_wait_us", info.blockedNs / 1000);
    if (!info.deferrable) {
      args.emplace("why", std::string(mayDefer ? "the stream's first step, or step_ms not known yet: the delay is "
                                                 "paid as under bsp"
                                               : "the stream is on probation: the delay is paid as under bsp"));
    }
  });
}

}  // namespace

c10::intrusive_ptr<c10d::Work> DelayBackend::runStaleAllreduce(const StaleRoute& route, at::Tensor& tensor,
                                                               const c10d::AllreduceOptions& opts) {
  const auto info = stale_->prepareScaled(tensor, route.key, route.resultScale, /*scatter=*/false, route.mayDefer);
  countStale(OpKind::kAllreduce, info);
  markStaleStep(OpKind::kAllreduce, info, route.mayDefer);
  c10d::AllreduceOptions sumOpts = opts;
  sumOpts.reduceOp = c10d::ReduceOp::SUM;  // AVG was folded into the pre-scaling
  std::vector<at::Tensor> tensors{tensor};
  // A step that cannot defer (a stream's first, or before step_ms is known) keeps the op's delay, as under bsp.
  return run(
      OpKind::kAllreduce, tensor.device(), bytesOf(tensors), tensors,
      [tensors, sumOpts](c10d::Backend& b) mutable { return b.allreduce(tensors, sumOpts); }, opts.asyncOp,
      /*applyDelay=*/!info.deferrable);
}

void DelayBackend::checkStaleReduceScatter(const at::Tensor& output, const at::Tensor& input) const {
  const int64_t n = getSize();
  TORCH_CHECK_VALUE(input.numel() == output.numel() * n,
                    "delaycomm: _reduce_scatter_base: inputBuffer must hold "
                    "outputBuffer's elements times the group size (",
                    output.numel(), " x ", n, " = ", output.numel() * n, "), got ", input.numel());
  TORCH_CHECK_VALUE(input.scalar_type() == output.scalar_type(),
                    "delaycomm: _reduce_scatter_base: inputBuffer and "
                    "outputBuffer must have one dtype, got ",
                    input.scalar_type(), " and ", output.scalar_type());
}

c10::intrusive_ptr<c10d::Work> DelayBackend::runStaleReduceScatter(const StaleRoute& route, at::Tensor& output,
                                                                   at::Tensor& input,
                                                                   const c10d::ReduceScatterOptions& opts) {
  // NOTE: the blend rewrites the input in place, as the stale all-reduce rewrites its tensor: FSDP2 discards its
  // reduce-scatter input afterwards (docs/staleness.md).
  const auto info = stale_->prepareScaled(input, route.key, route.resultScale, /*scatter=*/true, route.mayDefer);
  countStale(OpKind::kReduceScatterBase, info);
  markStaleStep(OpKind::kReduceScatterBase, info, route.mayDefer);
  c10d::ReduceScatterOptions sumOpts = opts;
  sumOpts.reduceOp = c10d::ReduceOp::SUM;  // AVG and PREMUL_SUM were folded into the pre-scaling
  return run(
      OpKind::kReduceScatterBase, input.device(), bytesOf(input), {output},
      [output, input, sumOpts](c10d::Backend& b) mutable { return b._reduce_scatter_base(output, input, sumOpts); },
      opts.asyncOp, /*applyDelay=*/!info.deferrable);
}

void DelayBackend::countStale(OpKind op, const StalenessEngine::StepInfo& info) {
  if (info.deferrable && info.delayNs > 0) {
    auto& s = stats_->op(op);
    s.delayedCalls.fetch_add(1, std::memory_order_relaxed);
    s.delayNs.record(static_cast<double>(info.delayNs));
    if (!info.mineFresh) {
      s.staleCalls.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

void DelayBackend::keptFresh(OpKind op, const std::vector<at::Tensor>& tensors, const StaleRoute& route) {
  stats_->op(op).keptFreshCalls.fetch_add(1, std::memory_order_relaxed);
  if (trace::TraceLog* log = trace::TraceLog::active()) {  // DELAYCOMM_TRACE
    trace::TraceRecord r;
    r.kind = trace::TraceRecord::kStale;
    r.name = "delaycomm:stale kept fresh";
    r.op = opName(op);
    r.why = route.whyNot;
    r.startNs = trace::TraceLog::nowNs();
    r.args = {-1, 0, 0, 0, 0};
    log->record(r);
  }
  trace::Span::mark("delaycomm:stale kept fresh", [&](trace::SpanArgs& args) {
    args.emplace("op", std::string(opName(op)));
    args.emplace("why", std::string(route.whyNot));
    if (!route.node.empty()) {
      args.emplace("node", route.node);
    }
  });
  auto& warned = freshWarned_[static_cast<size_t>(route.reason)];
  // The runtime check warns once per stream that fails it (its detail is set at that one failure), not per reason:
  // each stream kept fresh is named.
  const bool perStream = route.reason == GradientRecognizer::Reason::kNotConsumed;
  if ((perStream ? route.detail.empty() : warned.exchange(true)) || !stale_->onWarn) {
    return;
  }
  std::ostringstream msg;
  msg << "delaycomm: staleness on group '" << options_.groupName << "': " << opName(op);
  if (tensors.size() == 1 && tensors[0].defined()) {
    msg << " of " << tensors[0].numel() << " x " << tensors[0].scalar_type();
  }
  msg << " kept fresh (delayed as under bsp, never stale): " << route.whyNot;
  if (!route.node.empty()) {
    msg << " ('" << route.node << "')";
  }
  if (!route.detail.empty()) {
    msg << " (" << route.detail << ")";
  }
  msg << ". Reductions kept fresh are counted in delaycomm.stats()['ops']['" << opName(op)
      << "']['kept_fresh_calls']; this is not warned again for this " << (perStream ? "stream" : "reason")
      << " (docs/staleness.md, \"Which reductions go stale\")";
  stale_->onWarn(msg.str());
}

c10::intrusive_ptr<c10d::Work> DelayBackend::staleAllreduce(at::Tensor& tensor, std::optional<uint64_t> key,
                                                            bool average) {
  std::vector<at::Tensor> tensors{tensor};
  checkTensors(OpKind::kAllreduce, "tensor", tensors);
  TORCH_CHECK_VALUE(!key || *key < StalenessEngine::kExplicitKeyLimit,
                    "delaycomm: stale_allreduce: key must be < 2^40, got ", key.value_or(0));
  c10d::AllreduceOptions opts;
  opts.reduceOp = average ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
  if (staleRouter_) {
    StaleRoute route = staleRouter_->classify(OpKind::kAllreduce, tensors, opts.reduceOp, coalescing_, key);
    if (route.stale) {
      return runStaleAllreduce(route, tensor, opts);
    }
    if (route.keptFresh) {
      keptFresh(OpKind::kAllreduce, tensors, route);
    }
  }
  if (average && tensor.is_cpu()) {  // Gloo has no AVG: SUM, then divide (as DDP does)
    tensor.div_(getSize());
    opts.reduceOp = c10d::ReduceOp::SUM;
  }
  return run(OpKind::kAllreduce, tensor.device(), bytesOf(tensors), tensors,
             [tensors, opts](c10d::Backend& b) mutable { return b.allreduce(tensors, opts); });
}

std::vector<StalenessEngine::FlushStream> DelayBackend::flush() {
  std::vector<StalenessEngine::FlushStream> out;
  if (!stale_) {
    return out;
  }
  // The ranks agree first (every rank gets the same streams, or the same error), so every rank issues the same
  // reductions here, in key order.
  for (auto& stream : stale_->takeFlush()) {
    if (stream.local.defined()) {
      stream.local = flushReduce(stream.local, stream.scatter);
    }
    if (stream.reference.defined()) {  // stale_check: what bsp would have delivered
      stream.reference = flushReduce(stream.reference, stream.scatter);
    }
    out.push_back(std::move(stream));
  }
  return out;
}

at::Tensor DelayBackend::flushReduce(at::Tensor local, bool scatter) {
  if (scatter) {
    // A reduce-scatter stream: one SUM reduce-scatter delivers this rank's shard of everything pending (what the
    // stream's next steps would have delivered to it), with the bytes of the stream's own reduce-scatter.
    at::Tensor shard = at::empty({local.numel() / getSize()}, local.options());
    auto work = run(
        OpKind::kReduceScatterBase, local.device(), bytesOf(local), {shard},
        [shard, local](c10d::Backend& b) mutable {
          c10d::ReduceScatterOptions sumOpts;
          return b._reduce_scatter_base(shard, local, sumOpts);
        },
        true, /*applyDelay=*/false);
    work->wait(injector_->timeout());
    return shard;
  }
  std::vector<at::Tensor> tensors{local};
  c10d::AllreduceOptions opts;
  auto work = run(
      OpKind::kAllreduce, local.device(), bytesOf(tensors), tensors,
      [tensors, opts](c10d::Backend& b) mutable { return b.allreduce(tensors, opts); }, true,
      /*applyDelay=*/false);
  work->wait(injector_->timeout());
  return local;
}

void DelayBackend::flushAllreduce(at::Tensor& tensor) {
  std::vector<at::Tensor> tensors{tensor};
  checkTensors(OpKind::kAllreduce, "tensor", tensors);
  c10d::AllreduceOptions opts;
  auto work = run(
      OpKind::kAllreduce, tensor.device(), bytesOf(tensors), tensors,
      [tensors, opts](c10d::Backend& b) mutable { return b.allreduce(tensors, opts); }, true,
      /*applyDelay=*/false);
  work->wait(injector_->timeout());
}

}  // namespace delaycomm
