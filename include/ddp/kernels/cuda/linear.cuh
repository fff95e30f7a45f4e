// CUDA fully connected layer: y = x W^T + b and its gradients, as cuBLAS GEMMs (fp32 compute).
// SPDX-License-Identifier: MIT
//
// cuBLAS is column-major; a row-major (r x c) matrix is the column-major (c x r) matrix, i.e. its
// transpose, so each row-major product is issued as its transpose:
//   forward  y (N x out) = x W^T      ->  y^T (out x N)  = op_T(W: in x out) * x^T (in x N)
//   dx       (N x in)    = dy W       ->  dx^T (in x N)  = W^T (in x out) * dy^T (out x N)
//   dW       (out x in)  = dy^T x     ->  dW^T (in x out) = x^T (in x N) * op_T(dy^T: out x N)
// The bias is broadcast into y first and the GEMM accumulates onto it (beta = 1); dbias is the
// column sums of dy (deterministic chunked sums, as in batchnorm). The compute type follows the
// exec's precision (blas.cuh): Fp32 matches the CPU to fp32 rounding, Tf32/Bf16 use tensor cores
// with fp32 accumulation. Example: ResNet-50's fc at batch 16: x (16, 2048), W (1000, 2048) -> a
// 1000 x 16 x 2048 GEMM.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ddp/core/cuda_check.hpp"
#include "ddp/kernels/args.hpp"
#include "ddp/kernels/cuda/blas.cuh"
#include "ddp/kernels/cuda/conv2d.cuh"
#include "ddp/kernels/cuda/launch.cuh"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cuda {

namespace detail {

// y[i] = bias[i % out].
template <class T>
struct BroadcastRows {
  const T* bias;
  T* y;
  std::int64_t out;
  __device__ void operator()(std::size_t i) const {
    y[i] = bias[static_cast<std::int64_t>(i) % out];
  }
};

}  // namespace detail

template <class T>
void linear_forward(const Exec<Cuda>& e, const LinearForwardArgs<T, Cuda>& a) {
  validate(a);
  const std::int64_t n = a.x.dim(0), in = a.x.dim(1), out = a.w.dim(0);
  if (!a.bias.empty())
    for_each_index(e, static_cast<std::size_t>(n * out),
                   detail::BroadcastRows<T>{.bias = a.bias.data(), .y = a.y.data(), .out = out});
  detail::gemm<T>(e, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, a.w.data(), in, a.x.data(), in,
                  a.bias.empty() ? T(0) : T(1), a.y.data(), out, e.precision);
}

template <class T>
void linear_backward(const Exec<Cuda>& e, const LinearBackwardArgs<T, Cuda>& a) {
  validate(a);
  const std::int64_t n = a.x.dim(0), in = a.x.dim(1), out = a.w.dim(0);
  if (!a.dx.empty())
    detail::gemm<T>(e, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, a.w.data(), in, a.dy.data(), out, T(0),
                    a.dx.data(), in, e.precision);
  if (!a.dw.empty())
    detail::gemm<T>(e, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, a.x.data(), in, a.dy.data(), out, T(0),
                    a.dw.data(), in, e.precision);
  if (!a.dbias.empty()) detail::channel_sums(e, a.dy.data(), n, out, a.dbias.data());
}

}  // namespace ddp::kernels::cuda
