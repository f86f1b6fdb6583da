#include "backend/DelayBackend.hpp"

#include "backend/Arguments.hpp"

#include <algorithm>
#include <optional>

#include <ATen/ops/empty.h>
#include <Python.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

namespace delaycomm {

DelayBackend::DelayBackend(int rank, int size, c10::intrusive_ptr<c10d::Backend> cpuInner,
                           c10::intrusive_ptr<c10d::Backend> cudaInner, BackendOptions options)
    : c10d::Backend(rank, size),
      cpuInner_(std::move(cpuInner)),
      cudaInner_(std::move(cudaInner)),
      options_(std::move(options)),
      stats_(std::make_shared<GroupStats>()) {
  TORCH_CHECK_VALUE(cpuInner_ || cudaInner_, "delaycomm: DelayBackend needs at least one inner backend");
  DelayOptions delay = options_.delay;
  delay.size = size;
  delay.timeout = options_.timeout;  // bounds every wait of the injector (docs/delay.md, "Timeouts and teardown")
  delay.groupName = options_.groupName;
  injector_ = std::make_unique<DelayInjector>(rank, std::move(delay), static_cast<bool>(cpuInner_), stats_);
  fastPath_ = !injector_->engaged();
  if (options_.stale.mode != StalenessMode::kBsp) {
    TORCH_INTERNAL_ASSERT(options_.store, "delaycomm: DelayBackend: staleness needs the group's store");
    StalenessOptions stale = options_.stale;
    stale.timeout = options_.timeout;  // bounds the SSP gate and the ranks' agreement (docs/staleness.md)
    stale.groupName = options_.groupName;
    stale_ =
        std::make_unique<StalenessEngine>(rank, size, std::move(stale), injector_->schedule(), options_.store, stats_);
    staleRouter_ = std::make_unique<StaleRouter>(*stale_, *injector_, size);
  }
}

DelayBackend::~DelayBackend() {
  // shutdown() did this already unless the group was never destroyed (interpreter exit): wake the host sleepers,
  // issue what is held back and join the issuer thread, so that no thread of this group outlives it.
  injector_->close();
}

c10::intrusive_ptr<c10d::Backend::Options> DelayBackend::getBackendOptions() {
  return c10::make_intrusive<c10d::Backend::Options>("delaycomm", injector_->timeout());
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
  if (staleRouter_) {
    const StaleRoute route = staleRouter_->classify(OpKind::kAllreduce, tensors, opts.reduceOp, coalescing_);
    if (route.stale) {
      return runStaleAllreduce(route, tensors[0], opts);
    }
    if (route.keptFresh) {
      keptFresh(OpKind::kAllreduce, tensors, route);
    }
  }
  return run(
      OpKind::kAllreduce, device, bytesOf(tensors), tensors,
      [tensors, opts](c10d::Backend& b) mutable { return b.allreduce(tensors, opts); }, opts.asyncOp);
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
  if (staleRouter_) {
    checkStaleReduceScatter(output, input);
    const StaleRoute route = staleRouter_->classify(OpKind::kReduceScatterBase, {input}, opts.reduceOp, coalescing_);
    if (route.stale) {
      return runStaleReduceScatter(route, output, input, opts);
    }
    if (route.keptFresh) {
      keptFresh(OpKind::kReduceScatterBase, {input}, route);
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
  stats_->recordCall(OpKind::kBarrier, CallTiming{0, t0});
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
  if (stale_) {
    stale_->close();  // a caller waiting at the SSP gate raises
  }
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
  // Never wait out a delay: callers sleeping in a host delay, a slowdown or at the SSP gate wake and raise (their ops
  // are not issued);
  // the ops the issuer holds back are issued now, in order (every rank issues the same sequence), and the issuer
  // thread is joined before the inner backends shut down.
  if (stale_) {
    stale_->close();
  }
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

GroupTelemetry DelayBackend::telemetry() {
  harvestCudaTimings();
  GroupTelemetry t = stats_->telemetry();
  if (stale_) {
    stale_->telemetry(t.staleness);
  }
  return t;
}

// ---------------------------------------------------------------------------------------------------------------
// Staleness

std::pair<int64_t, int64_t> DelayBackend::stalePending() const {
  return stale_ ? std::make_pair(stale_->pendingHere(), stale_->pendingGlobal())
                : std::make_pair(int64_t{0}, int64_t{0});
}

double DelayBackend::staleWindowedRatio() const {
  return stale_ ? stale_->windowedRatio() : 0.0;
}

void DelayBackend::setStaleWarningHook(std::function<void(const std::string&)> hook) {
  injector_->onWarn = hook;  // delay_mode=match's warnings (delay/DelayInjector.hpp)
  if (stale_) {
    stale_->onWarn = std::move(hook);
  }
}

}  // namespace delaycomm
