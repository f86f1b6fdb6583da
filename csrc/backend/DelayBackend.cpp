#include "backend/DelayBackend.hpp"

#include "backend/Arguments.hpp"

#include <algorithm>
#include <optional>
#include <sstream>

#include <ATen/ops/empty.h>
#include <Python.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

namespace delaycomm {

namespace {

// The factor of a PREMUL_SUM given as a number (FSDP2's gradient divide factor); nullopt for any other op, or
// for a factor given as a tensor (reading it would synchronise with its device).
std::optional<double> premulSumFactor(const c10d::ReduceOp& reduceOp) {
  if (reduceOp.op_ != c10d::ReduceOp::PREMUL_SUM) {
    return std::nullopt;
  }
  const auto* supplement = dynamic_cast<const c10d::PreMulSumSupplement*>(reduceOp.supplement_.get());
  if (supplement == nullptr || supplement->tensor_factor.defined()) {
    return std::nullopt;
  }
  return supplement->double_factor;
}

}  // namespace

DelayBackend::DelayBackend(int rank, int size, c10::intrusive_ptr<c10d::Backend> cpuInner,
                           c10::intrusive_ptr<c10d::Backend> cudaInner, BackendOptions options)
    : c10d::Backend(rank, size),
      cpuInner_(std::move(cpuInner)),
      cudaInner_(std::move(cudaInner)),
      options_(std::move(options)),
      stats_(std::make_shared<GroupStats>()) {
  TORCH_CHECK_VALUE(cpuInner_ || cudaInner_, "delaycomm: DelayBackend needs at least one inner backend");
  DelayInjector::Options delay;
  delay.delay = options_.delay;
  delay.fraction = options_.delayFraction;
  delay.ranks = options_.delayRanks;
  delay.ops = options_.delayOps;
  delay.where = options_.delayWhere;
  delay.seed = options_.seed;
  delay.slowdown = options_.slowdown;
  delay.timeout = options_.timeout;
  delay.groupName = options_.groupName;
  injector_ = std::make_unique<DelayInjector>(rank, std::move(delay), static_cast<bool>(cpuInner_), stats_);
  fastPath_ = !injector_->engaged();
  if (options_.staleness != StalenessMode::kBsp) {
    TORCH_INTERNAL_ASSERT(options_.store, "delaycomm: DelayBackend: staleness needs the group's store");
    TORCH_INTERNAL_ASSERT(options_.staleness == StalenessMode::kAsp || options_.staleBound >= 1,
                          "delaycomm: DelayBackend: ssp needs a bound >= 1, got ", options_.staleBound);
    StalenessEngine::Options so;
    so.mode = options_.staleness == StalenessMode::kAsp ? StalenessEngine::Mode::kAsp : StalenessEngine::Mode::kSsp;
    so.bound = options_.staleBound;
    so.policy = options_.stalePolicy;
    so.alpha = options_.emaAlpha;
    so.stepMs = options_.stepMs;
    so.maxPending = options_.maxPending;
    so.timeout = options_.timeout;  // bounds the SSP gate and the step_ms=auto agreement (docs/staleness.md)
    so.groupName = options_.groupName;
    stale_ = std::make_unique<StalenessEngine>(rank, size, so, injector_->schedule(), options_.store, stats_);
  }
}

DelayBackend::~DelayBackend() {
  // shutdown() did this already unless the group was never destroyed (interpreter exit): wake the host sleepers,
  // issue what is held back and join the issuer thread, so that no thread of this group outlives it.
  injector_->close();
}

c10::intrusive_ptr<c10d::Backend::Options> DelayBackend::getBackendOptions() {
  return c10::make_intrusive<c10d::Backend::Options>("delaycomm", options_.timeout);
}

c10::intrusive_ptr<c10d::Backend> DelayBackend::innerBackend(c10::DeviceType type) const {
  return type == c10::DeviceType::CUDA ? cudaInner_ : cpuInner_;
}

c10d::Backend& DelayBackend::innerFor(OpKind op, c10::Device device) {
  switch (device.type()) {
    case c10::DeviceType::CPU:
      TORCH_CHECK(!glooReleased_, "delaycomm: ", opName(op), ": group ", options_.groupName,
                  " was shut down (destroy_process_group): its Gloo backend is gone");
      TORCH_CHECK(cpuInner_, "Backend delaycomm does not support ", opName(op),
                  " on cpu tensors in this group: it has no Gloo backend");
      return *cpuInner_;
    case c10::DeviceType::CUDA:
      TORCH_CHECK(cudaInner_, "Backend delaycomm does not support ", opName(op),
                  " on cuda tensors in this group: it has no NCCL backend (torch without CUDA/NCCL, or no GPU)");
      return *cudaInner_;
    default:
      TORCH_CHECK(false, "Backend delaycomm does not support ", opName(op), " on ", device.type(),
                  " tensors (cpu tensors go to Gloo, cuda tensors to NCCL)");
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Collectives

c10::intrusive_ptr<c10d::Work> DelayBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  const auto device = checkTensors(OpKind::kBroadcast, "tensors", tensors);
  return run(
      OpKind::kBroadcast, device, bytesOf(tensors), tensors,
      [tensors, opts](c10d::Backend& b) mutable { return b.broadcast(tensors, opts); }, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> DelayBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  const bool cpuSparse = !tensors.empty() && tensors[0].is_sparse() && tensors[0].is_cpu();
  const auto device = checkTensors(OpKind::kAllreduce, "tensors", tensors, cpuSparse);
  if (staleCandidate(OpKind::kAllreduce)) {
    const auto decision = recognize(OpKind::kAllreduce, tensors, opts.reduceOp);
    if (decision.gradient()) {
      const uint64_t key = stale_->keyOfScope(decision.stream, tensors[0], /*scatter=*/false);
      return runStale(tensors[0], key, opts.reduceOp == c10d::ReduceOp::AVG, opts);
    }
  }
  return run(
      OpKind::kAllreduce, device, bytesOf(tensors), tensors,
      [tensors, opts](c10d::Backend& b) mutable { return b.allreduce(tensors, opts); }, opts.asyncOp);
}

// Whether staleness can take reductions of kind `op` at all: it is on, the delay schedule is active and the op
// is among delay_ops (delay_ops=broadcast leaves all-reduces as under bsp).
bool DelayBackend::staleCandidate(OpKind op) const {
  const DelaySchedule* schedule = injector_->schedule();
  return stale_ && schedule && schedule->active() && injector_->delays(op);
}

// A reduction the engine can blend: a SUM/AVG of one dense floating tensor outside a coalescing window, or for
// _reduce_scatter_base also a PREMUL_SUM by a number (docs/staleness.md, "Which reductions go stale").
bool DelayBackend::staleShaped(OpKind op, const std::vector<at::Tensor>& tensors,
                               const c10d::ReduceOp& reduceOp) const {
  if (tensors.size() != 1 || coalescing_) {
    return false;
  }
  const auto& t = tensors[0];
  const auto kind = reduceOp.op_;
  // PREMUL_SUM(f) is a SUM scaled by f (FSDP2 with a gradient divide factor): reduce-scatter only.
  const bool premul = op == OpKind::kReduceScatterBase && premulSumFactor(reduceOp).has_value();
  return !t.is_sparse() && at::isFloatingType(t.scalar_type()) &&
         (kind == c10d::ReduceOp::SUM || kind == c10d::ReduceOp::AVG || premul);
}

// Whether a reduction staleness could take is a data-parallel gradient reduction (stale/Recognition.hpp). One
// that is not is kept fresh: counted, and warned about once per reason and group.
GradientRecognizer::Decision DelayBackend::recognize(OpKind op, const std::vector<at::Tensor>& tensors,
                                                     const c10d::ReduceOp& reduceOp) {
  const bool scatter = op == OpKind::kReduceScatterBase;
  auto decision =
      recognizer_.classify(tensors.empty() ? at::Tensor() : tensors[0], staleShaped(op, tensors, reduceOp), scatter);
  if (decision.gradient()) {
    return decision;
  }
  stats_->op(op).keptFreshCalls.fetch_add(1, std::memory_order_relaxed);
  auto& warned = freshWarned_[static_cast<size_t>(decision.reason)];
  if (!warned.exchange(true) && stale_->onWarn) {
    std::ostringstream msg;
    msg << "delaycomm: staleness on group '" << options_.groupName << "': " << opName(op);
    if (!tensors.empty() && tensors[0].defined()) {
      msg << " of " << tensors[0].numel() << " x " << tensors[0].scalar_type();
    }
    msg << " kept fresh (delayed as under bsp, never stale): " << GradientRecognizer::explain(decision.reason);
    if (!decision.node.empty()) {
      msg << " ('" << decision.node << "')";
    }
    msg << ". Reductions kept fresh are counted in delaycomm.stats()['ops']['" << opName(op)
        << "']['kept_fresh_calls']; this is not warned again for this reason (docs/staleness.md, \"Which "
           "reductions go stale\")";
    stale_->onWarn(msg.str());
  }
  return decision;
}

c10::intrusive_ptr<c10d::Work> DelayBackend::runStale(at::Tensor& tensor, uint64_t key, bool average,
                                                      const c10d::AllreduceOptions& opts) {
  const auto info = stale_->prepare(tensor, key, average);
  countStale(OpKind::kAllreduce, info);
  c10d::AllreduceOptions sumOpts = opts;
  sumOpts.reduceOp = c10d::ReduceOp::SUM;  // AVG was folded into the pre-scaling
  std::vector<at::Tensor> tensors{tensor};
  // A step that cannot defer (before step_ms is known, a key's first step) keeps the op's delay, as under bsp.
  return run(
      OpKind::kAllreduce, tensor.device(), bytesOf(tensors), tensors,
      [tensors, sumOpts](c10d::Backend& b) mutable { return b.allreduce(tensors, sumOpts); }, opts.asyncOp,
      /*applyDelay=*/!info.deferrable);
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

c10::intrusive_ptr<c10d::Work> DelayBackend::runStaleReduceScatter(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::ReduceScatterOptions& opts,
                                                                   uint64_t key) {
  const int64_t n = getSize();
  TORCH_CHECK_VALUE(input.numel() == output.numel() * n,
                    "delaycomm: _reduce_scatter_base: inputBuffer must hold "
                    "outputBuffer's elements times the group size (",
                    output.numel(), " x ", n, " = ", output.numel() * n, "), got ", input.numel());
  TORCH_CHECK_VALUE(input.scalar_type() == output.scalar_type(),
                    "delaycomm: _reduce_scatter_base: inputBuffer and "
                    "outputBuffer must have one dtype, got ",
                    input.scalar_type(), " and ", output.scalar_type());
  const auto kind = opts.reduceOp.op_;
  const double scale = kind == c10d::ReduceOp::AVG          ? 1.0 / static_cast<double>(n)
                       : kind == c10d::ReduceOp::PREMUL_SUM ? *premulSumFactor(opts.reduceOp)
                                                            : 1.0;
  // NOTE: the blend rewrites the input in place, as the stale all-reduce rewrites its tensor: FSDP2 discards its
  // reduce-scatter input afterwards (README, "Bounded staleness").
  const auto info = stale_->prepareScaled(input, key, scale, /*scatter=*/true);
  countStale(OpKind::kReduceScatterBase, info);
  c10d::ReduceScatterOptions sumOpts = opts;
  sumOpts.reduceOp = c10d::ReduceOp::SUM;  // AVG and PREMUL_SUM were folded into the pre-scaling
  return run(
      OpKind::kReduceScatterBase, input.device(), bytesOf(input), {output},
      [output, input, sumOpts](c10d::Backend& b) mutable { return b._reduce_scatter_base(output, input, sumOpts); },
      opts.asyncOp, /*applyDelay=*/!info.deferrable);
}

c10::intrusive_ptr<c10d::Work> DelayBackend::staleAllreduce(at::Tensor& tensor, uint64_t key, bool average) {
  std::vector<at::Tensor> tensors{tensor};
  checkTensors(OpKind::kAllreduce, "tensor", tensors);
  TORCH_CHECK_VALUE(key < StalenessEngine::kIdentityKeyBase, "delaycomm: stale_allreduce: key must be < 2^40, got ",
                    key);
  c10d::AllreduceOptions opts;
  opts.reduceOp = average ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
  if (!staleCandidate(OpKind::kAllreduce) || !staleShaped(OpKind::kAllreduce, tensors, opts.reduceOp)) {
    if (average && tensor.is_cpu()) {  // Gloo has no AVG: SUM, then divide (as DDP does)
      tensor.div_(getSize());
      opts.reduceOp = c10d::ReduceOp::SUM;
    }
    return run(OpKind::kAllreduce, tensor.device(), bytesOf(tensors), tensors,
               [tensors, opts](c10d::Backend& b) mutable { return b.allreduce(tensors, opts); });
  }
  return runStale(tensor, key, average, opts);
}

std::vector<std::pair<uint64_t, at::Tensor>> DelayBackend::flush() {
  std::vector<std::pair<uint64_t, at::Tensor>> out;
  if (!stale_) {
    return out;
  }
  for (auto& [key, local] : stale_->takeFlush()) {
    if (stale_->scatters(key)) {
      // A reduce-scatter stream: one SUM reduce-scatter delivers this rank's shard of everything pending (what
      // the stream's next steps would have delivered to it), with the bytes of the stream's own reduce-scatter.
      at::Tensor shard = at::empty({local.numel() / getSize()}, local.options());
      auto work = run(
          OpKind::kReduceScatterBase, local.device(), bytesOf(local), {shard},
          [shard, local](c10d::Backend& b) mutable {
            c10d::ReduceScatterOptions sumOpts;
            return b._reduce_scatter_base(shard, local, sumOpts);
          },
          true, /*applyDelay=*/false);
      work->wait(options_.timeout);
      out.emplace_back(key, shard);
      continue;
    }
    std::vector<at::Tensor> tensors{local};
    c10d::AllreduceOptions opts;
    auto work = run(
        OpKind::kAllreduce, local.device(), bytesOf(tensors), tensors,
        [tensors, opts](c10d::Backend& b) mutable { return b.allreduce(tensors, opts); }, true,
        /*applyDelay=*/false);
    work->wait(options_.timeout);
    out.emplace_back(key, local);
  }
  return out;
}

c10::intrusive_ptr<c10d::Work> DelayBackend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts) {
  const bool cpuSparse = !tensors.empty() && tensors[0].is_cpu();
  const auto device = checkTensors(OpKind::kAllreduce, "tensors", tensors, cpuSparse);
  return run(
      OpKind::kAllreduce, device, bytesOf(tensors), tensors,
      [tensors, opts](c10d::Backend& b) mutable { return b.allreduce_sparse(tensors, opts); }, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> DelayBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                 const c10d::AllreduceCoalescedOptions& opts) {
  const auto device = checkTensors(OpKind::kAllreduceCoalesced, "tensors", tensors);
  return run(
      OpKind::kAllreduceCoalesced, device, bytesOf(tensors), tensors,
      [tensors, opts](c10d::Backend& b) mutable { return b.allreduce_coalesced(tensors, opts); }, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> DelayBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  const auto device = checkTensors(OpKind::kReduce, "tensors", tensors);
  return run(
      OpKind::kReduce, device, bytesOf(tensors), tensors,
      [tensors, opts](c10d::Backend& b) mutable { return b.reduce(tensors, opts); }, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> DelayBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllgatherOptions& opts) {
  const auto device = checkTensors(OpKind::kAllgather, "inputTensors", inputs);
  checkTensors(OpKind::kAllgather, "outputTensors", flatten(outputs));
  return run(
      OpKind::kAllgather, device, bytesOf(inputs), flatten(outputs),
      [outputs, inputs, opts](c10d::Backend& b) mutable { return b.allgather(outputs, inputs, opts); }, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> DelayBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions& opts) {
  const auto device = checkTensor(OpKind::kAllgatherBase, "inputBuffer", input);
  checkTensor(OpKind::kAllgatherBase, "outputBuffer", output);
  return run(
      OpKind::kAllgatherBase, device, bytesOf(input), {output},
      [output, input, opts](c10d::Backend& b) mutable { return b._allgather_base(output, input, opts); }, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> DelayBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) {
  const OpKind op = OpKind::kAllgatherCoalesced;
  const auto device = checkTensors(op, "inputTensors", inputs);
  // One output list per rank, each holding one tensor like each input.
  TORCH_CHECK_VALUE(outputs.size() == static_cast<size_t>(getSize()), "delaycomm: ", opName(op),
                    ": outputTensorLists must hold one list per rank (", getSize(), "), got ", outputs.size());
  for (size_t r = 0; r < outputs.size(); ++r) {
    TORCH_CHECK_VALUE(outputs[r].size() == inputs.size(), "delaycomm: ", opName(op), ": outputTensorLists[", r,
                      "] must hold one tensor per input (", inputs.size(), "), got ", outputs[r].size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      checkMatches(op, c10::str("outputTensorLists[", r, "][", i, "]"), outputs[r][i],
                   c10::str("inputTensors[", i, "]").c_str(), inputs[i]);
    }
  }
  auto flat = flatten(outputs);
  checkTensors(op, "outputTensorLists", flat);
  return run(
      op, device, bytesOf(inputs), flat,
      [outputs, inputs, opts](c10d::Backend& b) mutable { return b.allgather_coalesced(outputs, inputs, opts); },
      opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> DelayBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const c10d::AllgatherOptions& opts) {
  const auto device = checkTensors(OpKind::kAllgatherIntoTensorCoalesced, "inputs", inputs);
  checkTensors(OpKind::kAllgatherIntoTensorCoalesced, "outputs", outputs);
  return run(
      OpKind::kAllgatherIntoTensorCoalesced, device, bytesOf(inputs), outputs,
      [outputs, inputs, opts](c10d::Backend& b) mutable {
        return b.allgather_into_tensor_coalesced(outputs, inputs, opts);
      },
      opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> DelayBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  const OpKind op = OpKind::kGather;
  const auto device = checkTensors(op, "inputTensors", inputs);
  checkSingle(op, "inputTensors", inputs);
  checkRootLists(op, "outputTensors", outputs, getRank(), getSize(), opts.rootRank, "inputTensors[0]", inputs[0]);
  auto flat = flatten(outputs);
  if (!flat.empty()) {
    checkTensors(op, "outputTensors", flat);
  }
  return run(
      op, device, bytesOf(inputs), flat,
      [outputs, inputs, opts](c10d::Backend& b) mutable { return b.gather(outputs, inputs, opts); }, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> DelayBackend::scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const c10d::ScatterOptions& opts) {
  const OpKind op = OpKind::kScatter;
  const auto device = checkTensors(op, "outputTensors", outputs);
  checkSingle(op, "outputTensors", outputs);
  checkRootLists(op, "inputTensors", inputs, getRank(), getSize(), opts.rootRank, "outputTensors[0]", outputs[0]);
  const auto flat = flatten(inputs);
  if (!flat.empty()) {
    checkTensors(op, "inputTensors", flat);
  }
  return run(
      op, device, bytesOf(outputs), outputs,
      [outputs, inputs, opts](c10d::Backend& b) mutable { return b.scatter(outputs, inputs, opts); }, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> DelayBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const c10d::ReduceScatterOptions& opts) {
  const OpKind op = OpKind::kReduceScatter;
  const auto device = checkTensors(op, "outputTensors", outputs);
  // One input list per output, each holding one tensor per rank like its output.
  TORCH_CHECK_VALUE(inputs.size() == outputs.size(), "delaycomm: ", opName(op),
                    ": inputTensors must hold one list per output tensor (", outputs.size(), "), got ", inputs.size());
  for (size_t o = 0; o < inputs.size(); ++o) {
    TORCH_CHECK_VALUE(inputs[o].size() == static_cast<size_t>(getSize()), "delaycomm: ", opName(op), ": inputTensors[",
                      o, "] must hold one tensor per rank (", getSize(), "), got ", inputs[o].size());
    const auto ref = c10::str("outputTensors[", o, "]");
    for (size_t r = 0; r < inputs[o].size(); ++r) {
      checkMatches(op, c10::str("inputTensors[", o, "][", r, "]"), inputs[o][r], ref.c_str(), outputs[o]);
    }
  }
  const auto flat = flatten(inputs);
  checkTensors(op, "inputTensors", flat);
  return run(
      op, device, bytesOf(flat), outputs,
      [outputs, inputs, opts](c10d::Backend& b) mutable { return b.reduce_scatter(outputs, inputs, opts); },
      opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> DelayBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::ReduceScatterOptions& opts) {
  const auto device = checkTensor(OpKind::kReduceScatterBase, "inputBuffer", input);
  checkTensor(OpKind::kReduceScatterBase, "outputBuffer", output);
  if (staleCandidate(OpKind::kReduceScatterBase)) {
    const std::vector<at::Tensor> inputs{input};
    const auto decision = recognize(OpKind::kReduceScatterBase, inputs, opts.reduceOp);
    if (decision.gradient()) {
      return runStaleReduceScatter(output, input, opts, stale_->keyOfScope(decision.stream, input, /*scatter=*/true));
    }
  }
  return run(
      OpKind::kReduceScatterBase, device, bytesOf(input), {output},
      [output, input, opts](c10d::Backend& b) mutable { return b._reduce_scatter_base(output, input, opts); },
      opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> DelayBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const c10d::ReduceScatterOptions& opts) {
  const auto device = checkTensors(OpKind::kReduceScatterTensorCoalesced, "inputs", inputs);
  checkTensors(OpKind::kReduceScatterTensorCoalesced, "outputs", outputs);
  return run(
      OpKind::kReduceScatterTensorCoalesced, device, bytesOf(inputs), outputs,
      [outputs, inputs, opts](c10d::Backend& b) mutable {
        return b.reduce_scatter_tensor_coalesced(outputs, inputs, opts);
      },
      opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> DelayBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& outputSplitSizes,
                                                           std::vector<int64_t>& inputSplitSizes,
                                                           const c10d::AllToAllOptions& opts) {
  const auto device = checkTensor(OpKind::kAlltoallBase, "inputBuffer", input);
  checkTensor(OpKind::kAlltoallBase, "outputBuffer", output);
  return run(
      OpKind::kAlltoallBase, device, bytesOf(input), {output},
      [output, input, outputSplitSizes, inputSplitSizes, opts](c10d::Backend& b) mutable {
        return b.alltoall_base(output, input, outputSplitSizes, inputSplitSizes, opts);
      },
      opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> DelayBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                      const c10d::AllToAllOptions& opts) {
  const auto device = checkTensors(OpKind::kAlltoall, "inputTensors", inputs);
  checkTensors(OpKind::kAlltoall, "outputTensors", outputs);
  return run(
      OpKind::kAlltoall, device, bytesOf(inputs), outputs,
      [outputs, inputs, opts](c10d::Backend& b) mutable { return b.alltoall(outputs, inputs, opts); }, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> DelayBackend::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  const auto device = checkTensors(OpKind::kSend, "tensors", tensors);
  return run(OpKind::kSend, device, bytesOf(tensors), tensors,
             [tensors, dstRank, tag](c10d::Backend& b) mutable { return b.send(tensors, dstRank, tag); });
}

c10::intrusive_ptr<c10d::Work> DelayBackend::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  const auto device = checkTensors(OpKind::kRecv, "tensors", tensors);
  return run(OpKind::kRecv, device, bytesOf(tensors), tensors,
             [tensors, srcRank, tag](c10d::Backend& b) mutable { return b.recv(tensors, srcRank, tag); });
}

c10::intrusive_ptr<c10d::Work> DelayBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const auto device = checkTensors(OpKind::kRecvAnysource, "tensors", tensors);
  return run(OpKind::kRecvAnysource, device, bytesOf(tensors), tensors,
             [tensors, tag](c10d::Backend& b) mutable { return b.recvAnysource(tensors, tag); });
}

c10::intrusive_ptr<c10d::Work> DelayBackend::barrier(const c10d::BarrierOptions& opts) {
  // Routed by opts.device (c10d sets it from the group's bound device or the current device); CPU otherwise.
  c10::Device device(c10::DeviceType::CPU);
  if (opts.device.has_value() && opts.device->is_cuda() && cudaInner_) {
    device = *opts.device;
  } else if (!cpuInner_ && cudaInner_) {
    device = opts.device.has_value() ? *opts.device : c10::Device(c10::DeviceType::CUDA, 0);
  }
  return run(OpKind::kBarrier, device, 0, {}, [opts](c10d::Backend& b) { return b.barrier(opts); }, opts.asyncOp);
}

void DelayBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  TORCH_CHECK(cpuInner_, "Backend delaycomm does not support monitoredBarrier in a group without Gloo");
  stats_->op(OpKind::kBarrier).calls.fetch_add(1, std::memory_order_relaxed);
  const auto t0 = Clock::now();
  cpuInner_->monitoredBarrier(opts, waitAllRanks);
  stats_->op(OpKind::kBarrier)
      .latencyNs.record(
          static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count()));
}

// ---------------------------------------------------------------------------------------------------------------
// Coalescing, sequence numbers, lifecycle

void DelayBackend::startCoalescing() {
  TORCH_CHECK(!coalescing_,
              "delaycomm: startCoalescing: a coalescing window is already open (nested windows are "
              "not supported, as in c10d)");
  coalescing_ = true;
  coalescedWorks_.clear();
  coalescingInners_.clear();
}

c10::intrusive_ptr<c10d::Work> DelayBackend::endCoalescing() {
  TORCH_CHECK(coalescing_, "delaycomm: endCoalescing: no coalescing window is open (call startCoalescing first)");
  coalescing_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> works = std::move(coalescedWorks_);
  coalescedWorks_.clear();
  for (auto* inner : coalescingInners_) {
    if (auto w = inner->endCoalescing()) {
      works.push_back(std::move(w));
    }
  }
  coalescingInners_.clear();
  return c10::make_intrusive<CoalescedWork>(std::move(works));
}

void DelayBackend::setSequenceNumberForGroup() {
  seq_.store(0);
}

uint64_t DelayBackend::getSequenceNumberForGroup() {
  return seq_.load();
}

void DelayBackend::abort() {
  injector_->abort();  // host sleepers raise, held-back ops fail (none is issued)
  if (cpuInner_) {
    cpuInner_->abort();
  }
  if (cudaInner_) {
    cudaInner_->abort();
  }
}

void DelayBackend::setShutdownHook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(hookMutex_);
  shutdownHook_ = std::move(hook);
}

void DelayBackend::shutdown() {
  std::function<void()> hook;
  {
    std::lock_guard<std::mutex> lock(hookMutex_);
    hook = std::move(shutdownHook_);
    shutdownHook_ = nullptr;
  }
  if (hook) {
    try {
      hook();
    } catch (const std::exception& e) {
      LOG(WARNING) << "delaycomm: the shutdown hook of group " << options_.groupName << " failed: " << e.what();
    }
  }
  if (stale_) {
    const int64_t pending = stale_->pendingHere();
    if (pending > 0) {
      LOG(WARNING) << "delaycomm: group " << options_.groupName << " is destroyed with " << pending
                   << " stale contribution(s) of this rank still pending: they are not applied. Call "
                   << "delaycomm.flush(group) before destroy_process_group to deliver them.";
    }
  }
  // Never wait out a delay: callers sleeping in a host delay or slowdown wake and raise (their ops are not issued);
  // the ops the issuer holds back are issued now, in order (every rank issues the same sequence), and the issuer
  // thread is joined before the inner backends shut down.
  injector_->close();
  if (cpuInner_) {
    cpuInner_->shutdown();
  }
  if (cudaInner_) {
    cudaInner_->shutdown();
  }
  releaseGloo();
}

void DelayBackend::releaseGloo() {
  // NOTE: Gloo has no shutdown(): its worker threads stop in its destructor, whenever its last reference goes. For
  // a group held in a reference cycle (a DDP module) that is at interpreter exit, and a worker still releasing a
  // finished op's Python-owned tensors then takes the GIL during finalization: Python ends that thread and the
  // process aborts ("terminate called without an active exception"). This backend holds the only reference (the
  // creator's goes when it returns), so releasing it here stops and joins Gloo's workers now, at
  // destroy_process_group, with the GIL released: a worker may need it to finish.
  c10::intrusive_ptr<c10d::Backend> gloo = std::move(cpuInner_);
  if (!gloo) {
    return;
  }
  glooReleased_ = true;
  if (Py_IsInitialized() && PyGILState_Check()) {
    PyThreadState* state = PyEval_SaveThread();
    gloo.reset();
    PyEval_RestoreThread(state);
  } else {
    gloo.reset();
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Telemetry

void DelayBackend::resetStats() {
  harvestCudaTimings();
  stats_->reset();
}

}  // namespace delaycomm
