// TensorView<T, D>: a non-owning pointer + Shape over dense row-major memory; what kernels and comm
// take.
// SPDX-License-Identifier: MIT
//
// A view is a small value (pointer and extents); copying it never copies data. Views of const T are
// read-only; TensorView<T, D> converts implicitly to TensorView<const T, D>. Strides are those of a
// contiguous row-major array: for NHWC (N, H, W, C), stride(0) = H*W*C, stride(3) = 1.
// An empty view (data() == nullptr, numel() == 0) means "absent" in kernel Args (e.g. no bias).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ddp/core/check.hpp"
#include "ddp/core/dtype.hpp"
#include "ddp/core/error.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/shape.hpp"

namespace ddp {

template <class T, Device D>
class TensorView {
 public:
  using value_type = std::remove_const_t<T>;
  using device_type = D;

  TensorView() = default;
  TensorView(T* data, Shape shape) : data_(data), shape_(shape) {
    DDP_CHECK_AS(ValueError, data_ != nullptr || shape_.numel() == 0, "a view of ", shape_,
                 " needs memory but got a null pointer");
  }
  // TensorView<float, D> -> TensorView<const float, D>.
  template <class U>
  requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
      TensorView(const TensorView<U, D>& o)
      : data_(o.data()), shape_(o.shape()) {}  // NOLINT: implicit on purpose

  T* data() const noexcept { return data_; }
  const Shape& shape() const noexcept { return shape_; }
  int rank() const noexcept { return shape_.rank(); }
  std::int64_t dim(int i) const { return shape_[i]; }
  std::int64_t numel() const noexcept { return shape_.numel(); }
  std::int64_t stride(int i) const { return shape_.stride(i); }
  std::size_t bytes() const noexcept { return static_cast<std::size_t>(numel()) * sizeof(T); }
  bool empty() const noexcept { return data_ == nullptr; }
  static constexpr DType dtype() noexcept { return dtype_of<value_type>; }

  // The same memory seen with another shape of the same numel, e.g. (N, H, W, C) as (N*H*W, C).
  TensorView reshape(Shape s) const {
    if (s.numel() != numel())
      throw ValueError(detail::str("ddp: cannot reshape a view of ", shape_, " (", numel(),
                                   " elements) to ", s, " (", s.numel(), " elements)"));
    return TensorView(data_, s);
  }
  // Elements [begin, end) of dimension 0, e.g. images 4..8 of a batch.
  TensorView slice(std::int64_t begin, std::int64_t end) const {
    DDP_CHECK_AS(ValueError, rank() >= 1 && 0 <= begin && begin <= end && end <= dim(0), "slice [",
                 begin, ", ", end, ") of ", shape_);
    Shape s = shape_;
    s = with_dim0(s, end - begin);
    return TensorView(data_ + begin * stride(0), s);
  }

  // Element access on the CPU: v(n, h, w, c). Checked only in rank, not in range (hot loops use
  // data()).
  template <class... I>
  requires(std::is_same_v<D, Cpu> && (std::is_integral_v<I> && ...)) T& operator()(I... idx) const {
    DDP_CHECK_EQ(static_cast<int>(sizeof...(I)), rank(), "index count must equal the view's rank");
    std::int64_t off = 0;
    int k = 0;
    ((off = off * shape_[k++] + static_cast<std::int64_t>(idx)), ...);
    return data_[off];
  }
  T& operator[](std::int64_t i) const requires std::is_same_v<D, Cpu> { return data_[i]; }
  T* begin() const noexcept { return data_; }
  T* end() const noexcept { return data_ + numel(); }

 private:
  static Shape with_dim0(const Shape& s, std::int64_t d0) {
    switch (s.rank()) {
      case 1: return Shape{d0};
      case 2: return Shape{d0, s[1]};
      case 3: return Shape{d0, s[1], s[2]};
      case 4: return Shape{d0, s[1], s[2], s[3]};
      default: return Shape{d0, s[1], s[2], s[3], s[4]};
    }
  }
  T* data_ = nullptr;
  Shape shape_{0};
};

template <class T>
using CpuView = TensorView<T, Cpu>;

// "x has shape (2, 3) but must be (2, 4)"-style check used by kernels' argument validation.
template <class T, Device D>
void expect_shape(const TensorView<T, D>& v, const Shape& want, const char* what, const char* op) {
  if (!(v.shape() == want))
    throw ValueError(
        detail::str("ddp: ", op, ": ", what, " has shape ", v.shape(), " but must be ", want));
}

}  // namespace ddp
