// String building for messages: str(a, b, c) streams its arguments into one std::string.
// SPDX-License-Identifier: MIT
#pragma once

#include <charconv>
#include <cstddef>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace ddp::detail {

// str("rank ", 3, " of ", 4) == "rank 3 of 4". Anything with operator<< works. Text and integers
// are appended directly, exactly as operator<< would write them: a std::ostringstream costs about
// half a microsecond, and every op's label is built with str (docs/decisions/0038).
template <class T>
inline constexpr bool kAppendable = std::is_convertible_v<const T&, std::string_view> ||
                                    (std::is_integral_v<T> && !std::is_same_v<T, bool>);

template <class T>
void append_to(std::string& s, const T& v) {
  if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    s += std::string_view(v);
  } else if constexpr (std::is_same_v<T, char> || std::is_same_v<T, signed char> ||
                       std::is_same_v<T, unsigned char>) {
    s += static_cast<char>(v);  // operator<< writes a character type as the character
  } else {
    char buf[24];
    s.append(buf, static_cast<std::size_t>(std::to_chars(buf, buf + sizeof buf, v).ptr - buf));
  }
}

template <class... Args>
std::string str(Args&&... args) {
  if constexpr (sizeof...(Args) == 0) {
    return {};
  } else if constexpr ((kAppendable<std::remove_cvref_t<Args>> && ...)) {
    std::string s;
    (append_to(s, args), ...);
    return s;
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
