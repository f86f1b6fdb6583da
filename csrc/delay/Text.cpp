#include "delay/Text.hpp"

#include <cstdio>
#include <vector>

namespace delaycomm {

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

}  // namespace delaycomm
