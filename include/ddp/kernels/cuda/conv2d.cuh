// CUDA conv2d in NHWC/KRSC: forward, backward-data and backward-weight as implicit GEMMs (SIMT fp32
// tiles).
// SPDX-License-Identifier: MIT
//
// The three products of kernels/cpu/conv2d.hpp without materialising col, as the operand-map
// problems of kernels/conv_gemm_maps.hpp (dgrad: one problem per stride phase, so no product by a
// tap that cannot reach the pixel; the maps are host-callable and tested on the CPU).
// implicit_gemm_kernel tiles C into 64x64 blocks, stages 16-deep slices of A and B in shared
// memory, and gives each of its 256 threads a 4x4 register tile (rows ty + 16i, columns tx + 16j:
// a warp's shared reads hit distinct banks). Edges are predicated: no size must divide the tile.
// A long reduction with a small output (wgrad of ResNet's layer1 at batch 16: K = N*P = 50,176,
// 9 x 1 tiles) is split over blockIdx.z into partials that a second kernel adds in split order
// (deterministic, no atomics).
// 1x1 stride-1 unpadded convs without bias are cuBLAS GEMMs (blas.cuh). With cuDNN
// (DDP_WITH_CUDNN) the other convs go to cuDNN unless the exec's ConvImpl is Own
// (docs/decisions/0052); these kernels are the reference and the path without cuDNN. float only
// (docs/decisions/0024); accumulation is always fp32. The exec's Precision picks the arithmetic:
//   Fp32  the SIMT kernel (exact FMAs; matches the CPU up to summation order)
//   Tf32  the same tiles on tensor cores (wmma m16n16k8), cuBLAS in FAST_TF32 mode
//   Bf16  the same tiles on tensor cores (wmma m16n16k16), cuBLAS in FAST_16BF mode
// Operands are rounded to tf32/bf16 only as they are staged in shared memory, so on float tensors
// Bf16 saves tensor-core time, not memory. bf16 activations (Conv2dForwardArgs<float, Cuda,
// bfloat16>, docs/decisions/0072): the cuBLAS 1x1 and cuDNN convs read the bf16 tensors directly,
// with a per-call bf16 copy of the weight; the rest goes through kernels/bf16_storage.hpp
// (conv2d_bf16_native says which).
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ddp/config.hpp"
#include "ddp/core/cuda_check.hpp"
#include "ddp/core/dtype.hpp"
#include "ddp/kernels/args.hpp"
#include "ddp/kernels/conv_gemm_maps.hpp"
#include "ddp/kernels/cuda/batchnorm.cuh"
#include "ddp/kernels/cuda/blas.cuh"
#include "ddp/kernels/cuda/launch.cuh"
#include "ddp/kernels/cuda/op_profile.cuh"
#include "ddp/kernels/elementwise.hpp"
#include "ddp/kernels/geometry.hpp"
#if DDP_WITH_CUDNN
#  include "ddp/kernels/cuda/cudnn_conv.hpp"
#endif
#include "ddp/tensor/conv_impl.hpp"
#include "ddp/tensor/cuda/allocator.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::kernels::cuda {

// Alias: cuda::conv2d_forward(e, a, ConvMath::Tf32) overrides the exec's precision for one call.
using ConvMath = Precision;

