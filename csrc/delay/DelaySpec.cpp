#include "delay/DelaySpec.hpp"

#include "delay/Profile.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <stdexcept>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace delaycomm {

const char* const kAcceptedDelaySpecs =
    "a delay spec: none, const:50ms, exp:p99=400ms, exp:mean=400ms, lognormal:p50=60ms,p99=400ms[,p999=2s], "
    "pareto:p50=60ms,p99=400ms[,p999=2s], trace:FILE, profile:FILE (durations need a unit: ns, us, ms, s; each is 0 or "
    "from 1ns "
    "to 86400s)";

namespace {

constexpr const char* kDurationRange = "a delay is 0 or from 1ns to 86400s, 24 hours";
constexpr const char* kTraceFormat =
    "expected one latency per line with a unit (ns, us, ms, s) such as 12.5ms; blank lines and lines starting with "
    "# are ignored";

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

// Length of the valid UTF-8 sequence at s[i] (1 for ASCII), or 0 when the bytes there are not UTF-8.
size_t utf8Length(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80)
    return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the allowed range of the second byte (no overlongs, no surrogates)
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0)
      lo = 0xa0;
    if (c == 0xed)
      hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0)
      lo = 0x90;
    if (c == 0xf4)
      hi = 0x8f;
  } else {
    return 0;
  }
  if (i + n > s.size())
    return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xbf))
      return 0;
  }
  return n;
}

std::string hexByte(unsigned char c) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "0x%02x", c);
  return buf;
}

// Why a trace line is not text (a NUL or control byte, bytes that are not UTF-8), or "".
std::string notTextError(std::string_view line) {
  for (size_t i = 0; i < line.size();) {
    const auto c = static_cast<unsigned char>(line[i]);
    const size_t n = utf8Length(line, i);
    if (n == 0 || (c < 0x20 && c != '\t' && c != '\r') || c == 0x7f) {
      return "is not text: byte " + hexByte(c) + " at column " + std::to_string(i + 1) + " (a binary file?)";
    }
    i += n;
  }
  return "";
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

namespace {

// Appends s to out, escaped: quotes and backslashes, control bytes and bytes that are not UTF-8 as \xNN.
void appendEscaped(std::string& out, std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = utf8Length(s, i);
    if (n > 1) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    if (c == '\'' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (n == 0 || c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
    ++i;
  }
}

}  // namespace

// A value longer than 80 characters keeps its first and last 38 with "..." between: the end of a file path (its
// name) is what tells the user which file.
std::string quoted(std::string_view s) {
  constexpr size_t kMaxChars = 80, kKeep = 38;
  std::vector<size_t> starts;  // where each character (code point, or a lone byte) begins
  for (size_t i = 0; i < s.size();) {
    starts.push_back(i);
    const size_t n = utf8Length(s, i);
    i += n > 1 ? n : 1;
  }
  std::string out = "'";
  if (starts.size() <= kMaxChars) {
    appendEscaped(out, s);
  } else {
    appendEscaped(out, s.substr(0, starts[kKeep]));
    out += "...";
    appendEscaped(out, s.substr(starts[starts.size() - kKeep]));
  }
  return out + "'";
}

std::invalid_argument invalidDelaySpec(std::string_view text, const std::string& why) {
  return std::invalid_argument("delaycomm: invalid delay spec " + quoted(text) + ": " + why);
}

uint64_t traceDigest(const std::vector<double>& sorted) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](uint64_t x) {
    for (int k = 0; k < 8; ++k) {
      h ^= (x >> (8 * k)) & 0xffu;
      h *= 0x100000001b3ull;
    }
  };
  mix(sorted.size());
  for (double v : sorted) {
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(bits));
    mix(bits);
  }
  return h;
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

namespace {

const char* fileKind(mode_t mode) {
  if (S_ISDIR(mode))
    return "a directory";
  if (S_ISFIFO(mode))
    return "a FIFO";
  if (S_ISCHR(mode))
    return "a character device";
  if (S_ISBLK(mode))
    return "a block device";
  if (S_ISSOCK(mode))
    return "a socket";
  return "not a regular file";
}

std::string errnoText(int err) {
  return std::error_code(err, std::generic_category()).message();
}

}  // namespace

