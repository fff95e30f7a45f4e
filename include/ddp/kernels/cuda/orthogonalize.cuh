// Column orthonormalisation of many small row-major matrices in one launch, one block per matrix:
// PowerSGD's P and Q (parallel/cuda/powersgd.cuh, --comm-hook powersgd). The CPU hook's steps
// (parallel/powersgd.hpp) with block-tree sums, so the result follows the CPU to rounding, not bit
// for bit (docs/decisions/0029). nvcc only.
// SPDX-License-Identifier: MIT
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ddp/kernels/cuda/launch.cuh"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cuda {

// One job per matrix, kOrthogonalizeJobFields int64 each: the (rows x cols) row-major matrix at
// `offset` in the kernel's base buffer and, for cols > 2, its Householder scratch (2 rows cols
// doubles) at `work_offset`. A Q job is (the PowerSGD matrix's cols x r), a P job (rows x r).
inline constexpr int kOrthogonalizeJobFields = 4;  // offset, rows, cols, work_offset

// Sum of v over the block, valid in every thread: a fixed tree (the same order every run).
// blockDim.x must be kThreads (a power of two), red that many doubles of shared memory.
template <class V>
__device__ V block_sum_fixed_tree(V v, V* red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  const V r = red[0];
  __syncthreads();
  return r;
}

// parallel::detail::gram_schmidt (parallel/powersgd.hpp) by one block: the same operations in the
// same order per column, each sum over rows a block tree instead of a sequential loop (so equal to
// rounding, not bit for bit). Row j belongs to thread j % blockDim.x throughout, so the only
// cross-thread data are the block sums.
template <class T>
__device__ void gram_schmidt_block(T* a, std::int64_t rows, std::int64_t cols, double eps,
                                   double* red) {
  const std::int64_t t0 = threadIdx.x, dt = blockDim.x;
  for (std::int64_t i = 0; i < cols; ++i) {
    double sq = 0;
    for (std::int64_t j = t0; j < rows; j += dt)
      sq += double(a[j * cols + i]) * double(a[j * cols + i]);
    const double norm = sqrt(block_sum_fixed_tree(sq, red)) + eps;
    const double inv = norm > 0 ? 1.0 / norm : 0.0;
    for (std::int64_t j = t0; j < rows; j += dt)
      a[j * cols + i] = static_cast<T>(double(a[j * cols + i]) * inv);
    for (std::int64_t c = i + 1; c < cols; ++c) {
      double dot = 0;
      for (std::int64_t j = t0; j < rows; j += dt)
        dot += double(a[j * cols + i]) * double(a[j * cols + c]);
      dot = block_sum_fixed_tree(dot, red);
      for (std::int64_t j = t0; j < rows; j += dt)
        a[j * cols + c] = static_cast<T>(double(a[j * cols + c]) - dot * double(a[j * cols + i]));
    }
  }
}

// parallel::detail::householder_orthonormalize (parallel/powersgd.hpp) by one block, in double in
// `work` (v: the reflectors, r: the matrix being reduced, then the thin Q built in its place). Same
// steps as the CPU's; rows >= cols.
template <class T>
__device__ void householder_block(T* a, std::int64_t rows, std::int64_t cols, double* work,
                                  double* red) {
  const std::int64_t t0 = threadIdx.x, dt = blockDim.x;
  double* v = work;
  double* r = work + rows * cols;
  for (std::int64_t i = t0; i < rows; i += dt)
    for (std::int64_t j = 0; j < cols; ++j) {
      r[i * cols + j] = double(a[i * cols + j]);
      v[i * cols + j] = 0;
    }
  // Reflector k: v_k (column k of v, rows k..), H_k = I - 2 v_k v_k^T, zeroes r[k+1.., k].
  for (std::int64_t k = 0; k < cols; ++k) {
    // This thread's first row >= k (its rows are t0, t0 + dt, ...).
    const std::int64_t first = t0 >= k ? t0 : t0 + ((k - t0 + dt - 1) / dt) * dt;
    double sq = 0;
    for (std::int64_t i = first; i < rows; i += dt) sq += r[i * cols + k] * r[i * cols + k];
    const double norm = sqrt(block_sum_fixed_tree(sq, red));
    if (norm == 0) continue;  // nothing to reflect: v_k = 0 (the same in every thread)
    const double alpha = r[k * cols + k] > 0 ? -norm : norm;
    double vsq = 0;
    for (std::int64_t i = first; i < rows; i += dt) {
      v[i * cols + k] = r[i * cols + k] - (i == k ? alpha : 0.0);
      vsq += v[i * cols + k] * v[i * cols + k];
    }
    const double vnorm = sqrt(block_sum_fixed_tree(vsq, red));
    for (std::int64_t i = first; i < rows; i += dt) v[i * cols + k] /= vnorm;
    for (std::int64_t j = k; j < cols; ++j) {
      double dot = 0;
      for (std::int64_t i = first; i < rows; i += dt) dot += v[i * cols + k] * r[i * cols + j];
      dot = block_sum_fixed_tree(dot, red);
      for (std::int64_t i = first; i < rows; i += dt) r[i * cols + j] -= 2 * dot * v[i * cols + k];
    }
  }
  // Thin Q = H_0 H_1 ... H_{cols-1} applied to the first cols columns of the identity (in r's
  // place).
  for (std::int64_t i = t0; i < rows; i += dt)
    for (std::int64_t j = 0; j < cols; ++j) r[i * cols + j] = i == j ? 1.0 : 0.0;
  for (std::int64_t k = cols - 1; k >= 0; --k) {
    const std::int64_t first = t0 >= k ? t0 : t0 + ((k - t0 + dt - 1) / dt) * dt;
    for (std::int64_t j = 0; j < cols; ++j) {
      double dot = 0;
      for (std::int64_t i = first; i < rows; i += dt) dot += v[i * cols + k] * r[i * cols + j];
      dot = block_sum_fixed_tree(dot, red);
      for (std::int64_t i = first; i < rows; i += dt) r[i * cols + j] -= 2 * dot * v[i * cols + k];
    }
  }
  for (std::int64_t i = t0; i < rows; i += dt)
    for (std::int64_t j = 0; j < cols; ++j) a[i * cols + j] = static_cast<T>(r[i * cols + j]);
}

// parallel::detail::orthogonalize (parallel/powersgd.hpp) for every job, one block each:
// Gram-Schmidt for up to 2 columns, Householder above, as the CPU hook and torch 1.13.
template <class T>
__global__ void orthogonalize_columns_kernel(T* base, const std::int64_t* jobs, double* work,
                                             double eps) {
  __shared__ double red[kThreads];
  const std::int64_t* job = jobs + static_cast<std::int64_t>(blockIdx.x) * kOrthogonalizeJobFields;
  T* a = base + job[0];
  if (job[2] <= 2)
    gram_schmidt_block(a, job[1], job[2], eps, red);
  else
    householder_block(a, job[1], job[2], work + job[3], red);
}

// Orthonormalises the columns of the `n` matrices `jobs` names in base (one block each), on exec's
// stream. jobs: device memory, n x kOrthogonalizeJobFields; work: the Householder scratch the jobs'
// work_offsets index.
template <class T>
void orthogonalize_columns(const Exec<Cuda>& exec, T* base, const std::int64_t* jobs, unsigned n,
                           double* work, double eps) {
  if (n == 0) return;
  orthogonalize_columns_kernel<T><<<n, kThreads, 0, cuda_stream(exec)>>>(base, jobs, work, eps);
  check_launch("orthogonalize_columns_kernel", cuda_stream(exec));
}

}  // namespace ddp::kernels::cuda