namespace detail {

inline constexpr int kTileM = 64, kTileN = 64, kTileK = 16, kGemmThreads = 256;

// C = A * B for problem P over k in [z * k_per_split, (z + 1) * k_per_split), z = blockIdx.z.
// partial == nullptr: store through P; else write partial[z][m][n] for the reduce kernel.
template <class T, class P>
__global__ void __launch_bounds__(kGemmThreads)
    implicit_gemm_kernel(P p, std::int64_t m_size, std::int64_t n_size, std::int64_t k_size,
                         std::int64_t k_per_split, float* __restrict__ partial) {
  __shared__ float as[kTileK][kTileM + 1];
  __shared__ float bs[kTileK][kTileN + 1];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const std::int64_t m0 = static_cast<std::int64_t>(blockIdx.x) * kTileM;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.y) * kTileN;
  const std::int64_t kb = static_cast<std::int64_t>(blockIdx.z) * k_per_split;
  const std::int64_t ke = kb + k_per_split < k_size ? kb + k_per_split : k_size;
  float acc[4][4] = {};
  for (std::int64_t k0 = kb; k0 < ke; k0 += kTileK) {
#pragma unroll
    for (int i = 0; i < (kTileM * kTileK) / kGemmThreads; ++i) {
      const int e = tid + i * kGemmThreads;
      const int mm = e / kTileK, kk = e % kTileK;  // A: 16 threads read 16 consecutive k of one row
      const std::int64_t m = m0 + mm, k = k0 + kk;
      as[kk][mm] = (m < m_size && k < ke) ? static_cast<float>(p.a(m, k)) : 0.f;
      const int nn = e % kTileN, kb2 = e / kTileN;  // B: a warp reads 32 consecutive n of one k
      const std::int64_t n = n0 + nn, k2 = k0 + kb2;
      bs[kb2][nn] = (n < n_size && k2 < ke) ? static_cast<float>(p.b(k2, n)) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTileK; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = as[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = bs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const std::int64_t m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
      if (m >= m_size || n >= n_size) continue;
      if (partial)
        partial[(static_cast<std::int64_t>(blockIdx.z) * m_size + m) * n_size + n] = acc[i][j];
      else
        p.store(m, n, static_cast<T>(acc[i][j]));
    }
}

template <class T, class P>
__global__ void implicit_gemm_reduce_kernel(P p, std::int64_t m_size, std::int64_t n_size,
                                            int splits, const float* __restrict__ partial) {
  const std::int64_t total = m_size * n_size;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    float s = 0.f;
    for (int z = 0; z < splits; ++z) s += partial[z * total + i];
    p.store(i / n_size, i % n_size, static_cast<T>(s));
  }
}

// The same tile on tensor cores (TF32 operands, fp32 accumulation). Each of the 8 warps owns a
// 16 x 32 strip (warp w: rows 16 (w % 4), columns 32 (w / 4)); the accumulators go through shared
// memory so the epilogue can predicate edges like the SIMT kernel. Relative error vs fp32 ~1e-3
// (TF32 keeps 10 mantissa bits).
template <class T, class P>
__global__ void __launch_bounds__(kGemmThreads)
    implicit_gemm_tf32_kernel(P p, std::int64_t m_size, std::int64_t n_size, std::int64_t k_size,
                              std::int64_t k_per_split, float* __restrict__ partial) {
  namespace wmma = nvcuda::wmma;
  // a multiple of 4 floats (wmma) whose 16-row offsets stay 32-byte aligned
  constexpr int kLd = kTileM + 4;
  __shared__ __align__(32) float as[kTileK][kLd];  // as[k][m]: A column-major
  __shared__ __align__(32) float bs[kTileK][kLd];  // bs[k][n]: B row-major
  __shared__ __align__(32) float cs[kTileM][kLd];
  const int tid = threadIdx.x, warp = tid / 32;
  const int fr = warp % 4, fc = (warp / 4) * 2;
  const std::int64_t m0 = static_cast<std::int64_t>(blockIdx.x) * kTileM;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.y) * kTileN;
  const std::int64_t kb = static_cast<std::int64_t>(blockIdx.z) * k_per_split;
  const std::int64_t ke = kb + k_per_split < k_size ? kb + k_per_split : k_size;
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc[2];
  wmma::fill_fragment(acc[0], 0.f);
  wmma::fill_fragment(acc[1], 0.f);
  for (std::int64_t k0 = kb; k0 < ke; k0 += kTileK) {
#pragma unroll
    for (int i = 0; i < (kTileM * kTileK) / kGemmThreads; ++i) {
      const int e = tid + i * kGemmThreads;
      const int mm = e / kTileK, kk = e % kTileK;
      const std::int64_t m = m0 + mm, k = k0 + kk;
      as[kk][mm] =
          wmma::__float_to_tf32((m < m_size && k < ke) ? static_cast<float>(p.a(m, k)) : 0.f);
      const int nn = e % kTileN, kb2 = e / kTileN;
      const std::int64_t n = n0 + nn, k2 = k0 + kb2;
      bs[kb2][nn] =
          wmma::__float_to_tf32((n < n_size && k2 < ke) ? static_cast<float>(p.b(k2, n)) : 0.f);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 8) {
      wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::col_major> af;
      wmma::load_matrix_sync(af, &as[kk][16 * fr], kLd);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> bf;
        wmma::load_matrix_sync(bf, &bs[kk][16 * (fc + j)], kLd);
        wmma::mma_sync(acc[j], af, bf, acc[j]);
      }
    }
    __syncthreads();
  }
  wmma::store_matrix_sync(&cs[16 * fr][16 * fc], acc[0], kLd, wmma::mem_row_major);
  wmma::store_matrix_sync(&cs[16 * fr][16 * (fc + 1)], acc[1], kLd, wmma::mem_row_major);
  __syncthreads();
  for (int e = tid; e < kTileM * kTileN; e += kGemmThreads) {
    const std::int64_t m = m0 + e / kTileN, n = n0 + e % kTileN;
    if (m >= m_size || n >= n_size) continue;
    const float v = cs[e / kTileN][e % kTileN];
    if (partial)
      partial[(static_cast<std::int64_t>(blockIdx.z) * m_size + m) * n_size + n] = v;
    else
      p.store(m, n, static_cast<T>(v));
  }
}

