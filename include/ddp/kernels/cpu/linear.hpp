// CPU fully connected layer: y = x W^T + b and its gradients, as GEMMs.
// SPDX-License-Identifier: MIT
//
//   forward:  y (N x out) = x (N x in) * W^T (in x out) + b
//   backward: dx (N x in) = dy (N x out) * W (out x in);  dW (out x in) = dy^T (out x N) * x (N x
//     in);
//             db = column sums of dy.
// Example: ResNet-18's fc, x (16, 512), W (1000, 512): forward is a 16x1000x512 GEMM (16 MFLOP).
#pragma once

#include <algorithm>
#include <cstdint>

#include "ddp/kernels/args.hpp"
#include "ddp/kernels/cpu/gemm.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cpu {

template <class T>
void linear_forward(const Exec<Cpu>& exec, const LinearForwardArgs<T, Cpu>& a) {
  validate(a);
  const std::int64_t n = a.x.dim(0), in = a.x.dim(1), out = a.w.dim(0);
  T* y = a.y.data();
  if (!a.bias.empty()) {
    for (std::int64_t i = 0; i < n; ++i) std::copy(a.bias.data(), a.bias.data() + out, y + i * out);
  }
  gemm(exec, Trans::No, Trans::Yes, n, out, in, T(1), a.x.data(), in, a.w.data(), in,
       a.bias.empty() ? T(0) : T(1), y, out);
}

template <class T>
void linear_backward(const Exec<Cpu>& exec, const LinearBackwardArgs<T, Cpu>& a) {
  validate(a);
  const std::int64_t n = a.x.dim(0), in = a.x.dim(1), out = a.w.dim(0);
  const T* dy = a.dy.data();
  if (!a.dx.empty())
    gemm(exec, Trans::No, Trans::No, n, in, out, T(1), dy, out, a.w.data(), in, T(0), a.dx.data(),
         in);
  if (!a.dw.empty())
    gemm(exec, Trans::Yes, Trans::No, out, in, n, T(1), dy, out, a.x.data(), in, T(0), a.dw.data(),
         in);
  if (!a.dbias.empty()) {
    T* db = a.dbias.data();
    std::fill(db, db + out, T(0));
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t o = 0; o < out; ++o) db[o] += dy[i * out + o];
  }
}

}  // namespace ddp::kernels::cpu
