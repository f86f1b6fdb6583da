#include "delay/DelaySpec.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <set>
#include <stdexcept>
#include <system_error>
#include <vector>

#include "delay/Text.hpp"

namespace delaycomm {

const char* const kAcceptedDelaySpecs =
    "a delay spec: none, const:50ms, exp:p99=400ms, exp:mean=400ms, lognormal:p50=60ms,p99=400ms[,p999=2s], "
    "pareto:p50=60ms,p99=400ms[,p999=2s], trace:FILE, profile:FILE (durations need a unit: ns, us, ms, s; each is 0 or "
    "from 1ns "
    "to 86400s)";

namespace {

constexpr const char* kDurationRange = "a delay is 0 or from 1ns to 86400s, 24 hours";

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
    s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
    s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Why a duration is invalid, or "" when it parses; the value in *seconds.
std::string durationError(std::string_view raw, double* seconds) {
  const std::string_view s = trim(raw);
  if (s.empty())
    return "is empty (expected a number with a unit such as 50ms)";
  size_t i = 0;
  if (s[0] == '+')
    i = 1;
  if (s[0] == '-')
    return "is negative (a delay must be >= 0)";
  // Number: digits, optional '.', digits, optional exponent. from_chars would accept "inf"/"nan": check first.
  const size_t numStart = i;
  if (i >= s.size() || !(std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) {
    return "is not a number with a unit (expected e.g. 50ms, 1.5s, 800us)";
  }
  double v = 0.0;
  auto [ptr, ec] = std::from_chars(s.data() + numStart, s.data() + s.size(), v, std::chars_format::general);
  if (ec == std::errc::result_out_of_range)
    return std::string("is out of range (") + kDurationRange + ")";
  if (ec != std::errc())
    return "is not a number with a unit (expected e.g. 50ms, 1.5s, 800us)";
  std::string_view unit = trim(std::string_view(ptr, s.data() + s.size() - ptr));
  const std::string u = lower(unit);
  double scale = 0.0;
  if (u == "s") {
    scale = 1.0;
  } else if (u == "ms") {
    scale = 1e-3;
  } else if (u == "us" || u == "\xc2\xb5s") {
    scale = 1e-6;
  } else if (u == "ns") {
    scale = 1e-9;
  } else if (u.empty()) {
    return "has no unit (expected one of ns, us, ms, s, e.g. 50ms)";
  } else {
    return "has an unknown unit " + quoted(unit) + " (expected one of ns, us, ms, s)";
  }
  const double sec = v * scale;
  // Compared with a relative slack so that 1ns, 1e-9s and 0.001us (products that round) are all accepted.
  if (!std::isfinite(sec) || sec > kMaxDelaySeconds * (1.0 + 1e-12)) {
    return std::string("is longer than 86400s (") + kDurationRange + ")";
  }
  if (sec > 0.0 && sec < kMinDelaySeconds * (1.0 - 1e-12)) {
    return std::string("is shorter than 1ns (") + kDurationRange + ")";
  }
  *seconds = sec;
  return "";
}

// "p99" -> 0.99, "p999" -> 0.999, "p05" -> 0.05, "p99.9" -> 0.999; "" on success.
std::string percentileError(const std::string& key, double* q) {
  if (key.size() < 2 || key.size() > 20 || key[0] != 'p')
    return "expected a percentile key such as p50, p99, p999 or p99.9";
  const std::string digits = key.substr(1);
  const size_t dot = digits.find('.');
  for (size_t i = 0; i < digits.size(); ++i) {
    if (!(std::isdigit(static_cast<unsigned char>(digits[i])) || (i == dot && dot != 0))) {
      return "expected a percentile key such as p50, p99, p999 or p99.9";
    }
  }
  if (dot == std::string::npos) {
    if (digits.size() >= 3 && digits.back() == '0') {
      return "is ambiguous (write p10, p50 or p99.0 instead)";
    }
    *q = std::stod("0." + digits);
  } else {
    if (dot + 1 >= digits.size())
      return "expected digits after the '.' (e.g. p99.9)";
    *q = std::stod(digits) / 100.0;
  }
  if (!(*q > 0.0 && *q < 1.0))
    return "must name a percentile strictly between 0 and 100";
  return "";
}

std::vector<std::string_view> splitArgs(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == ',') {
      out.push_back(trim(s.substr(start, i - start)));
      start = i + 1;
    }
  }
  return out;
}

[[noreturn]] void badSpec(std::string_view text, const std::string& why) {
  throw invalidDelaySpec(text, why + "; expected " + kAcceptedDelaySpecs);
}

}  // namespace

std::invalid_argument invalidDelaySpec(std::string_view text, const std::string& why) {
  return std::invalid_argument("delaycomm: invalid delay spec " + quoted(text) + ": " + why);
}

const char* familyName(DelaySpec::Family f) {
  switch (f) {
    case DelaySpec::Family::kNone:
      return "none";
    case DelaySpec::Family::kConst:
      return "const";
    case DelaySpec::Family::kExp:
      return "exp";
    case DelaySpec::Family::kLognormal:
      return "lognormal";
    case DelaySpec::Family::kPareto:
      return "pareto";
    case DelaySpec::Family::kTrace:
      return "trace";
    case DelaySpec::Family::kProfile:
      return "profile";
  }
  return "unknown";
}