// The same tile with bf16 operands (round to nearest even; wmma m16n16k16, fp32 accumulation): a
// 16-deep k-slice is one mma step. Warp layout, epilogue and split-K as in the TF32 kernel.
// Relative error vs fp32 ~4e-3 per product (8 significant bits), averaging out over long sums.
template <class T, class P>
__global__ void __launch_bounds__(kGemmThreads)
    implicit_gemm_bf16_kernel(P p, std::int64_t m_size, std::int64_t n_size, std::int64_t k_size,
                              std::int64_t k_per_split, float* __restrict__ partial) {
  namespace wmma = nvcuda::wmma;
  // bf16 elements: a multiple of 8 (wmma); 16-column offsets stay 32-byte aligned
  constexpr int kLdh = kTileM + 8;
  constexpr int kLd = kTileM + 4;  // float accumulator staging, as in the TF32 kernel
  __shared__ __align__(32) __nv_bfloat16 as[kTileK][kLdh];  // as[k][m]: A column-major
  __shared__ __align__(32) __nv_bfloat16 bs[kTileK][kLdh];  // bs[k][n]: B row-major
  __shared__ __align__(32) float cs[kTileM][kLd];
  const int tid = threadIdx.x, warp = tid / 32;
  const int fr = warp % 4, fc = (warp / 4) * 2;
  const std::int64_t m0 = static_cast<std::int64_t>(blockIdx.x) * kTileM;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.y) * kTileN;
  const std::int64_t kb = static_cast<std::int64_t>(blockIdx.z) * k_per_split;
  const std::int64_t ke = kb + k_per_split < k_size ? kb + k_per_split : k_size;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2];
  wmma::fill_fragment(acc[0], 0.f);
  wmma::fill_fragment(acc[1], 0.f);
  for (std::int64_t k0 = kb; k0 < ke; k0 += kTileK) {
#pragma unroll
    for (int i = 0; i < (kTileM * kTileK) / kGemmThreads; ++i) {
      const int e = tid + i * kGemmThreads;
      const int mm = e / kTileK, kk = e % kTileK;
      const std::int64_t m = m0 + mm, k = k0 + kk;
      as[kk][mm] =
          __float2bfloat16_rn((m < m_size && k < ke) ? static_cast<float>(p.a(m, k)) : 0.f);
      const int nn = e % kTileN, kb2 = e / kTileN;
      const std::int64_t n = n0 + nn, k2 = k0 + kb2;
      bs[kb2][nn] =
          __float2bfloat16_rn((n < n_size && k2 < ke) ? static_cast<float>(p.b(k2, n)) : 0.f);
    }
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::col_major> af;
    wmma::load_matrix_sync(af, &as[0][16 * fr], kLdh);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> bf;
      wmma::load_matrix_sync(bf, &bs[0][16 * (fc + j)], kLdh);
      wmma::mma_sync(acc[j], af, bf, acc[j]);
    }
    __syncthreads();
  }
  wmma::store_matrix_sync(&cs[16 * fr][16 * fc], acc[0], kLd, wmma::mem_row_major);
  wmma::store_matrix_sync(&cs[16 * fr][16 * (fc + 1)], acc[1], kLd, wmma::mem_row_major);
  __syncthreads();
  for (int e = tid; e < kTileM * kTileN; e += kGemmThreads) {
    const std::int64_t m = m0 + e / kTileN, n = n0 + e % kTileN;
    if (m >= m_size || n >= n_size) continue;
    const float v = cs[e / kTileN][e % kTileN];
    if (partial)
      partial[(static_cast<std::int64_t>(blockIdx.z) * m_size + m) * n_size + n] = v;
    else
      p.store(m, n, static_cast<T>(v));
  }
}

