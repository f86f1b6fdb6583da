#include "delay/DelaySpec.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

namespace delaycomm {

const char* const kAcceptedDelaySpecs =
    "none, const:50ms, exp:p99=400ms, exp:mean=400ms, lognormal:p50=60ms,p99=400ms[,p999=2s], "
    "pareto:p50=60ms,p99=400ms[,p999=2s], trace:FILE (durations need a unit: ns, us, ms, s)";

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Printable form of user text inside messages (quotes, control characters escaped, long text shortened).
std::string quoted(std::string_view s) {
  std::string out = "'";
  size_t n = 0;
  for (unsigned char c : s) {
    if (++n > 80) {
      out += "...";
      break;
    }
    if (c == '\'' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "'";
}

[[noreturn]] void badSpec(std::string_view text, const std::string& why) {
  throw std::invalid_argument("delaycomm: invalid delay spec " + quoted(text) + ": " + why + "; accepted: " +
                              kAcceptedDelaySpecs);
}

// Why a duration is invalid, or "" when it parses; the value in *seconds.
std::string durationError(std::string_view raw, double* seconds) {
  const std::string_view s = trim(raw);
  if (s.empty()) return "is empty (expected a number with a unit such as 50ms)";
  size_t i = 0;
  if (s[0] == '+') i = 1;
  if (s[0] == '-') return "is negative (a delay must be >= 0)";
  // Number: digits, optional '.', digits, optional exponent. from_chars would accept "inf"/"nan": check first.
  const size_t numStart = i;
  if (i >= s.size() || !(std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) {
    return "is not a number with a unit (expected e.g. 50ms, 1.5s, 800us)";
  }
  double v = 0.0;
  auto [ptr, ec] = std::from_chars(s.data() + numStart, s.data() + s.size(), v, std::chars_format::general);
  if (ec == std::errc::result_out_of_range) return "is out of range";
  if (ec != std::errc()) return "is not a number with a unit (expected e.g. 50ms, 1.5s, 800us)";
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
  if (!std::isfinite(v * scale)) return "is not finite";
  *seconds = v * scale;
  return "";
}

// "p99" -> 0.99, "p999" -> 0.999, "p05" -> 0.05, "p99.9" -> 0.999; "" on success.
std::string percentileError(const std::string& key, double* q) {
  if (key.size() < 2 || key.size() > 20 || key[0] != 'p') return "expected a percentile key such as p50, p99, p999 or p99.9";
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
    if (dot + 1 >= digits.size()) return "expected digits after the '.' (e.g. p99.9)";
    *q = std::stod(digits) / 100.0;
  }
  if (!(*q > 0.0 && *q < 1.0)) return "must name a percentile strictly between 0 and 100";
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

}  // namespace

const char* familyName(DelaySpec::Family f) {
  switch (f) {
    case DelaySpec::Family::kNone: return "none";
    case DelaySpec::Family::kConst: return "const";
    case DelaySpec::Family::kExp: return "exp";
    case DelaySpec::Family::kLognormal: return "lognormal";
    case DelaySpec::Family::kPareto: return "pareto";
    case DelaySpec::Family::kTrace: return "trace";
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

std::vector<double> parseTraceFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::invalid_argument("delaycomm: trace file " + quoted(path) +
                                " cannot be opened (expected a readable file of latencies, one per line with a "
                                "unit, e.g. 12.5ms)");
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  const std::string data = buf.str();
  std::vector<double> values;
  size_t lineNo = 0;
  size_t pos = 0;
  while (pos < data.size()) {
    size_t end = data.find('\n', pos);
    if (end == std::string::npos) end = data.size();
    ++lineNo;
    const std::string_view line = trim(std::string_view(data).substr(pos, end - pos));
    pos = end + 1;
    if (line.empty() || line[0] == '#') continue;
    double v = 0.0;
    const std::string why = durationError(line, &v);
    if (!why.empty()) {
      throw std::invalid_argument("delaycomm: trace file " + quoted(path) + " line " + std::to_string(lineNo) +
                                  ": " + quoted(line) + " " + why +
                                  "; expected one latency per line with a unit (ns, us, ms, s), e.g. 12.5ms; "
                                  "blank lines and lines starting with # are ignored");
    }
    values.push_back(v);
  }
  if (values.empty()) {
    throw std::invalid_argument("delaycomm: trace file " + quoted(path) +
                                " has no latencies (expected at least one line such as 12.5ms; blank lines and "
                                "lines starting with # are ignored)");
  }
  std::sort(values.begin(), values.end());
  return values;
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

  if (family == "trace") {
    if (args.empty()) badSpec(rawText, "trace needs a file path (trace:FILE)");
    spec.family = DelaySpec::Family::kTrace;
    spec.tracePath = std::string(args);
    spec.trace = std::make_shared<const std::vector<double>>(parseTraceFile(spec.tracePath));
    return spec;
  }
  if (family == "const") {
    spec.family = DelaySpec::Family::kConst;
    double v = 0.0;
    const std::string why = durationError(args, &v);
    if (!why.empty()) badSpec(rawText, "const duration " + quoted(args) + " " + why);
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
    if (!seen.insert(key).second) badSpec(rawText, "key " + quoted(key) + " is given twice");
    double q = 0.0;
    if (key != "mean") {
      const std::string qwhy = percentileError(key, &q);
      if (!qwhy.empty()) {
        badSpec(rawText, "key " + quoted(key) + " " + qwhy + (key[0] == 'p' ? "" : " (or mean= for exp)"));
      }
    }
    double v = 0.0;
    const std::string why = durationError(valueText, &v);
    if (!why.empty()) badSpec(rawText, "value of " + quoted(key) + " " + quoted(valueText) + " " + why);
    if (key == "mean") {
      if (spec.family != DelaySpec::Family::kExp) {
        badSpec(rawText, family + " is given by percentiles (pQ=DURATION), not by its mean");
      }
      spec.expMeanSeconds = v;
      continue;
    }
    for (const auto& p : spec.percentiles) {
      if (p.q == q) badSpec(rawText, "key " + quoted(key) + " names a percentile that is given twice");
    }
    spec.percentiles.push_back({q, v});
  }
  std::sort(spec.percentiles.begin(), spec.percentiles.end(),
            [](const auto& a, const auto& b) { return a.q < b.q; });
  const size_t n = spec.percentiles.size();
  if (spec.family == DelaySpec::Family::kExp) {
    const size_t given = n + (seen.count("mean") ? 1 : 0);
    if (given != 1) badSpec(rawText, "exp takes exactly one of mean=DURATION or one percentile (e.g. p99=400ms)");
    const double v = n ? spec.percentiles[0].seconds : spec.expMeanSeconds;
    if (!(v > 0.0)) badSpec(rawText, "the exp parameter must be > 0");
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
