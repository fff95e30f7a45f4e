// DDP's data movement on the GPU: Broadcaster<Cuda> and Transport<T, Cuda> (device buckets, a communication
// stream ordered by events, no host synchronisation inside backward). Compiled only by nvcc.
// SPDX-License-Identifier: MIT
//
// Transport<T, Cuda>, per bucket b (BucketSchedule drives it, parallel/bucket_schedule.hpp):
//   begin_step(exec)   remembers exec (the compute stream backward runs on); waits for the previous step's
//                      collectives (by then long complete) so that a failed one is raised
//   launch(b)          enqueues, without blocking the host:
//       ready[b].record(compute)             the bucket's gradients are written when compute gets here
//       ready[b].wait(comm)                  the comm stream waits for that point
//       copies grad -> flat (comm stream)    cudaMemcpyAsync device to device (cudaMemsetAsync without a gradient)
//       all_reduce_on(comm, flat)            the all-reduce (Avg) after the copies; comm waits for it
//     or, with --comm-hook fp16|bf16 (CommHookKind::Fp16/Bf16; torch's fp16/bf16_compress_hook):
//       kernel flat -> wire (comm stream)    wire[i] = H(flat[i] * (1/W)), H = half/bfloat16 (the CPU hook's
//                                            element functor, parallel/comm_hooks.hpp: same rounding)
//       all-reduce (Sum) of wire             16-bit values summed over ranks, stream-ordered like the above
//       kernel wire -> flat (comm stream)    flat[i] = float(wire[i])
//     or, with --comm-hook powersgd (CommHookKind::PowerSgd; torch's powerSGD_hook, parallel/powersgd.hpp):
//       before start_iter                    the Avg all-reduce above
//       then, on the comm stream             flat += e; input = flat; Q = the CPU hook's initial values (host
//                                            generator, copied up) or last step's; orthogonalise Q (kernel);
//                                            P = M Q (cuBLAS) per compressed matrix M; all-reduce (Sum) of
//                                            [uncompressed | every P]
//   finish(b, keep)    after backward: copies flat -> grad (comm stream; not for keep[i], a parameter no rank
//                      used), done[b].record(comm), compute waits for done[b]: the optimizer step, enqueued
//                      next on the compute stream, sees averaged gradients. The host never waits here.
//                      powersgd, before those copies, also on the comm stream: uncompressed /= W back into flat;
//                      orthogonalise every P; Q = M^T P; all-reduce (Sum) of every Q; Q /= W; M = P Q^T into
//                      flat; e = input - flat. That Q all-reduce runs after backward, as the CPU hook's `then`.
// gradient_as_bucket_view (parallel/grad_views.hpp): the gradients are the slots of flat, so neither copy
// runs (only the memset for parameters without a gradient); the all-reduce works in place. Unverified on a GPU.
// Hooks: the built-ins allreduce, fp16, bf16 and powersgd (comm_hooks.hpp's runs_on_cuda); every backend that
// reaches device memory all-reduces F16/BF16 (nccl natively; a staged tcp/mpi sums them on the host as for a CPU
// model, so the results equal the CPU hook's on the same backend bit for bit). PowerSGD calls the CPU hook's
// host-side planning (plan_powersgd_bucket, PowerSgdState's start_iter rule, initial Q and counters) and element
// functors; its products are cuBLAS fp32 GEMMs and its orthogonalisation a kernel (one block per matrix:
// Gram-Schmidt for r <= 2, Householder above, the CPU's steps with block-tree sums), so it follows the CPU hook
// to rounding, not bit for bit (docs/ARCHITECTURE.md D29). Its state is per transport (powersgd_state()).
// register_comm_hook (host code) is refused with a ValueError saying what is supported. The fp16/bf16 and
// powersgd paths are unverified on a GPU. The PowerSGD GEMMs use a cuBLAS handle of the transport's own, bound to
// the comm stream (detail::PowerSgdBlas), not the thread's handle that backward uses on the compute stream.
// Backward keeps running on the compute stream while buckets are reduced (the grads of a launched bucket
// are not written again in the same backward), which is the overlap DDP exists for.
// Requirements: a communicator on device memory (memory() == MemoryKind::Cuda: --backend nccl, or tcp/gloo
// and mpi made with CommOptions::cuda_device, which stage through pinned host memory: comm/staging/
// staged_communicator.hpp, docs/ARCHITECTURE.md D23), all gradients in device memory, a hook from the list
// above (ValueError otherwise). The bucket order rebuilt after the first step is broadcast through a
// small device buffer (one host wait).
// The collectives are stream-ordered on the comm stream (comm/communicator.hpp: `.stream`): each waits on the
// device for the copies before it, and the copies after it wait for it; the host is never involved (staged
// backends: the stream waits in a host function for the host collective, not the calling thread).
// Nothing here keeps a stream in the communicator: the stream travels with each call, so the communicator
// outlives this transport and its streams safely (docs/ARCHITECTURE.md D16).
// Memory: nccl declares every buffer it hands to NCCL to the caching allocator (cuda_record_stream), so a
// flat buffer freed by a rebuild is reused only after NCCL has finished with it; a staged backend touches
// device memory only on the caller's stream, in stream order like our own copies.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/core/cuda_check.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cuda/blas.cuh"
#include "ddp/kernels/cuda/launch.cuh"
#include "ddp/nn/parameter.hpp"
#include "ddp/parallel/bucket.hpp"
#include "ddp/parallel/bucket_schedule.hpp"
#include "ddp/parallel/comm_hooks.hpp"
#include "ddp/parallel/powersgd.hpp"
#include "ddp/parallel/transport.hpp"
#include "ddp/tensor/cuda/allocator.hpp"
#include "ddp/tensor/cuda/copy.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::parallel {