// Splits the reduction when the output has too few tiles to fill the GPU.
template <class T, class P>
void run_implicit_gemm(const Exec<Cuda>& e, const P& p, ConvMath math) {
  const std::int64_t m = p.m_size(), n = p.n_size(), k = p.k_size();
  const std::int64_t tiles = ((m + kTileM - 1) / kTileM) * ((n + kTileN - 1) / kTileN);
  // Aim for ~512 blocks (about 4 per SM on an H100), each keeping >= 256 of the reduction.
  std::int64_t splits = std::clamp<std::int64_t>(512 / std::max<std::int64_t>(tiles, 1), 1, 64);
  splits = std::min(splits, std::max<std::int64_t>(k / 256, 1));
  const std::int64_t per = ((k + splits - 1) / splits + kTileK - 1) / kTileK * kTileK;
  splits = (k + per - 1) / per;
  const dim3 grid(static_cast<unsigned>((m + kTileM - 1) / kTileM),
                  static_cast<unsigned>((n + kTileN - 1) / kTileN), static_cast<unsigned>(splits));
  const cudaStream_t s = cuda_stream(e);
  const CudaAllocStream on_stream(e);  // the split-K partials are reused in the order of e's stream
  Tensor<float, Cuda> partial;
  if (splits > 1) partial = Tensor<float, Cuda>(Shape{splits, m, n});
  if (math == Precision::Tf32)
    implicit_gemm_tf32_kernel<T, P><<<grid, kGemmThreads, 0, s>>>(p, m, n, k, per, partial.data());
  else if (math == Precision::Bf16)
    implicit_gemm_bf16_kernel<T, P><<<grid, kGemmThreads, 0, s>>>(p, m, n, k, per, partial.data());
  else
    implicit_gemm_kernel<T, P><<<grid, kGemmThreads, 0, s>>>(p, m, n, k, per, partial.data());
  check_launch(math == Precision::Tf32   ? "implicit_gemm_tf32_kernel"
               : math == Precision::Bf16 ? "implicit_gemm_bf16_kernel"
                                         : "implicit_gemm_kernel",
               s);
  if (splits == 1) return;
  implicit_gemm_reduce_kernel<T, P>
      <<<grid_for(m * n), kThreads, 0, s>>>(p, m, n, static_cast<int>(splits), partial.data());
  check_launch("implicit_gemm_reduce_kernel", s);
}

// dx of conv g, one implicit GEMM per stride phase. A phase no tap reaches (a 1x1 stride-2 conv's
// odd rows and columns) has gradient 0: dx is cleared first (left as is when accumulating).
template <class T>
void run_dgrad_phases(const Exec<Cuda>& e, const ConvGeometry& g, const T* dy, const T* w, T* dx,
                      ConvMath math, bool accumulate) {
  const std::vector<DgradPhase> phases = dgrad_phases(g);
  for (const DgradPhase& q : phases)
    if (q.taps() == 0 && !accumulate) {
      DDP_CUDA_CHECK(cudaMemsetAsync(
          dx, 0, static_cast<std::size_t>(g.n * g.h * g.w * g.c) * sizeof(T), cuda_stream(e)));
      break;
    }
  for (const DgradPhase& q : phases)
    if (q.taps() > 0 && q.nh > 0 && q.nw > 0)
      run_implicit_gemm<T>(
          e,
          ConvDgradPhaseMap<T>{
              .dy = dy, .w = w, .dx = dx, .g = g, .q = q, .accumulate = accumulate},
          math);
}

// out[c] = sum over rows of v (rows, c): deterministic chunked sums (batchnorm.cuh's kernel).
template <class T>
__global__ void channel_sum_finalize_kernel(const double* __restrict__ partial, std::int64_t chunks,
                                            std::int64_t c, T* __restrict__ out) {
  const std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= c) return;
  double s = 0.0;
  for (std::int64_t j = 0; j < chunks; ++j) s += partial[j * c + k];
  out[k] = static_cast<T>(s);
}