double parseDuration(std::string_view text, const std::string& what) {
  double v = 0.0;
  const std::string why = durationError(text, &v);
  if (!why.empty()) {
    throw std::invalid_argument("delaycomm: " + what + " " + quoted(trim(text)) + " " + why);
  }
  return v;
}

int64_t parseDurations(const std::vector<std::string>& lines, std::vector<double>* out, std::string* why) {
  out->clear();
  out->reserve(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    double v = 0.0;
    *why = durationError(lines[i], &v);
    if (!why->empty())
      return static_cast<int64_t>(i);
    out->push_back(v);
  }
  return -1;
}

DelaySpec parseDelaySpec(std::string_view rawText) {
  DelaySpec spec;
  spec.text = std::string(rawText);
  const std::string_view text = trim(rawText);
  const std::string low = lower(text);
  if (low == "none" || low == "off") {
    return spec;
  }
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos) {
    badSpec(rawText, "expected FAMILY:ARGUMENTS");
  }
  const std::string family = lower(trim(text.substr(0, colon)));
  const std::string_view args = trim(text.substr(colon + 1));

  if (family == "trace" || family == "profile") {
    // The file is read by Python (delaycomm/_spec.py), once, when the option is parsed; the grammar only names it.
    if (args.empty())
      badSpec(rawText, family + " needs a file path (" + family + ":FILE)");
    spec.family = family == "trace" ? DelaySpec::Family::kTrace : DelaySpec::Family::kProfile;
    spec.path = std::string(args);
    return spec;
  }
  if (family == "const") {
    spec.family = DelaySpec::Family::kConst;
    double v = 0.0;
    const std::string why = durationError(args, &v);
    if (!why.empty())
      badSpec(rawText, "const duration " + quoted(args) + " " + why);
    spec.constSeconds = v;
    return spec;
  }
  if (family != "exp" && family != "lognormal" && family != "pareto") {
    badSpec(rawText, "unknown family " + quoted(family));
  }
  spec.family = family == "exp"         ? DelaySpec::Family::kExp
                : family == "lognormal" ? DelaySpec::Family::kLognormal
                                        : DelaySpec::Family::kPareto;
  std::set<std::string> seen;
  for (std::string_view arg : splitArgs(args)) {
    const size_t eq = arg.find('=');
    if (arg.empty() || eq == std::string_view::npos) {
      badSpec(rawText, family + " expects KEY=DURATION arguments separated by commas, got " + quoted(arg));
    }
    const std::string key = lower(trim(arg.substr(0, eq)));
    const std::string_view valueText = trim(arg.substr(eq + 1));
    if (!seen.insert(key).second)
      badSpec(rawText, "key " + quoted(key) + " is given twice");
    double q = 0.0;
    if (key != "mean") {
      const std::string qwhy = percentileError(key, &q);
      if (!qwhy.empty()) {
        badSpec(rawText, "key " + quoted(key) + " " + qwhy + (key[0] == 'p' ? "" : " (or mean= for exp)"));
      }
    }
    double v = 0.0;
    const std::string why = durationError(valueText, &v);
    if (!why.empty())
      badSpec(rawText, "value of " + quoted(key) + " " + quoted(valueText) + " " + why);
    if (key == "mean") {
      if (spec.family != DelaySpec::Family::kExp) {
        badSpec(rawText, family + " is given by percentiles (pQ=DURATION), not by its mean");
      }
      spec.expMeanSeconds = v;
      continue;
    }
    for (const auto& p : spec.percentiles) {
      if (p.q == q)
        badSpec(rawText, "key " + quoted(key) + " names a percentile that is given twice");
    }
    spec.percentiles.push_back({q, v});
  }
  std::sort(spec.percentiles.begin(), spec.percentiles.end(), [](const auto& a, const auto& b) { return a.q < b.q; });
  const size_t n = spec.percentiles.size();
  if (spec.family == DelaySpec::Family::kExp) {
    const size_t given = n + (seen.count("mean") ? 1 : 0);
    if (given != 1)
      badSpec(rawText, "exp takes exactly one of mean=DURATION or one percentile (e.g. p99=400ms)");
    const double v = n ? spec.percentiles[0].seconds : spec.expMeanSeconds;
    if (!(v > 0.0))
      badSpec(rawText, "the exp parameter must be > 0");
    return spec;
  }
  if (n < 2 || n > 3) {
    badSpec(rawText, family + " takes two percentiles (e.g. p50=60ms,p99=400ms) and optionally a third (p999=...)");
  }
  if (!(spec.percentiles[0].seconds > 0.0)) {
    badSpec(rawText, family + " percentiles must be > 0");
  }
  for (size_t i = 1; i < n; ++i) {
    if (!(spec.percentiles[i].seconds > spec.percentiles[i - 1].seconds)) {
      badSpec(rawText, "percentiles must increase with the quantile (a higher percentile needs a longer duration)");
    }
  }
  return spec;
}

}  // namespace delaycomm