namespace detail {
// `comm` itself, or a ConfigError saying which backend to use when it cannot reach device memory.
inline comm::Communicator& on_device_memory(comm::Communicator& comm) {
  if (comm.memory() != comm::MemoryKind::Cuda)
    throw ConfigError(
        ddp::detail::str("ddp: DistributedDataParallel on CUDA needs a communicator whose collectives run on "
                         "CUDA streams (--backend nccl, or tcp/gloo/mpi made with CommOptions::cuda_device); the '",
                         comm.backend(), "' communicator works on host memory"));
  return comm;
}
// Waits for every Work, dropping errors (used while another error unwinds, or on destruction).
inline void wait_all_noexcept(std::vector<comm::Work>& works) noexcept {
  for (comm::Work& w : works) {
    try {
      w.wait();
    } catch (...) {
    }
  }
  works.clear();
}

// ---- PowerSGD's orthogonalisation on the device (--comm-hook powersgd; the host planning, the element functors
// and the byte counters are parallel/powersgd.hpp's, shared with the CPU hook) ----
// One job per matrix, kPowerSgdJobFields int64 each: the (rows x cols) row-major matrix at `offset` in the
// kernel's base buffer and, for cols > 2, its Householder scratch (2 rows cols doubles) at `work_offset`. A Q
// job is (the PowerSGD matrix's cols x r), a P job (rows x r).
inline constexpr int kPowerSgdJobFields = 4;  // offset, rows, cols, work_offset

// Sum of v over the block, valid in every thread: a fixed tree (the same order every run). blockDim.x must be
// kernels::cuda::kThreads (a power of two), red that many doubles of shared memory.
template <class V>
__device__ V powersgd_block_sum(V v, V* red) {
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

// detail::gram_schmidt (powersgd.hpp) by one block: the same operations in the same order per column, each
// sum over rows a block tree instead of a sequential loop (so equal to rounding, not bit for bit). Row j
// belongs to thread j % blockDim.x throughout, so the only cross-thread data are the block sums.
template <class T>
__device__ void powersgd_gram_schmidt_block(T* a, std::int64_t rows, std::int64_t cols, double eps, double* red) {
  const std::int64_t t0 = threadIdx.x, dt = blockDim.x;
  for (std::int64_t i = 0; i < cols; ++i) {
    double sq = 0;
    for (std::int64_t j = t0; j < rows; j += dt) sq += double(a[j * cols + i]) * double(a[j * cols + i]);
    const double norm = sqrt(powersgd_block_sum(sq, red)) + eps;
    const double inv = norm > 0 ? 1.0 / norm : 0.0;
    for (std::int64_t j = t0; j < rows; j += dt) a[j * cols + i] = static_cast<T>(double(a[j * cols + i]) * inv);
    for (std::int64_t c = i + 1; c < cols; ++c) {
      double dot = 0;
      for (std::int64_t j = t0; j < rows; j += dt) dot += double(a[j * cols + i]) * double(a[j * cols + c]);
      dot = powersgd_block_sum(dot, red);
      for (std::int64_t j = t0; j < rows; j += dt)
        a[j * cols + c] = static_cast<T>(double(a[j * cols + c]) - dot * double(a[j * cols + i]));
    }
  }
}

// detail::householder_orthonormalize (powersgd.hpp) by one block, in double in `work` (v: the reflectors, r:
// the matrix being reduced, then the thin Q built in its place). Same steps as the CPU's; rows >= cols.
template <class T>
__device__ void powersgd_householder_block(T* a, std::int64_t rows, std::int64_t cols, double* work, double* red) {
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
    const double norm = sqrt(powersgd_block_sum(sq, red));
    if (norm == 0) continue;  // nothing to reflect: v_k = 0 (the same in every thread)
    const double alpha = r[k * cols + k] > 0 ? -norm : norm;
    double vsq = 0;
    for (std::int64_t i = first; i < rows; i += dt) {
      v[i * cols + k] = r[i * cols + k] - (i == k ? alpha : 0.0);
      vsq += v[i * cols + k] * v[i * cols + k];
    }
    const double vnorm = sqrt(powersgd_block_sum(vsq, red));
    for (std::int64_t i = first; i < rows; i += dt) v[i * cols + k] /= vnorm;
    for (std::int64_t j = k; j < cols; ++j) {
      double dot = 0;
      for (std::int64_t i = first; i < rows; i += dt) dot += v[i * cols + k] * r[i * cols + j];
      dot = powersgd_block_sum(dot, red);
      for (std::int64_t i = first; i < rows; i += dt) r[i * cols + j] -= 2 * dot * v[i * cols + k];
    }
  }
  // Thin Q = H_0 H_1 ... H_{cols-1} applied to the first cols columns of the identity (in r's place).
  for (std::int64_t i = t0; i < rows; i += dt)
    for (std::int64_t j = 0; j < cols; ++j) r[i * cols + j] = i == j ? 1.0 : 0.0;
  for (std::int64_t k = cols - 1; k >= 0; --k) {
    const std::int64_t first = t0 >= k ? t0 : t0 + ((k - t0 + dt - 1) / dt) * dt;
    for (std::int64_t j = 0; j < cols; ++j) {
      double dot = 0;
      for (std::int64_t i = first; i < rows; i += dt) dot += v[i * cols + k] * r[i * cols + j];
      dot = powersgd_block_sum(dot, red);
      for (std::int64_t i = first; i < rows; i += dt) r[i * cols + j] -= 2 * dot * v[i * cols + k];
    }
  }
  for (std::int64_t i = t0; i < rows; i += dt)
    for (std::int64_t j = 0; j < cols; ++j) a[i * cols + j] = static_cast<T>(r[i * cols + j]);
}

// PowerSGD's GEMMs on the comm stream go through a cuBLAS handle of the transport's own: the thread's handle
// (kernels/cuda/blas.cuh) serves backward's GEMMs on the compute stream at the same time, and one handle's
// workspace must not serve two streams at once. Bound to the comm stream for life; destroyed with the
// transport (cublasDestroy waits for the device, after drain() has waited for the collectives).
class PowerSgdBlas {
 public:
  explicit PowerSgdBlas(cudaStream_t s) {
    DDP_CUBLAS_CHECK(cublasCreate(&h_));
    DDP_CUBLAS_CHECK(cublasSetAtomicsMode(h_, CUBLAS_ATOMICS_NOT_ALLOWED));  // the same bits run to run
    DDP_CUBLAS_CHECK(cublasSetStream(h_, s));
  }
  PowerSgdBlas(const PowerSgdBlas&) = delete;
  PowerSgdBlas& operator=(const PowerSgdBlas&) = delete;
  ~PowerSgdBlas() {
    if (const cublasStatus_t st = cublasDestroy(h_); st != CUBLAS_STATUS_SUCCESS)
      DDP_LOG_ERROR(ddp::detail::cublas_error_text("cublasDestroy(h_)", st, __FILE__, __LINE__));
  }