template <class T>
void channel_sums(const Exec<Cuda>& e, const T* v, std::int64_t rows, std::int64_t c, T* out) {
  const BnGrid g = bn_grid(rows, c);
  const CudaAllocStream on_stream(e);  // freed while the kernels below may still run on e's stream
  Tensor<double, Cuda> partial(Shape{g.chunks, c});
  const cudaStream_t s = cuda_stream(e);
  channel_partial_kernel<T, BnSum::X><<<g.grid, g.block, 0, s>>>(
      v, nullptr, nullptr, nullptr, nullptr, rows, c, g.rows_per_chunk, partial.data(), nullptr);
  check_launch("channel_partial_kernel<BnSum::X>", s);
  channel_sum_finalize_kernel<T><<<grid_for(c), kThreads, 0, s>>>(partial.data(), g.chunks, c, out);
  check_launch("channel_sum_finalize_kernel", s);
}

// A 1x1, stride-1, unpadded conv is a plain GEMM over the batch's N*P pixel rows: x itself is (N*P
// x C), so all three products go to cuBLAS (ResNet-50/152's bottlenecks are two-thirds such convs).
inline bool cublas_pointwise(const ConvGeometry& g) {
  return g.pointwise() && g.n * g.h * g.w <= 2147483647;  // cuBLAS takes int sizes
}

// float only (docs/decisions/0024): the tiles stage and accumulate in float, so a double conv
// would silently compute in single precision (its cuBLAS 1x1s in double).
template <class T>
constexpr void require_float() {
  static_assert(
      std::is_same_v<T, float>,
      "ddp: conv2d on CUDA computes in float only: its implicit-GEMM kernels stage and accumulate "
      "in "
      "float, so a double model would not get double precision (docs/decisions/0024). Use float on "
      "the GPU (Conv2d<float, Cuda>, ResNet<float, Cuda>); for double-precision references run the "
      "model "
      "on the CPU (Cpu).");
}

// Whether conv g goes to cuDNN (docs/decisions/0052): built with it, not asked for ddp's own
// kernels, and describable. Throws for a cuDNN mode without cuDNN.
inline bool use_cudnn(const Exec<Cuda>& e, [[maybe_unused]] const ConvGeometry& g) {
  if (resolve_conv_impl(e.conv) == ConvImpl::Own) return false;
#if DDP_WITH_CUDNN
  return cudnn::describable(g);
#else
  return false;  // not reached: without cuDNN every mode resolves to Own or throws
#endif
}

// e computing at `math` (the explicit-precision entry points below override the exec's).
inline Exec<Cuda> at_precision(Exec<Cuda> e, Precision math) {
  e.precision = math;
  return e;
}

}  // namespace detail

template <class T>
void conv2d_forward(const Exec<Cuda>& e, const Conv2dForwardArgs<T, Cuda>& a, Precision math) {
  detail::require_float<T>();
  require_conv_precision(math);
  validate(a);
  const ConvGeometry g = conv_geometry(a.x, a.w, a.stride, a.padding, a.dilation);
  // y (NP x K) = x (NP x C) w^T, as linear_forward
  if (detail::cublas_pointwise(g) && a.bias.empty()) {
    op_phase(e, "fprop.cublas");  // op_profile.cuh: which library runs this pass
    detail::gemm<T>(e, CUBLAS_OP_T, CUBLAS_OP_N, g.k, g.n * g.h * g.w, g.c, a.w.data(), g.c,
                    a.x.data(), g.c, T(0), a.y.data(), g.k, math);
    return;
  }
  if (detail::use_cudnn(e, g)) {  // never true without cuDNN
#if DDP_WITH_CUDNN
    op_phase(e, "fprop.cudnn");
    cudnn::forward(detail::at_precision(e, math), g, a.x.data(), a.w.data(),
                   a.bias.empty() ? nullptr : a.bias.data(), a.y.data());
    return;
#endif
  }
  op_phase(e, "fprop.own");
  detail::run_implicit_gemm<T>(e,
                               ConvFpropMap<T>{.x = a.x.data(),
                                               .w = a.w.data(),
                                               .bias = a.bias.empty() ? nullptr : a.bias.data(),
                                               .y = a.y.data(),
                                               .g = g},
                               math);
}

