#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "ops/OpTable.hpp"

namespace delaycomm {

// Argument checks of DelayBackend's ops (backend/DelayBackend.cpp), run before anything is counted or issued.
// Every failure is a ValueError in c10d's manner, naming the method (the op), the argument, what was expected and
// what came: "delaycomm: <op>: <argument> must ..., got ...".

// Bytes moved by a call (a sparse tensor counts its values).
int64_t bytesOf(const at::Tensor& t);
int64_t bytesOf(const std::vector<at::Tensor>& ts);
// `tensors` are usable by an inner backend (at least one; defined; one device type; dense and contiguous, or
// sparse where allowed); returns their device.
c10::Device checkTensors(OpKind op, const char* arg, const std::vector<at::Tensor>& tensors, bool allowSparse = false);
c10::Device checkTensor(OpKind op, const char* arg, const at::Tensor& t);
// `t` (named `arg`) has the dtype, sizes and device type of `ref` (named `refArg`): the two sides of a collective
// whose tensors must match one for one.
void checkMatches(OpKind op, const std::string& arg, const at::Tensor& t, const char* refArg, const at::Tensor& ref);
// The one-tensor side of gather/scatter: exactly one tensor.
void checkSingle(OpKind op, const char* arg, const std::vector<at::Tensor>& tensors);
// The root's side of gather (outputs) or scatter (inputs): one list of `size` tensors, each like `single`; empty on
// every other rank; `root` a rank of the group.
void checkRootLists(OpKind op, const char* arg, const std::vector<std::vector<at::Tensor>>& lists, int rank, int size,
                    int64_t root, const char* singleArg, const at::Tensor& single);
std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists);

}  // namespace delaycomm