  // Column-major C (m x n) = op(A) op(B) in fp32 (fp64 for double: kernels/cuda/blas.cuh's compute types, never
  // TF32), sizes checked against cuBLAS's int as blas.cuh's gemm does.
  template <class T>
  void gemm(cublasOperation_t ta, cublasOperation_t tb, std::int64_t m, std::int64_t n, std::int64_t k, const T* a,
            std::int64_t lda, const T* b, std::int64_t ldb, T* c, std::int64_t ldc) const {
    constexpr std::int64_t kIntMax = 2147483647;
    if (m > kIntMax || n > kIntMax || k > kIntMax || lda > kIntMax || ldb > kIntMax || ldc > kIntMax)
      throw ValueError(ddp::detail::str("ddp: PowerSGD: GEMM sizes m=", m, " n=", n, " k=", k,
                                        " exceed cuBLAS's 32-bit limit; use a smaller bucket or rank"));
    using kernels::cuda::detail::cuda_data_type;
    const T alpha = T(1), beta = T(0);
    DDP_CUBLAS_CHECK(cublasGemmEx(h_, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha,
                                  a, cuda_data_type<T>, static_cast<int>(lda), b, cuda_data_type<T>,
                                  static_cast<int>(ldb), &beta, c, cuda_data_type<T>, static_cast<int>(ldc),
                                  kernels::cuda::detail::compute_type<T>(Precision::Fp32), CUBLAS_GEMM_DEFAULT));
  }

 private:
  cublasHandle_t h_ = nullptr;
};

// detail::orthogonalize (powersgd.hpp) for every job, one block each: Gram-Schmidt for up to 2 columns,
// Householder above, as the CPU hook and torch 1.13.
template <class T>
__global__ void powersgd_orthogonalize_kernel(T* base, const std::int64_t* jobs, double* work, double eps) {
  __shared__ double red[kernels::cuda::kThreads];
  const std::int64_t* job = jobs + static_cast<std::int64_t>(blockIdx.x) * kPowerSgdJobFields;
  T* a = base + job[0];
  if (job[2] <= 2)
    powersgd_gram_schmidt_block(a, job[1], job[2], eps, red);
  else
    powersgd_householder_block(a, job[1], job[2], work + job[3], red);
}
}  // namespace detail

