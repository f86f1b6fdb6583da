#include "delay/Units.hpp"

#include <cstdio>
#include <cstring>

namespace delaycomm {

std::string percentileKey(double q) {
  char digits[64];
  std::snprintf(digits, sizeof(digits), "%.10f", q * 100.0);
  // Trailing zeros of the decimals go, then the point if nothing follows it.
  size_t n = std::strlen(digits);
  if (std::strchr(digits, '.') != nullptr) {
    while (n > 0 && digits[n - 1] == '0') {
      --n;
    }
    if (n > 0 && digits[n - 1] == '.') {
      --n;
    }
  }
  std::string key(digits, n);
  if (key.size() == 1) {
    key.insert(0, "0");  // 5 percent: p05 (p5 is 50 percent)
  }
  return "p" + key;
}

std::string secondsText(double seconds, int digits) {
  char buf[64];
  if (seconds >= 1.0) {
    std::snprintf(buf, sizeof(buf), "%.*gs", digits, seconds);
  } else if (seconds >= 1e-3) {
    std::snprintf(buf, sizeof(buf), "%.*gms", digits, seconds * 1e3);
  } else {
    std::snprintf(buf, sizeof(buf), "%.*gus", digits, seconds * 1e6);
  }
  return buf;
}

std::string msText(int64_t ns) {
  const double ms = static_cast<double>(ns) * 1e-6;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*g", ns >= 1000000000 ? 6 : 3, ms);
  if (std::strchr(buf, 'e') != nullptr) {
    std::snprintf(buf, sizeof(buf), "%.0f", ms);  // more integer digits than significant ones: all of them
  }
  return buf;
}

}  // namespace delaycomm
