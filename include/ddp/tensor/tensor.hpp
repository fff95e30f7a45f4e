// Tensor<T, D>: a dense row-major array that owns its Storage<D> (or borrows memory:
// Tensor::borrow); move-only. Kernels take its view().
// SPDX-License-Identifier: MIT
//
//   auto x = Tensor<float, Cpu>::zeros({16, 224, 224, 3});   // NHWC activations
//   auto w = Tensor<float, Cpu>::from({2, 1}, {0.5f, -1.f});
//   Kernels<Cpu>::relu_forward(exec, x.view(), y.view());
// Copies are explicit (clone(), copy.hpp), so a large activation is never duplicated by accident.
// Element types: float, double, bfloat16, half, int32, int64, uint8 (anything with a DType).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <type_traits>
#include <utility>

#include "ddp/core/dtype.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/shape.hpp"
#include "ddp/tensor/storage.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp {

template <class T, Device D>
class Tensor {
  static_assert(!std::is_const_v<T>,
                "ddp: Tensor owns its elements; use TensorView<const T, D> for read-only access");
  static_assert(std::is_trivially_copyable_v<T>, "ddp: tensor elements must be trivially copyable");

 public:
  using value_type = T;
  using device_type = D;

  Tensor() = default;  // empty: shape (0), no memory
  // Uninitialised elements (the contents are whatever the allocator returned).
  explicit Tensor(Shape shape)
      : storage_(static_cast<std::size_t>(shape.numel()) * sizeof(T)), shape_(shape) {}
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  Tensor(Tensor&& o) noexcept
      : storage_(std::move(o.storage_)), shape_(std::exchange(o.shape_, Shape{0})) {}
  Tensor& operator=(Tensor&& o) noexcept {
    storage_ = std::move(o.storage_);
    shape_ = std::exchange(o.shape_, Shape{0});
    return *this;
  }
  ~Tensor() = default;

  static Tensor empty(Shape shape) { return Tensor(shape); }
  // A tensor over shape.numel() elements at `data` that it does not own: the owner keeps the memory
  // alive for as long as the tensor (or what it is moved into) exists, and frees it.
  static Tensor borrow(T* data, Shape shape) noexcept {
    Tensor t;
    t.storage_ = Storage<D>::borrowed(data, static_cast<std::size_t>(shape.numel()) * sizeof(T));
    t.shape_ = shape;
    return t;
  }
  bool owns_memory() const noexcept { return storage_.owns(); }
  static Tensor zeros(Shape shape) requires std::is_same_v<D, Cpu> {
    Tensor t(shape);
    if (t.storage_.bytes()) std::memset(t.storage_.data(), 0, t.storage_.bytes());
    return t;
  }
  static Tensor full(Shape shape, T value) requires std::is_same_v<D, Cpu> {
    Tensor t(shape);
    std::fill(t.data(), t.data() + t.numel(), value);
    return t;
  }
  // Copies `values` (row-major) into a new tensor; their count must equal shape.numel().
  static Tensor from(Shape shape, std::span<const T> values) requires std::is_same_v<D, Cpu> {
    if (static_cast<std::int64_t>(values.size()) != shape.numel())
      throw ValueError(detail::str("ddp: Tensor::from: shape ", shape, " holds ", shape.numel(),
                                   " elements but ", values.size(), " values were given"));
    Tensor t(shape);
    std::copy(values.begin(), values.end(), t.data());
    return t;
  }
  static Tensor from(Shape shape, std::initializer_list<T> values) requires std::is_same_v<D, Cpu> {
    return from(shape, std::span<const T>(values.begin(), values.size()));
  }

  // A deep copy (CPU; other devices use copy.hpp with an Exec).
  Tensor clone() const requires std::is_same_v<D, Cpu> {
    Tensor t(shape_);
    if (numel()) std::memcpy(t.data(), data(), bytes());
    return t;
  }

  T* data() noexcept { return static_cast<T*>(storage_.data()); }
  const T* data() const noexcept { return static_cast<const T*>(storage_.data()); }
  const Shape& shape() const noexcept { return shape_; }
  int rank() const noexcept { return shape_.rank(); }
  std::int64_t dim(int i) const { return shape_[i]; }
  std::int64_t numel() const noexcept { return shape_.numel(); }
  std::size_t bytes() const noexcept { return static_cast<std::size_t>(numel()) * sizeof(T); }
  bool empty() const noexcept { return storage_.data() == nullptr; }
  static constexpr DType dtype() noexcept { return dtype_of<T>; }

  TensorView<T, D> view() noexcept { return TensorView<T, D>(data(), shape_); }
  TensorView<const T, D> view() const noexcept { return TensorView<const T, D>(data(), shape_); }
  TensorView<const T, D> cview() const noexcept { return view(); }
  // A Tensor where a view is expected (module forward, kernels, collectives) stops here with one
  // readable line instead of a page of "no known conversion" notes (docs/decisions/0066). Views
  // stay explicit: a view does not own its memory, and an implicit one of a temporary would dangle.
  template <class U>
  requires std::is_same_v<std::remove_const_t<U>, T>
  operator TensorView<U, D>() const {
    static_assert(sizeof(U) == 0,
                  "ddp: a Tensor was passed where a TensorView is expected: pass x.cview() "
                  "(read-only) or x.view() "
                  "(writable), and keep x alive while the view is in use");
    return {};
  }

  // Reinterprets the same elements with another shape of equal numel (the data is not moved).
  void reshape(Shape s) {
    if (s.numel() != numel())
      throw ValueError(detail::str("ddp: cannot reshape a tensor of ", shape_, " (", numel(),
                                   " elements) to ", s, " (", s.numel(), " elements)"));
    shape_ = s;
  }

  // CPU element access: t(n, h, w, c).
  template <class... I>
  requires(std::is_same_v<D, Cpu> && (std::is_integral_v<I> && ...)) T& operator()(I... idx) {
    return view()(idx...);
  }
  template <class... I>
  requires(std::is_same_v<D, Cpu> && (std::is_integral_v<I> && ...)) const T& operator()(
      I... idx) const {
    return view()(idx...);
  }

 private:
  Storage<D> storage_;
  Shape shape_{0};
};

template <class T>
using CpuTensor = Tensor<T, Cpu>;

}  // namespace ddp