template <>
class Broadcaster<Cuda> {
 public:
  // `comm` must outlive this object; ConfigError unless its collectives run on CUDA streams.
  explicit Broadcaster(comm::Communicator& comm) : comm_(&detail::on_device_memory(comm)) {}
  Broadcaster(const Broadcaster&) = delete;
  Broadcaster& operator=(const Broadcaster&) = delete;
  ~Broadcaster() { drain(); }

  // Rank `root`'s values (0 but for DDP's join, D30) of `parts` (device memory) on every rank: one flat
  // broadcast ordered after exec's stream, with exec's stream waiting for it. host_wait also blocks the host
  // until it is done; otherwise retire() (the next synchronised step) raises its errors.
  template <comm::CommElement V>
  void broadcast(const std::vector<std::span<V>>& parts, const Exec<Cuda>& exec, bool host_wait, int root = 0) {
    if (comm_->size() == 1 || parts.empty()) return;
    std::int64_t total = 0;
    for (const auto& p : parts) total += static_cast<std::int64_t>(p.size());
    Tensor<V, Cuda> flat(Shape{total});  // freed in stream order (see the file comment)
    const cudaStream_t s = cuda_stream(exec);
    std::size_t off = 0;
    for (const auto& p : parts) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(flat.data() + off, p.data(), p.size_bytes(), cudaMemcpyDeviceToDevice, s));
      off += p.size();
    }
    comm::Work w = broadcast_on(s, std::span<V>(flat.data(), off), root);
    off = 0;
    for (const auto& p : parts) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(p.data(), flat.data() + off, p.size_bytes(), cudaMemcpyDeviceToDevice, s));
      off += p.size();
    }
    if (host_wait) {
      w.wait();
      synchronize(exec);
    } else {
      pending_.push_back(std::move(w));
    }
  }
  // Rank `root`'s values of host memory on every rank, staged through a device buffer (NCCL moves device memory
  // only); the host waits.
  template <comm::CommElement V>
  void broadcast_host(std::span<V> values, const Exec<Cuda>& exec, int root = 0) {
    if (comm_->size() == 1 || values.empty()) return;
    Tensor<V, Cuda> dev =
        to<Cuda>(TensorView<const V, Cpu>(values.data(), Shape{static_cast<std::int64_t>(values.size())}), exec);
    broadcast<V>({std::span<V>(dev.data(), values.size())}, exec, /*host_wait=*/true, root);
    copy(dev.cview(), TensorView<V, Cpu>(values.data(), dev.shape()), exec);  // waits for exec's stream
  }

  // Waits for the broadcasts issued without a host wait (complete by now in a healthy job); raises the first error.
  void retire() {
    std::vector<comm::Work> works = std::exchange(pending_, {});
    for (comm::Work& w : works) w.wait();
  }
  void drain() noexcept { detail::wait_all_noexcept(pending_); }

 private:
  // Stream-ordered: the broadcast waits for s's earlier work, s's later work waits for the broadcast.
  template <class V>
  comm::Work broadcast_on(cudaStream_t s, std::span<V> flat, int root) {
    return comm_->broadcast(TensorView<V, Cuda>(flat.data(), Shape{static_cast<std::int64_t>(flat.size())}),
                            {.root = root, .stream = s});
  }

  comm::Communicator* comm_;
  std::vector<comm::Work> pending_;  // broadcasts issued without a host wait
};

template <class T>
class Transport<T, Cuda> {
 public:
  // `comm` and the parameters must outlive this object.
  Transport(const std::vector<nn::Parameter<T, Cuda>*>& params, const ReducerOptions& o, comm::Communicator& comm)
      : params_(params), bcast_(comm), comm_(&comm), hook_(o.comm_hook), view_(o.gradient_as_bucket_view) {
    if (!runs_on_cuda(hook_)) throw cuda_hook_refused(ddp::detail::str("--comm-hook ", comm_hook_name(hook_)));
    if (hook_ == CommHookKind::PowerSgd) {
      psgd_ = std::make_unique<PowerSgdState<T>>(o.powersgd);  // validates the options
      psgd_blas_ = std::make_unique<detail::PowerSgdBlas>(comm_stream_.get());
    }
  }
  // A CommHook<T> is host code on host buffers (parallel/comm_hooks.hpp): CUDA buckets take DdpOptions::comm_hook.
  void set_comm_hook(const CommHook<T>& /*hook*/) { throw cuda_hook_refused("a hook passed to register_comm_hook"); }
  // --comm-hook powersgd: the state's counters (bytes on the wire, compression_stats, iter); null otherwise.
  // The per-bucket tensors live in device memory here, not in the state's host `buckets`, which stay empty.
  const PowerSgdState<T>* powersgd_state() const noexcept { return psgd_.get(); }
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;
  // The parameters outlive us: with gradient_as_bucket_view their gradients move back into memory of their own
  // (copied on the compute stream, before the buckets are freed in stream order).
  ~Transport() {
    drain();
    if (view_) own_grads(params_, compute_);
  }

