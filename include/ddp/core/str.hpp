// String building for messages: str(a, b, c) streams its arguments into one std::string.
// SPDX-License-Identifier: MIT
#pragma once

#include <sstream>
#include <string>
#include <string_view>
#include <utility>

namespace ddp::detail {

// str("rank ", 3, " of ", 4) == "rank 3 of 4". Anything with operator<< works.
template <class... Args>
std::string str(Args&&... args) {
  if constexpr (sizeof...(Args) == 0) {
    return {};
  } else {
    std::ostringstream os;
    (os << ... << std::forward<Args>(args));
    return os.str();
  }
}

// join({"a","b"}, ", ") == "a, b"; works for any range of streamable elements.
template <class Range>
std::string join(const Range& items, std::string_view sep) {
  std::ostringstream os;
  bool first = true;
  for (const auto& item : items) {
    if (!first) os << sep;
    os << item;
    first = false;
  }
  return os.str();
}

// Quote a value for an error message: quoted("3x") == "'3x'".
inline std::string quoted(std::string_view s) { return str('\'', s, '\''); }

}  // namespace ddp::detail
