#include "backend/Arguments.hpp"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

namespace delaycomm {

int64_t bytesOf(const at::Tensor& t) {
  if (t.is_sparse()) {
    return t._values().numel() * t.element_size();
  }
  return t.numel() * t.element_size();
}

int64_t bytesOf(const std::vector<at::Tensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts) {
    n += bytesOf(t);
  }
  return n;
}

// Checks that `tensors` are usable by an inner backend and returns their device. Messages follow c10d:
// "delaycomm: <op>: <argument> <what was expected>, got <what came>".
c10::Device checkTensors(OpKind op, const char* arg, const std::vector<at::Tensor>& tensors, bool allowSparse) {
  TORCH_CHECK_VALUE(!tensors.empty(), "delaycomm: ", opName(op), ": ", arg, " must hold at least one tensor");
  const c10::Device device = tensors[0].device();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    TORCH_CHECK_VALUE(t.defined(), "delaycomm: ", opName(op), ": ", arg, "[", i, "] is an undefined tensor");
    TORCH_CHECK_VALUE(t.device().type() == device.type(), "delaycomm: ", opName(op), ": ", arg,
                      " must all be on one device type, got ", device, " and ", t.device(), " (", arg, "[", i, "])");
    if (t.is_sparse()) {
      TORCH_CHECK_VALUE(allowSparse, "delaycomm: ", opName(op), ": ", arg, "[", i,
                        "] is sparse; only all_reduce of CPU tensors accepts sparse tensors");
    } else {
      TORCH_CHECK_VALUE(t.layout() == c10::kStrided, "delaycomm: ", opName(op), ": ", arg, "[", i,
                        "] must be a strided (dense) tensor, got layout ", t.layout());
      TORCH_CHECK_VALUE(t.is_contiguous(t.suggest_memory_format()), "delaycomm: ", opName(op), ": ", arg, "[", i,
                        "] must be contiguous, got sizes ", t.sizes(), " and strides ", t.strides());
    }
  }
  return device;
}

c10::Device checkTensor(OpKind op, const char* arg, const at::Tensor& t) {
  return checkTensors(op, arg, std::vector<at::Tensor>{t});
}

// Checks that `t` (named `arg`) has the dtype, sizes and device type of `ref` (named `refArg`): the two sides of a
// collective whose tensors must match one for one.
void checkMatches(OpKind op, const std::string& arg, const at::Tensor& t, const char* refArg, const at::Tensor& ref) {
  TORCH_CHECK_VALUE(
      t.scalar_type() == ref.scalar_type() && t.sizes() == ref.sizes() && t.device().type() == ref.device().type(),
      "delaycomm: ", opName(op), ": ", arg, " must have the dtype, sizes and device type of ", refArg, " (",
      ref.scalar_type(), " ", ref.sizes(), " on ", ref.device().type(), "), got ", t.scalar_type(), " ", t.sizes(),
      " on ", t.device().type());
}

// The one-tensor side of gather/scatter: exactly one tensor.
void checkSingle(OpKind op, const char* arg, const std::vector<at::Tensor>& tensors) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "delaycomm: ", opName(op), ": ", arg, " must hold exactly one tensor, got ",
                    tensors.size());
}

// The root's side of gather (outputs) or scatter (inputs): one list of `size` tensors, each like `single`;
// empty on every other rank.
void checkRootLists(OpKind op, const char* arg, const std::vector<std::vector<at::Tensor>>& lists, int rank, int size,
                    int64_t root, const char* singleArg, const at::Tensor& single) {
  TORCH_CHECK_VALUE(root >= 0 && root < size, "delaycomm: ", opName(op),
                    ": the root must be a rank of the group, in [0, ", size, "), got ", root);
  if (rank != root) {
    TORCH_CHECK_VALUE(lists.empty(), "delaycomm: ", opName(op), ": ", arg,
                      " must be empty on a rank other than the root (", root, "), got ", lists.size(),
                      " list(s) on rank ", rank);
    return;
  }
  TORCH_CHECK_VALUE(lists.size() == 1, "delaycomm: ", opName(op), ": ", arg,
                    " must hold exactly one list of tensors on the root, got ", lists.size());
  TORCH_CHECK_VALUE(lists[0].size() == static_cast<size_t>(size), "delaycomm: ", opName(op), ": ", arg,
                    "[0] must hold one tensor per rank (", size, ") on the root, got ", lists[0].size());
  for (size_t i = 0; i < lists[0].size(); ++i) {
    checkMatches(op, c10::str(arg, "[0][", i, "]"), lists[0][i], singleArg, single);
  }
}

std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> out;
  for (const auto& l : lists) {
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

}  // namespace delaycomm