  void build(const std::vector<BucketLayout>& layouts) {
    for (Bucket& bk : buckets_) retired_.push_back(std::exchange(bk.work, comm::Work()));  // raised at begin_step
    std::vector<Bucket> fresh(layouts.size());
    std::vector<T*> flats;
    for (std::size_t b = 0; b < layouts.size(); ++b) {
      fresh[b].flat = Tensor<T, Cuda>(Shape{layouts[b].numel});
      if (hook_ == CommHookKind::Fp16) fresh[b].wire_f16 = Tensor<half, Cuda>(Shape{layouts[b].numel});
      if (hook_ == CommHookKind::Bf16) fresh[b].wire_bf16 = Tensor<bfloat16, Cuda>(Shape{layouts[b].numel});
      if (psgd_) plan_powersgd(fresh[b].psgd, layouts[b]);
      flats.push_back(fresh[b].flat.data());
    }
    if (view_) view_grads_in_buckets(params_, layouts, flats, compute_);  // on the compute stream, before the
    layouts_ = layouts;                                                   // old buffers are freed
    buckets_ = std::move(fresh);  // old flat buffers are freed in stream order (see the file comment)
  }

  void begin_step(const Exec<Cuda>& exec) {
    retire();  // raises the previous step's collective errors, if any
    compute_ = exec;
  }

