// The geometry of the conv and pooling ops: one struct per op, shared by the CPU and CUDA kernels.
// SPDX-License-Identifier: MIT
//
// Kernels derive it from their (already validated) Args once and pass it by value into their loops
// or __global__ functions, so the methods are host- and device-callable (DDP_HOST_DEVICE). Sizes
// are elements, all std::int64_t (an activation can exceed 2^31 elements). Example: ResNet's layer1
// 3x3 conv at batch 16: n 16, h = w = ho = wo = 56, c = k = 64, r = s = 3, stride 1, pad 1, dil 1:
// p() = 3,136 output pixels per image, rsc() = 576 values under each window.
#pragma once

#include <cstdint>

#include "ddp/config.hpp"
#include "ddp/kernels/args.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::kernels {

// conv2d: x (n, h, w, c) NHWC, weight (k, r, s, c) KRSC, y (n, ho, wo, k).
struct ConvGeometry {
  std::int64_t n, h, w, c, k, r, s, ho, wo;
  Size2 stride, pad, dil;
  DDP_HOST_DEVICE std::int64_t p() const { return ho * wo; }      // output pixels per image
  DDP_HOST_DEVICE std::int64_t rsc() const { return r * s * c; }  // input values under one window
  // 1x1, stride 1, unpadded: x itself is the (n*h*w x c) GEMM operand, no im2col needed.
  DDP_HOST_DEVICE bool pointwise() const {
    return r == 1 && s == 1 && stride.h == 1 && stride.w == 1 && pad.h == 0 && pad.w == 0;
  }
};

// x and w may differ in element type (bf16 activations, float weights).
template <class T, class W, Device D>
ConvGeometry conv_geometry(const TensorView<const T, D>& x, const TensorView<const W, D>& w,
                           Size2 stride, Size2 pad, Size2 dil) {
  return {.n = x.dim(0),
          .h = x.dim(1),
          .w = x.dim(2),
          .c = x.dim(3),
          .k = w.dim(0),
          .r = w.dim(1),
          .s = w.dim(2),
          .ho = conv_out_size(x.dim(1), w.dim(1), stride.h, pad.h, dil.h),
          .wo = conv_out_size(x.dim(2), w.dim(2), stride.w, pad.w, dil.w),
          .stride = stride,
          .pad = pad,
          .dil = dil};
}

// Pooling: input (n, h, w, c), output (n, ho, wo, c), both NHWC; the window (kernel, stride,
// padding) is max-pool's (adaptive pooling derives its cells from the sizes alone and leaves them
// at 1, 1, 0).
struct PoolGeometry {
  std::int64_t n, h, w, c, ho, wo;
  Size2 kernel{1, 1}, stride{1, 1}, pad{0, 0};
};

// From the input-sized view `in` (x or dx) and the output-sized view `out` (y or dy).
template <class T, class U, Device D>
PoolGeometry pool_geometry(const TensorView<T, D>& in, const TensorView<U, D>& out,
                           Size2 kernel = {1, 1}, Size2 stride = {1, 1}, Size2 pad = {0, 0}) {
  return {.n = in.dim(0),
          .h = in.dim(1),
          .w = in.dim(2),
          .c = in.dim(3),
          .ho = out.dim(1),
          .wo = out.dim(2),
          .kernel = kernel,
          .stride = stride,
          .pad = pad};
}

// Adaptive pooling's cell i of `out` along an axis of `in` values: [pool_start, pool_end) =
// [floor(i in / out), ceil((i + 1) in / out)), PyTorch's rule. Example: 7 -> 3 cells: [0,3), [2,5),
// [4,7).
DDP_HOST_DEVICE inline std::int64_t pool_start(std::int64_t i, std::int64_t in, std::int64_t out) {
  return (i * in) / out;
}
DDP_HOST_DEVICE inline std::int64_t pool_end(std::int64_t i, std::int64_t in, std::int64_t out) {
  return ((i + 1) * in + out - 1) / out;
}

}  // namespace ddp::kernels
