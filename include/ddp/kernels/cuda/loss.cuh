// CUDA losses with mean reduction: softmax cross-entropy (label smoothing) and MSE; value and
// gradient.
// SPDX-License-Identifier: MIT
//
// Same formulas as kernels/cpu/loss.hpp. Cross-entropy: one block per row of logits; the block
// finds max(z) (block_max), then sum exp(z - max) and sum z (block_sum, in double), writes the
// row's loss to a per-row buffer and, when asked, dz_c = (softmax_c - (1 - s)[c == y] - s / C) / N.
// MSE: a fixed grid of blocks, each summing (x - t)^2 in double over a grid-stride range into one
// partial per block. The host then adds the per-row losses (or per-block partials) in index order,
// so the value is deterministic; reading it back synchronises the exec's stream (these functions
// return the loss). Labels live on the device: a label outside [0, C) is recorded (lowest sample
// index wins, atomicMin) and reported after the kernel as the same ValueError the CPU throws;
// dlogits is then unspecified.
// Example: C = 2, z = (0, 0), y = 1: block max 0, sum exp 2, loss log 2, dz = (0.5, -0.5) / N.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "ddp/core/cuda_check.hpp"
#include "ddp/kernels/args.hpp"
#include "ddp/kernels/cuda/launch.cuh"
#include "ddp/tensor/cuda/allocator.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::kernels::cuda {

namespace detail {

template <class T>
__global__ void cross_entropy_kernel(const T* __restrict__ logits,
                                     const std::int64_t* __restrict__ labels,
                                     T* __restrict__ dlogits, std::int64_t n, std::int64_t c,
                                     double smoothing, double* __restrict__ row_loss,
                                     unsigned long long* __restrict__ bad_row) {
  for (std::int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const T* z = logits + i * c;
    const std::int64_t y = labels[i];
    const bool valid = y >= 0 && y < c;
    if (!valid && threadIdx.x == 0) atomicMin(bad_row, static_cast<unsigned long long>(i));
    double mx = -INFINITY;
    for (std::int64_t k = threadIdx.x; k < c; k += blockDim.x)
      mx = ::fmax(mx, static_cast<double>(z[k]));
    mx = block_max(mx);
    double se = 0.0, sz = 0.0;
    for (std::int64_t k = threadIdx.x; k < c; k += blockDim.x) {
      se += ::exp(static_cast<double>(z[k]) - mx);
      sz += static_cast<double>(z[k]);
    }
    se = block_sum(se);
    sz = block_sum(sz);
    __shared__ double lse_shared;
    if (threadIdx.x == 0) {
      const double lse = mx + ::log(se);
      lse_shared = lse;
      const double nll = valid ? lse - static_cast<double>(z[y]) : 0.0;
      const double smooth = static_cast<double>(c) * lse - sz;
      row_loss[i] = (1.0 - smoothing) * nll + smoothing / static_cast<double>(c) * smooth;
    }
    __syncthreads();
    const double lse = lse_shared;
    if (dlogits) {
      for (std::int64_t k = threadIdx.x; k < c; k += blockDim.x) {
        const double p = ::exp(static_cast<double>(z[k]) - lse);
        const double target = (k == y ? 1.0 - smoothing : 0.0) + smoothing / static_cast<double>(c);
        dlogits[i * c + k] = static_cast<T>((p - target) / static_cast<double>(n));
      }
    }
    __syncthreads();  // lse_shared is rewritten by the next row
  }
}

template <class T>
__global__ void mse_kernel(const T* __restrict__ x, const T* __restrict__ t, T* __restrict__ dx,
                           std::int64_t n, double* __restrict__ partial) {
  double acc = 0.0;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += step) {
    const double d = static_cast<double>(x[i]) - static_cast<double>(t[i]);
    acc += d * d;
    if (dx) dx[i] = static_cast<T>(2.0 * d / static_cast<double>(n));
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

}  // namespace detail

template <class T>
double cross_entropy(const Exec<Cuda>& e, const CrossEntropyArgs<T, Cuda>& a) {
  validate(a);
  const std::int64_t n = a.logits.dim(0), c = a.logits.dim(1);
  const cudaStream_t s = cuda_stream(e);
  const CudaAllocStream on_stream(e);  // temporaries are reused in the order of e's stream
  Tensor<double, Cuda> row_loss(Shape{n});
  Tensor<unsigned long long, Cuda> bad(Shape{1});
  const auto none = static_cast<unsigned long long>(n);
  DDP_CUDA_CHECK(cudaMemcpyAsync(bad.data(), &none, sizeof(none), cudaMemcpyHostToDevice, s));
  const unsigned blocks = static_cast<unsigned>(n < kMaxBlocks ? n : kMaxBlocks);
  detail::cross_entropy_kernel<T><<<blocks, kThreads, 0, s>>>(
      a.logits.data(), a.labels.data(), a.dlogits.empty() ? nullptr : a.dlogits.data(), n, c,
      a.label_smoothing, row_loss.data(), bad.data());
  check_launch("cross_entropy_kernel", s);
  std::vector<double> host(static_cast<std::size_t>(n));
  unsigned long long bad_row = none;
  DDP_CUDA_CHECK(cudaMemcpyAsync(host.data(), row_loss.data(), host.size() * sizeof(double),
                                 cudaMemcpyDeviceToHost, s));
  DDP_CUDA_CHECK(cudaMemcpyAsync(&bad_row, bad.data(), sizeof(bad_row), cudaMemcpyDeviceToHost, s));
  DDP_CUDA_CHECK(cudaStreamSynchronize(s));
  if (bad_row < none) {
    std::int64_t label = 0;
    DDP_CUDA_CHECK(
        cudaMemcpy(&label, a.labels.data() + bad_row, sizeof(label), cudaMemcpyDeviceToHost));
    throw label_out_of_range(label, static_cast<std::int64_t>(bad_row), c);
  }
  double total = 0.0;
  for (double l : host) total += l;
  return total / static_cast<double>(n);
}

template <class T>
double mse(const Exec<Cuda>& e, const MseArgs<T, Cuda>& a) {
  validate(a);
  const std::int64_t n = a.x.numel();
  const cudaStream_t s = cuda_stream(e);
  const unsigned blocks = grid_for(n) < 1024u ? grid_for(n) : 1024u;
  const CudaAllocStream on_stream(e);  // temporaries are reused in the order of e's stream
  Tensor<double, Cuda> partial(Shape{static_cast<std::int64_t>(blocks)});
  detail::mse_kernel<T><<<blocks, kThreads, 0, s>>>(
      a.x.data(), a.target.data(), a.dx.empty() ? nullptr : a.dx.data(), n, partial.data());
  check_launch("mse_kernel", s);
  std::vector<double> host(blocks);
  DDP_CUDA_CHECK(cudaMemcpyAsync(host.data(), partial.data(), blocks * sizeof(double),
                                 cudaMemcpyDeviceToHost, s));
  DDP_CUDA_CHECK(cudaStreamSynchronize(s));
  double total = 0.0;
  for (double p : host) total += p;
  return total / static_cast<double>(n);
}

}  // namespace ddp::kernels::cuda