  void launch(std::size_t b, const std::vector<bool>& zero) {
    Bucket& bk = buckets_[b];
    const BucketLayout& l = layouts_[b];
    const Exec<Cuda> comm_exec = comm_stream_.exec();
    const cudaStream_t cs = comm_stream_.get();
    bk.ready.record(compute_);
    bk.ready.wait(comm_exec);
    for (std::size_t k = 0; k < l.params.size(); ++k) {
      const std::size_t i = l.params[k];
      T* dst = bk.flat.data() + l.offsets[k];
      const std::size_t bytes = params_[i]->grad().bytes();
      if (zero[i])
        DDP_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, cs));
      else if (!view_)  // gradient_as_bucket_view: the gradient is the slot
        DDP_CUDA_CHECK(cudaMemcpyAsync(dst, params_[i]->grad().data(), bytes, cudaMemcpyDeviceToDevice, cs));
    }
    const std::span<T> flat(bk.flat.data(), static_cast<std::size_t>(l.numel));
    switch (hook_) {
      case CommHookKind::Fp16: bk.work = compressed_all_reduce(comm_exec, flat, bk.wire_f16); break;
      case CommHookKind::Bf16: bk.work = compressed_all_reduce(comm_exec, flat, bk.wire_bf16); break;
      case CommHookKind::PowerSgd: bk.work = powersgd_launch(b, comm_exec, flat); break;
      default: bk.work = all_reduce_on(cs, flat);  // Allreduce
    }
  }

  // The copies back into grad() are enqueued here, after backward, because only now is it known which
  // parameters no rank used (keep[i]: left untouched); the comm stream still runs them after the all-reduce
  // and the compute stream, where the optimizer runs next, waits for them. The host does not wait.
  void finish(std::size_t b, const std::vector<bool>& keep) {
    Bucket& bk = buckets_[b];
    const BucketLayout& l = layouts_[b];
    const cudaStream_t cs = comm_stream_.get();
    if (bk.psgd.compressed) powersgd_finish(b, comm_stream_.exec());
    for (std::size_t k = 0; k < l.params.size() && !view_; ++k) {
      if (keep[l.params[k]]) continue;
      auto& g = params_[l.params[k]]->grad();
      DDP_CUDA_CHECK(cudaMemcpyAsync(g.data(), bk.flat.data() + l.offsets[k], g.bytes(), cudaMemcpyDeviceToDevice, cs));
    }
    bk.done.record(comm_stream_.exec());
    bk.done.wait(compute_);
  }

  void drain() noexcept {
    for (Bucket& bk : buckets_) retired_.push_back(std::exchange(bk.work, comm::Work()));
    detail::wait_all_noexcept(retired_);
    bcast_.drain();
  }

  void broadcast_order(std::span<std::int64_t> order) { bcast_.broadcast_host(order, compute_); }
  // Element-wise max over ranks of host flags, staged through the device on the compute stream; the host waits.
  void any_rank(std::span<std::int64_t> flags) {
    if (comm_->size() == 1 || flags.empty()) return;
    Tensor<std::int64_t, Cuda> dev = to<Cuda>(
        TensorView<const std::int64_t, Cpu>(flags.data(), Shape{static_cast<std::int64_t>(flags.size())}), compute_);
    comm_->all_reduce(dev.view(), {.op = comm::ReduceOp::Max, .stream = cuda_stream(compute_)}).wait();
    copy(dev.cview(), TensorView<std::int64_t, Cpu>(flags.data(), dev.shape()), compute_);  // waits for the stream
  }

  // Parameter and buffer broadcasts of DistributedDataParallel.
  Broadcaster<Cuda>& broadcaster() noexcept { return bcast_; }
  // The stream the buckets are copied and reduced on (tests and benchmarks time it).
  const Stream& comm_stream() const noexcept { return comm_stream_; }

 private:
  // --comm-hook powersgd: what one bucket keeps on the device across steps (the CPU hook's
  // PowerSgdState::Bucket), allocated by build() from the bucket's plan. Freed like flat (stream order).
  struct PowerSgdBucket {
    PowerSgdPlan plan;         // plan_powersgd_bucket, fixed for the bucket's life (its shapes do not change)
    Tensor<T, Cuda> error;     // (numel) e, error feedback; valid once a compressed step finished (error_valid)
    Tensor<T, Cuda> input;     // (numel) the buffer after error feedback
    Tensor<T, Cuda> send;      // (n_unc + n_p) [uncompressed | every P]: the all-reduce launched with the bucket
    Tensor<T, Cuda> q;         // (n_q) every Q, back to back: the all-reduce at finish, kept for warm start
    Tensor<std::int64_t, Cuda> q_jobs, p_jobs;  // (matrices x kPowerSgdJobFields) orthogonalisation jobs
    Tensor<double, Cuda> work;                   // Householder scratch (matrices with r > 2)
    bool error_valid = false, q_valid = false;
    bool compressed = false;  // this step's launch compressed (false: a plain Avg all-reduce, before start_iter)
  };

  struct Bucket {
    Tensor<T, Cuda> flat;  // gradients back to back, bucket order (device)
    // --comm-hook fp16 / bf16: flat / W in 16 bits, what is all-reduced (empty for the other hooks). Freed
    // like flat (nccl declares it to the allocator; the kernels and staged copies run on the comm stream).
    Tensor<half, Cuda> wire_f16;
    Tensor<bfloat16, Cuda> wire_bf16;
    PowerSgdBucket psgd;  // --comm-hook powersgd only
    Event ready, done;
    comm::Work work;  // the all-reduce, retired at the next begin_step
  };

  // The bucket's plan (host, the CPU hook's function), its device buffers, and its orthogonalisation jobs
  // (uploaded once; the host values are read before the copy returns). Run by build(), between steps.
  void plan_powersgd(PowerSgdBucket& ps, const BucketLayout& l) {
    std::vector<Shape> shapes;
    for (std::size_t i : l.params) shapes.push_back(params_[i]->torch_shape());
    ps.plan = plan_powersgd_bucket(l, shapes, psgd_->options);
    const PowerSgdPlan& plan = ps.plan;
    if (psgd_->options.use_error_feedback) {
      ps.error = Tensor<T, Cuda>(Shape{l.numel});
      ps.input = Tensor<T, Cuda>(Shape{l.numel});
    }
    ps.send = Tensor<T, Cuda>(Shape{plan.send_numel()});
    if (plan.matrices.empty()) return;
    ps.q = Tensor<T, Cuda>(Shape{plan.n_q});
    std::vector<std::int64_t> qj, pj;
    std::int64_t q_work = 0, p_work = 0;
    for (const PowerSgdMatrix& m : plan.matrices) {
      qj.insert(qj.end(), {m.q_offset, m.cols, m.rank, q_work});
      pj.insert(pj.end(), {plan.n_unc + m.p_offset, m.rows, m.rank, p_work});
      if (m.rank > 2) {
        q_work += 2 * m.cols * m.rank;
        p_work += 2 * m.rows * m.rank;
      }
    }
    const Exec<Cuda> ce = comm_stream_.exec();
    const auto upload = [&ce](const std::vector<std::int64_t>& v) {
      return to<Cuda>(TensorView<const std::int64_t, Cpu>(v.data(), Shape{static_cast<std::int64_t>(v.size())}), ce);
    };
    ps.q_jobs = upload(qj);
    ps.p_jobs = upload(pj);
    if (std::max(q_work, p_work) > 0) ps.work = Tensor<double, Cuda>(Shape{std::max(q_work, p_work)});
  }

  // Orthonormalises the matrices `jobs` names in base (one block each), on exec's stream.
  void powersgd_orthogonalize(const Exec<Cuda>& exec, T* base, const Tensor<std::int64_t, Cuda>& jobs,
                              PowerSgdBucket& ps) {
    const auto n = static_cast<unsigned>(ps.plan.matrices.size());
    detail::powersgd_orthogonalize_kernel<T><<<n, kernels::cuda::kThreads, 0, cuda_stream(exec)>>>(
        base, jobs.data(), ps.work.data(), psgd_->options.orthogonalization_epsilon);
    kernels::cuda::check_launch("powersgd_orthogonalize_kernel", cuda_stream(exec));
  }

  // torch's powerSGD_hook up to the first all-reduce, on exec's stream (the comm stream, after the bucket's
  // copies); the host never waits. Before start_iter: the plain Avg all-reduce. The steps and their order are
  // the CPU hook's (parallel/powersgd.hpp, steps 1-4); row-major M (rows x cols) is cuBLAS's column-major
  // M^T, so P = M Q is computed as P^T = Q^T M^T (gemm N, N).
  comm::Work powersgd_launch(std::size_t b, const Exec<Cuda>& exec, std::span<T> flat) {
    PowerSgdState<T>& s = *psgd_;
    PowerSgdBucket& ps = buckets_[b].psgd;
    const bool is_last = b + 1 == buckets_.size();
    const cudaStream_t cs = cuda_stream(exec);
    ps.compressed = s.begin_bucket(flat.size(), is_last);
    if (!ps.compressed) return all_reduce_on(cs, flat);
    const PowerSgdOptions& o = s.options;
    const PowerSgdPlan& plan = ps.plan;
    if (o.use_error_feedback) {  // 1.
      if (ps.error_valid)
        kernels::cuda::for_each_index(exec, flat.size(),
                                      detail::PowerSgdAddError<T>{.buffer = flat.data(), .error = ps.error.data()});
      DDP_CUDA_CHECK(cudaMemcpyAsync(ps.input.data(), flat.data(), flat.size_bytes(), cudaMemcpyDeviceToDevice, cs));
    }
    if (s.needs_new_q(ps.q_valid ? static_cast<std::size_t>(plan.n_q) : 0, plan)) {  // 3. the CPU's values
      std::vector<T> q0(static_cast<std::size_t>(plan.n_q));
      s.initial_q(b, plan, std::span<T>(q0));
      if (!q0.empty())  // pageable: read before the call returns
        DDP_CUDA_CHECK(cudaMemcpyAsync(ps.q.data(), q0.data(), q0.size() * sizeof(T), cudaMemcpyHostToDevice, cs));
      ps.q_valid = true;  // as the CPU's bk.q now holds n_q values (finish sets warm_start's answer)
    }
    std::int64_t at = 0;
    for (const auto& [off, n] : plan.uncompressed) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(ps.send.data() + at, flat.data() + off, static_cast<std::size_t>(n) * sizeof(T),
                                     cudaMemcpyDeviceToDevice, cs));
      at += n;
    }
    if (!plan.matrices.empty()) powersgd_orthogonalize(exec, ps.q.data(), ps.q_jobs, ps);
    for (const PowerSgdMatrix& m : plan.matrices)  // P (rows x r) = M Q
      psgd_blas_->gemm<T>(CUBLAS_OP_N, CUBLAS_OP_N, m.rank, m.rows, m.cols, ps.q.data() + m.q_offset, m.rank,
                          flat.data() + m.offset, m.cols, ps.send.data() + plan.n_unc + m.p_offset, m.rank);
    s.count_compressed(plan, is_last);  // 4.
    return comm_->all_reduce(TensorView<T, Cuda>(ps.send.data(), Shape{plan.send_numel()}),
                             {.op = comm::ReduceOp::Sum, .stream = cs});
  }

  // The CPU hook's `then` (steps 5-6) on exec's stream, after the launched all-reduce: the uncompressed part
  // averaged back into flat; each P orthonormalised; Q = M^T P (gemm N, T); the Q all-reduce (Sum) stream-
  // ordered, its Work retired at the next begin_step like the bucket's; Q /= W; M = P Q^T (gemm T, N); the new
  // error. Enqueued at finish, after backward, as on the CPU; the host does not wait for any of it.
  void powersgd_finish(std::size_t b, const Exec<Cuda>& exec) {
    PowerSgdState<T>& s = *psgd_;
    PowerSgdBucket& ps = buckets_[b].psgd;
    const PowerSgdOptions& o = s.options;
    const PowerSgdPlan& plan = ps.plan;
    const cudaStream_t cs = cuda_stream(exec);
    T* flat = buckets_[b].flat.data();
    const double world = comm_->size();
    if (plan.n_unc > 0)
      kernels::cuda::for_each_index(exec, static_cast<std::size_t>(plan.n_unc),
                                    detail::PowerSgdDivide<T>{.src = ps.send.data(), .dst = ps.send.data(), .world = world});
    std::int64_t at = 0;
    for (const auto& [off, n] : plan.uncompressed) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(flat + off, ps.send.data() + at, static_cast<std::size_t>(n) * sizeof(T),
                                     cudaMemcpyDeviceToDevice, cs));
      at += n;
    }
    if (!plan.matrices.empty()) {
      powersgd_orthogonalize(exec, ps.send.data(), ps.p_jobs, ps);  // the P jobs' offsets include n_unc
      for (const PowerSgdMatrix& m : plan.matrices)  // Q (cols x r) = M^T P
        psgd_blas_->gemm<T>(CUBLAS_OP_N, CUBLAS_OP_T, m.rank, m.cols, m.rows, ps.send.data() + plan.n_unc + m.p_offset,
                            m.rank, flat + m.offset, m.cols, ps.q.data() + m.q_offset, m.rank);
      retired_.push_back(comm_->all_reduce(TensorView<T, Cuda>(ps.q.data(), Shape{plan.n_q}),
                                           {.op = comm::ReduceOp::Sum, .stream = cs}));
      kernels::cuda::for_each_index(exec, static_cast<std::size_t>(plan.n_q),
                                    detail::PowerSgdDivide<T>{.src = ps.q.data(), .dst = ps.q.data(), .world = world});
      for (const PowerSgdMatrix& m : plan.matrices)  // M (rows x cols) = P Q^T
        psgd_blas_->gemm<T>(CUBLAS_OP_T, CUBLAS_OP_N, m.cols, m.rows, m.rank, ps.q.data() + m.q_offset, m.rank,
                            ps.send.data() + plan.n_unc + m.p_offset, m.rank, flat + m.offset, m.cols);
    }
    if (o.use_error_feedback) {
      kernels::cuda::for_each_index(
          exec, static_cast<std::size_t>(layouts_[b].numel),
          detail::PowerSgdNewError<T>{.input = ps.input.data(), .buffer = flat, .error = ps.error.data()});
      ps.error_valid = true;
    }
    ps.q_valid = o.warm_start;
    ps.compressed = false;
    s.end_compressed_bucket(b + 1 == buckets_.size());
  }

  // Waits for the previous step's collectives (complete by now in a healthy job) and raises the first error.
  void retire() {
    std::vector<comm::Work> works = std::exchange(retired_, {});
    for (Bucket& bk : buckets_) works.push_back(std::exchange(bk.work, comm::Work()));
    for (comm::Work& w : works) w.wait();
    bcast_.retire();
  }

  // Stream-ordered: the all-reduce waits for s's earlier work, s's later work waits for the all-reduce.
  comm::Work all_reduce_on(cudaStream_t s, std::span<T> flat) {
    return comm_->all_reduce(TensorView<T, Cuda>(flat.data(), Shape{static_cast<std::int64_t>(flat.size())}),
                             {.op = comm::ReduceOp::Avg, .stream = s});
  }

  // torch's fp16/bf16_compress_hook on the device, all on exec's stream (the comm stream), no host wait:
  // wire = H(flat * (1/W)), Sum over ranks of wire, flat = float(wire). The element functors are the CPU
  // hook's (parallel/comm_hooks.hpp), so the rounding is the same bits.
  template <class H>
  comm::Work compressed_all_reduce(const Exec<Cuda>& exec, std::span<T> flat, Tensor<H, Cuda>& wire) {
    const std::size_t n = flat.size();
    kernels::cuda::for_each_index(
        exec, n,
        detail::CompressToWire<T, H>{
            .bucket = flat.data(), .wire = wire.data(), .inv_world = detail::compress_scale(comm_->size())});
    comm::Work w = comm_->all_reduce(TensorView<H, Cuda>(wire.data(), Shape{static_cast<std::int64_t>(n)}),
                                     {.op = comm::ReduceOp::Sum, .stream = cuda_stream(exec)});
    kernels::cuda::for_each_index(exec, n,
                                  detail::DecompressFromWire<T, H>{.wire = wire.data(), .bucket = flat.data()});
    return w;
  }

  std::vector<nn::Parameter<T, Cuda>*> params_;
  Broadcaster<Cuda> bcast_;
  comm::Communicator* comm_;
  CommHookKind hook_;  // Allreduce, Fp16, Bf16 or PowerSgd (runs_on_cuda)
  std::unique_ptr<PowerSgdState<T>> psgd_;  // --comm-hook powersgd: iter, rng, counters (buckets: device, above)
  bool view_;  // gradient_as_bucket_view (parallel/grad_views.hpp)
  Stream comm_stream_;  // blocking (cudaStreamDefault): orders with the legacy default stream
  std::unique_ptr<detail::PowerSgdBlas> psgd_blas_;  // --comm-hook powersgd: GEMMs on comm_stream_
  Exec<Cuda> compute_{};
  std::vector<BucketLayout> layouts_;
  std::vector<Bucket> buckets_;
  std::vector<comm::Work> retired_;  // Works of replaced buckets and of drained steps, not yet waited
};

}  // namespace ddp::parallel