std::string readSmallFile(const std::string& name, const std::string& path, std::string* out) {
  if (path.find('\0') != std::string::npos)
    return name + " has a NUL byte in its path";
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return name + " cannot be opened: " + errnoText(errno) + " (expected a readable regular file)";
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0)
    return name + " cannot be read: " + errnoText(errno);
  if (!S_ISREG(st.st_mode)) {
    return name + " is " + fileKind(st.st_mode) + " (expected a regular file)";
  }
  const std::string limit = "the limit of " + std::to_string(kMaxTraceBytes >> 20) + " MiB";
  if (static_cast<uint64_t>(st.st_size) > kMaxTraceBytes) {
    return name + " has " + std::to_string(st.st_size) + " bytes, more than " + limit;
  }
  std::string data(static_cast<size_t>(st.st_size) + 1, '\0');
  size_t got = 0;
  while (got <= kMaxTraceBytes) {
    if (got == data.size())
      data.resize(std::min(kMaxTraceBytes + 1, data.size() * 2));
    const ssize_t n = ::read(fd, data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return name + " cannot be read: " + errnoText(errno);
    if (n == 0)
      break;
    got += static_cast<size_t>(n);
  }
  if (got > kMaxTraceBytes)
    return name + " has more than " + limit + " (it grew while being read)";
  data.resize(got);
  *out = std::move(data);
  return "";
}

namespace {

// Why the trace file at `path` is unusable ("trace file 'PATH' ..."), or "" with its latencies (unsorted) in
// *values (the file is read by readSmallFile).
std::string traceFileError(const std::string& path, std::vector<double>* values) {
  const std::string name = "trace file " + quoted(path);
  std::string data;
  if (std::string why = readSmallFile(name, path, &data); !why.empty())
    return why;

  size_t lineNo = 0;
  // A UTF-8 byte order mark (written by some Windows editors) is skipped, as most tools do (docs/delay.md).
  size_t pos = data.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;
  while (pos < data.size()) {
    size_t end = data.find('\n', pos);
    if (end == std::string::npos)
      end = data.size();
    ++lineNo;
    const std::string_view raw = std::string_view(data).substr(pos, end - pos);
    pos = end + 1;
    const std::string where = name + " line " + std::to_string(lineNo);
    const std::string notText = notTextError(raw);
    if (!notText.empty())
      return where + " " + notText + "; " + kTraceFormat;
    const std::string_view line = trim(raw);
    if (line.empty() || line[0] == '#')
      continue;
    double v = 0.0;
    const std::string why = durationError(line, &v);
    if (!why.empty())
      return where + ": " + quoted(line) + " " + why + "; " + kTraceFormat;
    values->push_back(v);
  }
  if (values->empty()) {
    return name +
           " has no latencies (expected at least one line such as 12.5ms; blank lines and lines starting "
           "with # are ignored)";
  }
  return "";
}

}  // namespace

std::vector<double> parseTraceFile(const std::string& path) {
  std::vector<double> values;
  const std::string why = traceFileError(path, &values);
  if (!why.empty())
    throw std::invalid_argument("delaycomm: " + why);
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
    if (args.empty())
      badSpec(rawText, "trace needs a file path (trace:FILE)");
    spec.family = DelaySpec::Family::kTrace;
    spec.tracePath = std::string(args);
    std::vector<double> values;
    const std::string why = traceFileError(spec.tracePath, &values);
    if (!why.empty())
      throw invalidDelaySpec(rawText, why);
    std::sort(values.begin(), values.end());
    spec.traceDigest = traceDigest(values);
    spec.trace = std::make_shared<const std::vector<double>>(std::move(values));
    return spec;
  }
  if (family == "profile") {
    if (args.empty())
      badSpec(rawText, "profile needs a file path (profile:FILE)");
    spec.family = DelaySpec::Family::kProfile;
    spec.profilePath = std::string(args);
    try {
      spec.profile = DelayProfile::load(spec.profilePath);
    } catch (const std::invalid_argument& e) {
      throw invalidDelaySpec(rawText, e.what());
    }
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