template <class T>
void conv2d_backward(const Exec<Cuda>& e, const Conv2dBackwardArgs<T, Cuda>& a, Precision math) {
  detail::require_float<T>();
  require_conv_precision(math);
  validate(a);
  const ConvGeometry g = conv_geometry(a.x, a.w, a.stride, a.padding, a.dilation);
  const bool pw = detail::cublas_pointwise(g);
  const std::int64_t np = g.n * g.ho * g.wo;
  if (!pw && detail::use_cudnn(e, g)) {  // never true without cuDNN
#if DDP_WITH_CUDNN
    const Exec<Cuda> em = detail::at_precision(e, math);
    op_phase(e, "dgrad.cudnn");
    if (!a.dx.empty())
      cudnn::backward_data(em, g, a.dy.data(), a.w.data(), a.dx.data(), a.accumulate_dx);
    op_phase(e, "wgrad.cudnn");
    if (!a.dw.empty()) cudnn::backward_filter(em, g, a.x.data(), a.dy.data(), a.dw.data());
#endif
  } else {
    op_phase(e, pw ? "dgrad.cublas" : "dgrad.own");
    if (!a.dx.empty() && pw)  // dx (NP x C) = dy (NP x K) w (K x C)
      detail::gemm<T>(e, CUBLAS_OP_N, CUBLAS_OP_N, g.c, np, g.k, a.w.data(), g.c, a.dy.data(), g.k,
                      a.accumulate_dx ? T(1) : T(0), a.dx.data(), g.c, math);
    else if (!a.dx.empty())
      detail::run_dgrad_phases<T>(e, g, a.dy.data(), a.w.data(), a.dx.data(), math,
                                  a.accumulate_dx);
    op_phase(e, pw ? "wgrad.cublas" : "wgrad.own");
    if (!a.dw.empty() && pw)  // dw (K x C) = dy^T (K x NP) x (NP x C)
      detail::gemm<T>(e, CUBLAS_OP_N, CUBLAS_OP_T, g.c, g.k, np, a.x.data(), g.c, a.dy.data(), g.k,
                      T(0), a.dw.data(), g.c, math);
    else if (!a.dw.empty())
      detail::run_implicit_gemm<T>(
          e, ConvWgradMap<T>{.x = a.x.data(), .dy = a.dy.data(), .dw = a.dw.data(), .g = g}, math);
  }
  if (!a.dbias.empty()) detail::channel_sums(e, a.dy.data(), np, g.k, a.dbias.data());
}

}  // namespace ddp::kernels::cuda

namespace ddp::kernels::cuda {

// At the exec's precision (what Kernels<Cuda> calls).
template <class T>
void conv2d_forward(const Exec<Cuda>& e, const Conv2dForwardArgs<T, Cuda>& a) {
  conv2d_forward(e, a, e.precision);
}
template <class T>
void conv2d_backward(const Exec<Cuda>& e, const Conv2dBackwardArgs<T, Cuda>& a) {
  conv2d_backward(e, a, e.precision);
}

}  // namespace ddp::kernels::cuda

