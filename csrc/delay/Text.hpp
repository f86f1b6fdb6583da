#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace delaycomm {

// User text in delaycomm's messages (a spec, a file name, a trace line): one way to quote it, shared by the
// grammar's messages (delay/DelaySpec.hpp) and, through the binding, by Python's readers of trace and profile
// files (delaycomm/_readers.py), so that a file is named the same way in every message.

// Length of the valid UTF-8 sequence at s[i] (1 for ASCII), or 0 when the bytes there are not UTF-8 (overlongs
// and surrogates are not).
size_t utf8Length(std::string_view s, size_t i);

// `s` made printable: quoted, quotes, backslashes and control characters escaped, bytes that are not UTF-8 escaped
// as \xNN (so the message stays valid UTF-8), shortened after 80 characters to its first and last 38 with "..."
// between (the end of a file path, its name, is what tells the user which file).
std::string quoted(std::string_view s);

}  // namespace delaycomm
