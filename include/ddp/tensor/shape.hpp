// Shape: the extents of a tensor (rank 0 to 5), with int64 element counts and readable printing.
// SPDX-License-Identifier: MIT
//
// Layout conventions (docs/decisions/0005): activations are NHWC (N, H, W, C), conv weights are
// KRSC (C_out, kH, kW, C_in); the last dimension is contiguous. Shape only stores extents: every
// tensor in ddp is dense and row-major, so strides follow from the shape (see TensorView::stride).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <span>
#include <string>
#include <string_view>

#include "ddp/core/check.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp {

class Shape {
 public:
  static constexpr int kMaxRank = 5;

  Shape() = default;  // rank 0: a scalar with numel() == 1
  Shape(std::initializer_list<std::int64_t> dims)
      : Shape(std::span<const std::int64_t>(dims.begin(), dims.size())) {}
  // The extents listed in dims (a shape computed at run time: permuted, broadcast, flattened).
  explicit Shape(std::span<const std::int64_t> dims) {
    if (dims.size() > static_cast<std::size_t>(kMaxRank))
      throw ValueError(
          detail::str("ddp: a Shape has at most ", kMaxRank, " dimensions, got ", dims.size()));
    for (std::int64_t d : dims) {
      if (d < 0)
        throw ValueError(detail::str("ddp: Shape dimensions must be >= 0, got ", d,
                                     " in a shape of rank ", dims.size()));
      dims_[static_cast<std::size_t>(rank_++)] = d;
    }
  }

  int rank() const noexcept { return rank_; }
  // Extent of dimension i; negative i counts from the end (-1 is the last dimension).
  std::int64_t operator[](int i) const {
    const int j = i < 0 ? i + rank_ : i;
    DDP_CHECK_AS(ValueError, j >= 0 && j < rank_, "dimension ", i, " of a rank-", rank_, " shape ",
                 to_string());
    return dims_[static_cast<std::size_t>(j)];
  }
  std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<std::size_t>(i)];
    return n;
  }
  // Elements between consecutive indices of dimension i (row-major, dense).
  std::int64_t stride(int i) const {
    std::int64_t s = 1;
    for (int j = rank_ - 1; j > (i < 0 ? i + rank_ : i); --j)
      s *= dims_[static_cast<std::size_t>(j)];
    return s;
  }
  const std::int64_t* begin() const noexcept { return dims_.data(); }
  const std::int64_t* end() const noexcept { return dims_.data() + rank_; }

  friend bool operator==(const Shape& a, const Shape& b) noexcept {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i)
      if (a.dims_[static_cast<std::size_t>(i)] != b.dims_[static_cast<std::size_t>(i)])
        return false;
    return true;
  }

  // "(2, 3, 4)"; rank 0 prints "()".
  std::string to_string() const { return detail::str(*this); }
  friend std::ostream& operator<<(std::ostream& os, const Shape& s) {
    os << '(';
    for (int i = 0; i < s.rank_; ++i) os << (i ? ", " : "") << s.dims_[static_cast<std::size_t>(i)];
    return os << ')';
  }

 private:
  std::array<std::int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

// `dim` of shape s as an index in [0, rank) (negative dims count from the end, as torch's); else a
// ValueError "ddp: <where()>: <what> <dim> is out of range for shape <s> (valid: -r to r-1)".
// `where` is a callable returning the context, called only for the error (it may build a string).
template <class Where>
int wrap_dim(int dim, const Shape& s, std::string_view what, const Where& where) {
  const int r = s.rank(), d = dim < 0 ? dim + r : dim;
  if (d < 0 || d >= r)
    throw ValueError(detail::str("ddp: ", where(), ": ", what, " ", dim,
                                 " is out of range for shape ", s, " (valid: ", -r, " to ", r - 1,
                                 ")"));
  return d;
}

}  // namespace ddp