namespace ddp::kernels::cuda {

namespace detail {

// w rounded to bf16 (nearest even, as Bf16Storage's operand()) in a caching-allocator temporary,
// for cuDNN and cuBLAS. Once per call (a per-step cache would save a cast pass per call).
inline Tensor<bfloat16, Cuda> bf16_weight(const Exec<Cuda>& e, TensorView<const float, Cuda> w) {
  const CudaAllocStream on_stream(e);
  Tensor<bfloat16, Cuda> out(w.shape());
  for_each_index(e, static_cast<std::size_t>(w.numel()),
                 Bf16Narrow{.x = w.data(), .y = out.data()});
  return out;
}

// Whether conv g on bf16 tensors runs natively: no bias (cuDNN adds it after rounding y, the host
// model rounds once after the add), and a cuBLAS 1x1, or a cuDNN conv with a bf16 algorithm for
// the wanted passes (forward; or backward-data and backward-filter); else the widening path.
inline bool bf16_native(const Exec<Cuda>& e, const ConvGeometry& g, bool bias,
                        [[maybe_unused]] bool fprop, [[maybe_unused]] bool dgrad,
                        [[maybe_unused]] bool wgrad) {
  if (bias) return false;
  if (cublas_pointwise(g)) return true;
  if (!use_cudnn(e, g)) return false;
#if DDP_WITH_CUDNN
  const auto has = [&](cudnn::Op op) {
    return cudnn::has_algorithm(e, op, g, CUDNN_DATA_BFLOAT16);
  };
  return (!fprop || has(cudnn::Op::Forward)) && (!dgrad || has(cudnn::Op::BackwardData)) &&
         (!wgrad || has(cudnn::Op::BackwardFilter));
#else
  return false;  // not reached: use_cudnn is false without cuDNN
#endif
}

}  // namespace detail

// Whether Kernels<Cuda> runs a bf16-activation conv natively (below) or through Bf16Storage.
inline bool conv2d_bf16_native(const Exec<Cuda>& e,
                               const Conv2dForwardArgs<float, Cuda, bfloat16>& a) {
  validate(a);
  return detail::bf16_native(e, conv_geometry(a.x, a.w, a.stride, a.padding, a.dilation),
                             !a.bias.empty(), true, false, false);
}
inline bool conv2d_bf16_native(const Exec<Cuda>& e,
                               const Conv2dBackwardArgs<float, Cuda, bfloat16>& a) {
  validate(a);
  return detail::bf16_native(e, conv_geometry(a.x, a.w, a.stride, a.padding, a.dilation),
                             !a.dbias.empty(), false, !a.dx.empty(), !a.dw.empty());
}

// y (bf16) = conv(x, bf16(w)), fp32 accumulation, one rounding. Requires conv2d_bf16_native(e, a).
inline void conv2d_forward(const Exec<Cuda>& e, const Conv2dForwardArgs<float, Cuda, bfloat16>& a) {
  validate(a);
  const ConvGeometry g = conv_geometry(a.x, a.w, a.stride, a.padding, a.dilation);
  const CudaAllocStream on_stream(e);  // the weight copy is reused in the order of e's stream
  const Tensor<bfloat16, Cuda> w = detail::bf16_weight(e, a.w);
  if (detail::cublas_pointwise(g)) {  // y (NP x K) = x (NP x C) w^T
    op_phase(e, "fprop.cublas");
    detail::gemm_bf16(e, CUBLAS_OP_T, CUBLAS_OP_N, g.k, g.n * g.h * g.w, g.c, w.data(), g.c,
                      a.x.data(), g.c, 0.f, a.y.data(), g.k);
    return;
  }
#if DDP_WITH_CUDNN
  op_phase(e, "fprop.cudnn");
  cudnn::forward(e, g, a.x.data(), w.data(), static_cast<const float*>(nullptr), a.y.data());
#endif
}

// dx (bf16; with accumulate_dx, dx + the fp32 product, rounded once) and dw (float) from dy and
// bf16(w). cuBLAS writes dw in fp32; cuDNN's legacy backward-filter has no mixed types, so its dw
// is bf16 (fp32 accumulation, one rounding), widened. Requires conv2d_bf16_native(e, a).
inline void conv2d_backward(const Exec<Cuda>& e,
                            const Conv2dBackwardArgs<float, Cuda, bfloat16>& a) {
  validate(a);
  const ConvGeometry g = conv_geometry(a.x, a.w, a.stride, a.padding, a.dilation);
  const std::int64_t np = g.n * g.ho * g.wo;
  const CudaAllocStream on_stream(e);  // temporaries are reused in the order of e's stream
  Tensor<bfloat16, Cuda> w;
  if (!a.dx.empty()) w = detail::bf16_weight(e, a.w);
  if (detail::cublas_pointwise(g)) {
    op_phase(e, "dgrad.cublas");
    if (!a.dx.empty())  // dx (NP x C) = dy (NP x K) w (K x C)
      detail::gemm_bf16(e, CUBLAS_OP_N, CUBLAS_OP_N, g.c, np, g.k, w.data(), g.c, a.dy.data(), g.k,
                        a.accumulate_dx ? 1.f : 0.f, a.dx.data(), g.c);
    op_phase(e, "wgrad.cublas");
    if (!a.dw.empty())  // dw (K x C) = dy^T (K x NP) x (NP x C)
      detail::gemm_bf16(e, CUBLAS_OP_N, CUBLAS_OP_T, g.c, g.k, np, a.x.data(), g.c, a.dy.data(),
                        g.k, 0.f, a.dw.data(), g.c);
    return;
  }
#if DDP_WITH_CUDNN
  op_phase(e, "dgrad.cudnn");
  if (!a.dx.empty())
    cudnn::backward_data(e, g, a.dy.data(), w.data(), a.dx.data(), a.accumulate_dx);
  op_phase(e, "wgrad.cudnn");
  if (!a.dw.empty()) {
    Tensor<bfloat16, Cuda> dw(a.dw.shape());
    cudnn::backward_filter(e, g, a.x.data(), a.dy.data(), dw.data());
    for_each_index(e, static_cast<std::size_t>(dw.numel()),
                   Bf16Widen{.x = dw.data(), .y = a.dw.data()});
  }
#endif
}

}  // namespace ddp::kernels::cuda
