// DDP_CHECK* macros: internal invariants and argument checks that throw ddp::Error (or a chosen
// subclass) and print both compared values, e.g.
//   ddp: check failed: a.size() == b.size() (3 vs 4). tensors must match at shape.hpp:42
// SPDX-License-Identifier: MIT
#pragma once

#include <string>
#include <string_view>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::detail {

template <class E = Error>
[[noreturn]] inline void fail(const char* file, int line, std::string_view expr,
                              const std::string& detail) {
  std::string_view path(file);
  if (auto pos = path.rfind("include/"); pos != std::string_view::npos) path.remove_prefix(pos + 8);
  throw E(str("ddp: check failed: ", expr, detail.empty() ? "" : " (", detail,
              detail.empty() ? "" : ")", " at ", path, ':', line));
}

}  // namespace ddp::detail

// DDP_CHECK(cond, message...) throws ddp::Error when cond is false; message parts are streamed.
#define DDP_CHECK(cond, ...)                                                                      \
  do {                                                                                            \
    if (!(cond)) ::ddp::detail::fail(__FILE__, __LINE__, #cond, ::ddp::detail::str(__VA_ARGS__)); \
  } while (0)

// DDP_CHECK_AS(ErrorType, cond, message...) throws the given ddp::Error subclass.
#define DDP_CHECK_AS(E, cond, ...)                                                        \
  do {                                                                                    \
    if (!(cond))                                                                          \
      ::ddp::detail::fail<E>(__FILE__, __LINE__, #cond, ::ddp::detail::str(__VA_ARGS__)); \
  } while (0)

#define DDP_CHECK_OP_(op, a, b, ...)                                                   \
  do {                                                                                 \
    const auto& ddp_l_ = (a);                                                          \
    const auto& ddp_r_ = (b);                                                          \
    if (!(ddp_l_ op ddp_r_))                                                           \
      ::ddp::detail::fail(                                                             \
          __FILE__, __LINE__, #a " " #op " " #b,                                       \
          ::ddp::detail::str(ddp_l_, " vs ", ddp_r_ __VA_OPT__(, ". ", __VA_ARGS__))); \
  } while (0)

#define DDP_CHECK_EQ(a, b, ...) DDP_CHECK_OP_(==, a, b __VA_OPT__(, __VA_ARGS__))
#define DDP_CHECK_NE(a, b, ...) DDP_CHECK_OP_(!=, a, b __VA_OPT__(, __VA_ARGS__))
#define DDP_CHECK_LT(a, b, ...) DDP_CHECK_OP_(<, a, b __VA_OPT__(, __VA_ARGS__))
#define DDP_CHECK_LE(a, b, ...) DDP_CHECK_OP_(<=, a, b __VA_OPT__(, __VA_ARGS__))
#define DDP_CHECK_GT(a, b, ...) DDP_CHECK_OP_(>, a, b __VA_OPT__(, __VA_ARGS__))
#define DDP_CHECK_GE(a, b, ...) DDP_CHECK_OP_(>=, a, b __VA_OPT__(, __VA_ARGS__))
