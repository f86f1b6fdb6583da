// The parsed delay spec (delay/Distribution.hpp), bound as delaycomm._C.DelaySpec, and the profile it may hold
// (delay/Profile.hpp): built by delaycomm/_spec.py from the spec's text and, for a file, the arrays Python read.

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings/Bindings.hpp"
#include "delay/DelaySpec.hpp"
#include "delay/Distribution.hpp"
#include "delay/Profile.hpp"
#include "delay/Sampler.hpp"
#include "delay/Text.hpp"

namespace delaycomm::bindings {

namespace {

using SpecHolder = std::shared_ptr<DelayDistribution>;
using ProfileHolder = std::shared_ptr<DelayProfile>;

// NOTE: the handles are immutable (only const methods are bound); pybind11 holds them without const.
SpecHolder held(std::shared_ptr<const DelayDistribution> d) {
  return std::const_pointer_cast<DelayDistribution>(std::move(d));
}

template <typename T>
std::vector<T> vectorOf(const py::array_t<T, py::array::c_style | py::array::forcecast>& a) {
  return std::vector<T>(a.data(), a.data() + a.size());
}

ProfileClass profileClass(const py::tuple& t) {
  if (t.size() != 8 && t.size() != 9) {
    throw std::invalid_argument(
        "delaycomm: DelayProfile: a class is (op, bytes, count, zeros, min_ns, max_ns, bucket indices, counts"
        "[, size_bytes])");
  }
  ProfileClass c;
  c.op = t[0].cast<OpKind>();
  c.bytes = t[1].cast<int64_t>();
  c.count = t[2].cast<uint64_t>();
  c.zeros = t[3].cast<uint64_t>();
  c.minNs = t[4].cast<double>();
  c.maxNs = t[5].cast<double>();
  c.bucketIndex = vectorOf<int>(t[6].cast<py::array_t<int, py::array::c_style | py::array::forcecast>>());
  c.bucketCount = vectorOf<uint64_t>(t[7].cast<py::array_t<uint64_t, py::array::c_style | py::array::forcecast>>());
  if (t.size() == 9 && !t[8].is_none()) {
    c.sizeBytes = t[8].cast<int64_t>();  // the size its latencies were measured at (docs/profile.md, size_bytes)
  }
  return c;
}

py::dict classDict(const ProfileClassInfo& c) {
  py::dict d;
  d["op"] = opName(c.op);
  d["bytes"] = c.bytes;
  d["count"] = c.count;
  d["zeros"] = c.zeros;
  d["min_ns"] = c.minNs;
  d["max_ns"] = c.maxNs;
  d["rare"] = c.rare;
  d["size_bytes"] = c.sizeBytes >= 0 ? py::object(py::int_(c.sizeBytes)) : py::object(py::none());
  return d;
}

void bindProfile(py::module_& m) {
  py::class_<DelayProfile, ProfileHolder>(
      m, "DelayProfile", "A latency profile's numbers (checked by delaycomm.profile): per (op, size class).")
      .def(py::init([](const std::vector<py::tuple>& classes) {
             std::vector<ProfileClass> cs;
             cs.reserve(classes.size());
             for (const auto& t : classes) {
               cs.push_back(profileClass(t));
             }
             return std::const_pointer_cast<DelayProfile>(DelayProfile::fromClasses(cs));
           }),
           py::arg("classes"),
           "classes: (op, bytes, count, zeros, min_ns, max_ns, bucket indices, bucket counts[, size_bytes or None]) "
           "per (op, size class).")
      .def(
          "quantile",
          [](const DelayProfile& p, double u, std::optional<std::string> op, int64_t nbytes) {
            const CallSize at = callSizeArgument(op, nbytes, "DelayProfile.quantile");
            return p.quantile(u, at.op, at.bytes);
          },
          py::arg("q"), py::arg("op") = py::none(), py::arg("nbytes") = -1)
      .def(
          "kind_fallback_of",
          [](const DelayProfile& p, const std::string& op, int64_t nbytes) {
            const CallSize at = callSizeArgument(op, nbytes, "DelayProfile.kind_fallback_of");
            return p.kindFallbackOf(at.op, at.bytes);
          },
          py::arg("op"), py::arg("nbytes"),
          "For an op the profile has: what a call of nbytes draws from when its size is far from the op's classes "
          "and the op's kind has a nearer class (docs/delay.md, \"Replay into another job\"); \"\" otherwise.")
      .def(
          "class_info",
          [](const DelayProfile& p) {
            py::list out;
            for (const auto& c : p.classInfo()) {
              out.append(classDict(c));
            }
            return out;
          },
          "Every (op, size class): op, bytes, count (its calls), zeros, min_ns, max_ns, rare (fewer than "
          "min_class_calls calls: drawn from the op's other classes), size_bytes (the size its latencies were "
          "measured at, or None: a call of that size draws the class exactly); in op-table order.")
      .def_property_readonly("digest", [](const DelayProfile& p) { return digestText(p.digest()); })
      .def_property_readonly("calls", &DelayProfile::calls)
      .def_readonly_static("min_class_calls", &DelayProfile::kMinClassCalls)
      .def_property_readonly("ops", &DelayProfile::ops)
      .def_property_readonly("classes", &DelayProfile::classes);
}

}  // namespace

std::shared_ptr<const DelayDistribution> specArgument(const py::handle& spec, const char* method) {
  if (py::isinstance<DelayDistribution>(spec)) {
    return spec.cast<SpecHolder>();
  }
  if (py::isinstance<py::str>(spec)) {
    // The one parser of a spec's text, which reads a file it names (delaycomm/_spec.py).
    return py::module_::import("delaycomm._spec").attr("parse")(spec).cast<SpecHolder>();
  }
  throw std::invalid_argument(std::string("delaycomm: ") + method +
                              ": spec must be a delay spec (a str or a delaycomm._C.DelaySpec), got " +
                              std::string(py::str(py::type::of(spec).attr("__name__"))));
}

py::object quantileOf(const DelayDistribution& d, py::object q, const std::optional<std::string>& op, int64_t nbytes,
                      const char* method) {
  const CallSize at = callSizeArgument(op, nbytes, method);
  return mapDoubles(
      std::move(q), [&d, at](double v) { return d.quantile(v, at); },
      [method](double v) {
        if (!(v >= 0.0 && v <= 1.0)) {
          throw std::invalid_argument(std::string("delaycomm: ") + method + ": q must be in [0, 1], got " +
                                      std::to_string(v));
        }
      });
}

py::object cdfOf(const DelayDistribution& d, py::object x, const char* method) {
  return mapDoubles(
      std::move(x), [&d](double v) { return d.cdf(v); },
      [method](double v) {
        if (std::isnan(v)) {
          throw std::invalid_argument(std::string("delaycomm: ") + method + ": x must be a number of seconds, got nan");
        }
      });
}

void bindSpec(py::module_& m) {
  bindProfile(m);
  py::class_<DelayDistribution, SpecHolder>(
      m, "DelaySpec",
      "A delay spec parsed once: its distribution solved, a trace's or a profile's data loaded, its content digest "
      "(immutable; built by delaycomm._spec.parse).")
      .def_static(
          "parse", [](const std::string& text) { return held(DelayDistribution::parse(text)); }, py::arg("text"),
          "A spec that names no file (none, const, exp, lognormal, pareto).")
      .def_static(
          "of_trace",
          [](const std::string& text, py::array_t<double, py::array::c_style | py::array::forcecast> latencies) {
            return held(DelayDistribution::ofTrace(parseDelaySpec(text), vectorOf<double>(latencies)));
          },
          py::arg("text"), py::arg("latencies"), "A trace:FILE spec with the file's latencies in seconds.")
      .def_static(
          "of_profile",
          [](const std::string& text, ProfileHolder profile) {
            return held(DelayDistribution::ofProfile(parseDelaySpec(text), std::move(profile)));
          },
          py::arg("text"), py::arg("profile"), "A profile:FILE spec with the file's profile.")
      .def(
          "quantile",
          [](const DelayDistribution& d, py::object q, std::optional<std::string> op, int64_t nbytes) {
            return quantileOf(d, std::move(q), op, nbytes, "DelaySpec.quantile");
          },
          py::arg("q"), py::arg("op") = py::none(), py::arg("nbytes") = -1,
          "The delay in seconds at quantile q (a float or an array); op, nbytes: the call, for a profile.")
      .def(
          "cdf", [](const DelayDistribution& d, py::object x) { return cdfOf(d, std::move(x), "DelaySpec.cdf"); },
          py::arg("x"))
      .def("mean", &DelayDistribution::mean)
      .def(
          "describe",
          [](const std::shared_ptr<DelayDistribution>& d) {
            py::dict out = samplerDict(describeSampler(DelaySampler(d)));
            out.attr("pop")("seed");
            out.attr("pop")("rank");
            return out;
          },
          "family, solved parameters, requested percentiles, percentiles, mean; a file's path and digest.")
      .def_property_readonly("text", [](const DelayDistribution& d) { return d.spec().text; })
      .def_property_readonly("family", [](const DelayDistribution& d) { return familyName(d.spec().family); })
      .def_property_readonly("path",
                             [](const DelayDistribution& d) -> py::object {
                               return d.spec().namesFile() ? py::object(py::str(d.spec().path)) : py::none();
                             })
      .def_property_readonly("digest",
                             [](const DelayDistribution& d) -> py::object {
                               return d.spec().namesFile() ? py::object(py::str(digestText(d.digest()))) : py::none();
                             })
      .def_property_readonly(
          "profile",
          [](const DelayDistribution& d) -> py::object {
            return d.profile() ? py::cast(std::const_pointer_cast<DelayProfile>(d.profile())) : py::none();
          },
          "profile:FILE: its DelayProfile (per-class calls: class_info()); None otherwise.")
      .def_property_readonly(
          "trace", [](const DelayDistribution& d) { return py::array_t<double>(d.trace().size(), d.trace().data()); },
          "trace:FILE: its latencies in seconds, sorted (a copy); empty otherwise.")
      .def_property_readonly("is_none", &DelayDistribution::isNone)
      .def("__repr__",
           [](const DelayDistribution& d) { return "DelaySpec(" + delaycomm::quoted(d.spec().text) + ")"; });

  m.def(
      "delay_spec_file",
      [](const std::string& text) -> py::object {
        const DelaySpec spec = parseDelaySpec(text);
        if (!spec.namesFile()) {
          return py::none();
        }
        return py::make_tuple(familyName(spec.family), spec.path);
      },
      py::arg("text"),
      "(family, path) when the spec names a file (trace:, profile:), else None; raises on a malformed spec.");
  m.def(
      "parse_durations",
      [](const std::vector<std::string>& lines) {
        std::vector<double> values;
        std::string why;
        int64_t bad = 0;
        {
          py::gil_scoped_release release;  // a trace may have millions of lines
          bad = parseDurations(lines, &values, &why);
        }
        return py::make_tuple(py::array_t<double>(values.size(), values.data()), bad, why);
      },
      py::arg("lines"),
      "The durations of trace lines in seconds: (array, -1, '') or (array, index of the first bad line, why).");
  m.def(
      "delay_spec_error",
      [](const std::string& text, const std::string& why) { return std::string(invalidDelaySpec(text, why).what()); },
      py::arg("text"), py::arg("why"), "The one form of a spec error: delaycomm: invalid delay spec 'TEXT': WHY.");
  m.def(
      "quote", [](const std::string& text) { return delaycomm::quoted(text); }, py::arg("text"),
      "User text as delaycomm's messages quote it (escaped, shortened after 80 characters).");
}

}  // namespace delaycomm::bindings
