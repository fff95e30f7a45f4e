// Flatten (torch.nn.Flatten(start_dim=1, end_dim=-1)): merges dimensions start_dim..end_dim into
// one.
// SPDX-License-Identifier: MIT
//
// The output has torch's element order for the twin torch module tree, so a Linear after it takes
// torch's weight as is (docs/decisions/0065):
//   - a rank-4 input is an NHWC image batch (docs/decisions/0005), the twin of torch's NCHW: it is
//     permuted to NCHW order, then flattened as torch flattens NCHW. (N, H, W, C) -> (N, C * H * W)
//     with element (n, c, h, w) at column (c * H + h) * W + w. A rank-4 result (start_dim ==
//     end_dim) is the input unchanged.
//   - other ranks ((N, T, C) sequences, (N, F) features) are in torch's order already: a plain
//     reshape.
// Negative dims count from the end of the input's rank, as in torch. Forward and backward each
// return a copy (the permutation, or the one copy a returned Tensor needs); backward restores the
// input's shape and layout. Note that Linear alone accepts (N, H, W, C) and flattens it in NHWC
// order (H, W, C): insert Flatten before a Linear whose weight must match torch's when H * W > 1.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/tensor/copy.hpp"

namespace ddp::nn {

template <class T, Device D>
class Flatten : public Module<T, D> {
 public:
  explicit Flatten(int start_dim = 1, int end_dim = -1)
      : start_dim_(start_dim), end_dim_(end_dim) {}

  int start_dim() const noexcept { return start_dim_; }
  int end_dim() const noexcept { return end_dim_; }
  std::string describe() const override {
    return ddp::detail::str("Flatten(start_dim=", start_dim_, ", end_dim=", end_dim_, ")");
  }

  // The output shape for an input of shape `in` (torch's for its NCHW twin when `in` has rank 4).
  Shape output_shape(const Shape& in) const {
    // torch's shape of the input
    const Shape t = in.rank() == 4 ? Shape{in[0], in[3], in[1], in[2]} : in;
    const auto where = [this] { return this->where(); };
    const int r = t.rank(), s = wrap_dim(start_dim_, t, "start_dim", where),
              e = wrap_dim(end_dim_, t, "end_dim", where);
    if (s > e)
      throw ValueError(ddp::detail::str("ddp: ", this->where(), ": start_dim ", start_dim_,
                                        " comes after end_dim ", end_dim_, " for an input of rank ",
                                        r, "; construct Flatten(start, end) with start <= end"));
    if (r == 4 && s == e) return in;
    std::int64_t dims[Shape::kMaxRank] = {};
    int k = 0;
    for (int i = 0; i < r; ++i) {
      if (i <= s || i > e)
        dims[k++] = t[i];
      else
        dims[k - 1] *= t[i];
    }
    return Shape(std::span<const std::int64_t>(dims, static_cast<std::size_t>(k)));
  }

 protected:
  Tensor<T, D> forward_impl(Exec<D>& exec, TensorView<const T, D> x) override {
    const Shape out = output_shape(x.shape());
    permuted_ = x.rank() == 4 && out.rank() != 4;
    Tensor<T, D> y(permuted_ ? Shape{x.dim(0), x.dim(3), x.dim(1), x.dim(2)} : x.shape());
    if (permuted_)
      Kernels<D>::permute_nhwc_nchw(exec, x, y.view(), false);
    else
      copy(x, y.view(), exec);
    y.reshape(out);
    in_shape_ = x.shape();
    out_shape_ = out;
    have_forward_ = true;
    return y;
  }
  Tensor<T, D> backward_impl(Exec<D>& exec, TensorView<const T, D> dy) override {
    this->require_forward_state(have_forward_);
    have_forward_ = false;
    expect_shape(dy, out_shape_, "output gradient dy", "Flatten.backward");
    Tensor<T, D> dx(in_shape_);
    if (permuted_) {
      const Shape& s = in_shape_;
      Kernels<D>::permute_nhwc_nchw(exec, dy.reshape(Shape{s[0], s[3], s[1], s[2]}), dx.view(),
                                    true);
    } else {
      copy(dy.reshape(in_shape_), dx.view(), exec);
    }
    return dx;
  }

 private:
  int start_dim_, end_dim_;
  Shape in_shape_, out_shape_;  // the last forward's input and output shapes
  bool permuted_ = false;       // the last forward permuted NHWC to NCHW
  bool have_forward_ = false;
};

}  // namespace ddp::nn
