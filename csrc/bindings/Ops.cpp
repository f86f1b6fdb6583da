// The op table (ops/OpTable.hpp): the one list of ops, read by delaycomm._ops.

#include <stdexcept>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "bindings/Bindings.hpp"
#include "delay/Text.hpp"
#include "ops/OpTable.hpp"

namespace delaycomm::bindings {

OpKind opArgument(const std::string& op, const char* method) {
  OpKind kind{};
  if (!opFromName(op, &kind)) {
    throw std::invalid_argument(std::string("delaycomm: ") + method + ": unknown op " + delaycomm::quoted(op));
  }
  return kind;
}

CallSize callSizeArgument(const std::optional<std::string>& op, int64_t nbytes, const char* method) {
  CallSize at;  // a profile's (op, size class); other families ignore it
  if (op) {
    at.op = static_cast<int>(opArgument(*op, method));
  }
  at.bytes = nbytes;
  return at;
}

void bindOps(py::module_& m) {
  {
    py::enum_<OpKind> kinds(m, "OpKind", "The ops of the native op table, named as in telemetry.");
    for (const auto& row : opTable()) {
      kinds.value(row.name, row.kind);
    }
  }
  py::class_<OpInfo>(m, "OpInfo", "One row of the native op table (csrc/ops/OpTable.hpp).")
      .def_property_readonly("kind", [](const OpInfo& o) { return o.kind; })
      .def_property_readonly("name", [](const OpInfo& o) { return std::string(o.name); })
      .def_property_readonly("reduces", [](const OpInfo& o) { return o.reduces; })
      .def_property_readonly("delayable", [](const OpInfo& o) { return o.delayable; })
      .def_property_readonly("aliases",
                             [](const OpInfo& o) {
                               std::vector<std::string> names;
                               for (const char* a : o.aliases) {
                                 if (a)
                                   names.emplace_back(a);
                               }
                               return py::tuple(py::cast(names));
                             })
      .def("__repr__", [](const OpInfo& o) { return std::string("<delaycomm op ") + o.name + ">"; });
  m.def(
      "op_table",
      [] {
        py::tuple rows(kNumOpKinds);
        for (int i = 0; i < kNumOpKinds; ++i) {
          rows[i] = py::cast(&opTable()[i], py::return_value_policy::reference);
        }
        return rows;
      },
      "Every op the backend forwards, in OpKind order (names, aliases, which reduce, which delay_ops may name).");
}

}  // namespace delaycomm::bindings
