// PowerSGD on the device: PowerSgdHook<T, Cuda>, the hook a CUDA model runs for --comm-hook
// powersgd or gets from parallel::powersgd_hook<T, Cuda>(), with its orthogonalisation kernel and
// cuBLAS handle. Compiled only by nvcc.
// SPDX-License-Identifier: MIT
//
// The host-side part is the CPU hook's own (parallel/powersgd.hpp): plan_powersgd_bucket,
// PowerSgdState's start_iter rule, initial Q and counters, and the element functors. Per bucket (W
// ranks), on the bucket's stream (GradBucket::exec: DDP's comm stream, after the copies):
//   hook   flat += e; input = flat; Q = the CPU hook's initial values (host generator, copied up)
//          or last step's; orthogonalise Q (kernel); P = M Q (cuBLAS) per compressed matrix M;
//          all-reduce (Sum) of [uncompressed | every P]. Before start_iter: the plain average.
//   then   uncompressed /= W back into flat; orthogonalise every P; Q = M^T P; all-reduce (Sum) of
//          every Q (deferred: GradBucket::defer); Q /= W; M = P Q^T into flat; e = input - flat.
// Orthogonalisation is one kernel per bucket, one block per matrix
// (kernels/cuda/orthogonalize.cuh): the CPU's steps with block-tree sums, so the result follows the
// CPU hook to rounding, not bit for bit (docs/decisions/0029). The GEMMs use a cuBLAS handle of the
// hook's own, set to the bucket's stream, not the thread's handle that backward uses on the compute
// stream.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/core/cuda_check.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/log.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cuda/blas.cuh"
#include "ddp/kernels/cuda/launch.cuh"
#include "ddp/kernels/cuda/orthogonalize.cuh"
#include "ddp/parallel/bucket.hpp"
#include "ddp/parallel/comm_hooks.hpp"
#include "ddp/parallel/grad_bucket.hpp"
#include "ddp/parallel/powersgd.hpp"
#include "ddp/tensor/cuda/allocator.hpp"
#include "ddp/tensor/cuda/copy.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::parallel {
namespace detail {

// PowerSGD's GEMMs on the comm stream go through a cuBLAS handle of the hook's own: the thread's
// handle (kernels/cuda/blas.cuh) serves backward's GEMMs on the compute stream at the same time,
// and one handle's workspace must not serve two streams at once. Destroyed with the hook
// (cublasDestroy waits for the device, after DDP's drain() has waited for the collectives).
class PowerSgdBlas {
 public:
  PowerSgdBlas() {
    DDP_CUBLAS_CHECK(cublasCreate(&h_));
    // the same bits run to run
    DDP_CUBLAS_CHECK(cublasSetAtomicsMode(h_, CUBLAS_ATOMICS_NOT_ALLOWED));
  }
  PowerSgdBlas(const PowerSgdBlas&) = delete;
  PowerSgdBlas& operator=(const PowerSgdBlas&) = delete;
  ~PowerSgdBlas() {
    if (const cublasStatus_t st = cublasDestroy(h_); st != CUBLAS_STATUS_SUCCESS)
      DDP_LOG_ERROR(ddp::detail::cublas_error_text("cublasDestroy(h_)", st, __FILE__, __LINE__));
  }

  // Where the following GEMMs run (the bucket's stream).
  void set_stream(cudaStream_t s) { DDP_CUBLAS_CHECK(cublasSetStream(h_, s)); }

  // Column-major C (m x n) = op(A) op(B) in fp32 (fp64 for double: kernels/cuda/blas.cuh's compute
  // types, never TF32), sizes checked against cuBLAS's int as blas.cuh's gemm does.
  template <class T>
  void gemm(cublasOperation_t ta, cublasOperation_t tb, std::int64_t m, std::int64_t n,
            std::int64_t k, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T* c,
            std::int64_t ldc) const {
    constexpr std::int64_t kIntMax = 2147483647;
    if (m > kIntMax || n > kIntMax || k > kIntMax || lda > kIntMax || ldb > kIntMax ||
        ldc > kIntMax)
      throw ValueError(
          ddp::detail::str("ddp: PowerSGD: GEMM sizes m=", m, " n=", n, " k=", k,
                           " exceed cuBLAS's 32-bit limit; use a smaller bucket or rank"));
    using kernels::cuda::detail::cuda_data_type;
    const T alpha = T(1), beta = T(0);
    DDP_CUBLAS_CHECK(
        cublasGemmEx(h_, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                     &alpha, a, cuda_data_type<T>, static_cast<int>(lda), b, cuda_data_type<T>,
                     static_cast<int>(ldb), &beta, c, cuda_data_type<T>, static_cast<int>(ldc),
                     kernels::cuda::detail::compute_type<T>(Precision::Fp32), CUBLAS_GEMM_DEFAULT));
  }

 private:
  cublasHandle_t h_ = nullptr;
};

// The CUDA hook's per-bucket device buffers and the GEMM handle, over the caller's state (counters,
// iter, the generator of initial Q). Shared by the hook's copies and its `then` closures.
template <class T>
class PowerSgdDevice {
 public:
  explicit PowerSgdDevice(std::shared_ptr<PowerSgdState<T>> state) : state_(std::move(state)) {}

  PowerSgdState<T>& state() noexcept { return *state_; }

  // torch's powerSGD_hook up to the first all-reduce, on b.exec's stream; the host never waits. The
  // caller has called begin_bucket (true: compress). The steps and their order are the CPU hook's
  // (parallel/powersgd.hpp, steps 1-4); row-major M (rows x cols) is cuBLAS's column-major M^T, so
  // P = M Q is computed as P^T = Q^T M^T (gemm N, N).
  comm::Work launch(const GradBucket<T, Cuda>& b) {
    PowerSgdState<T>& s = *state_;
    const Exec<Cuda>& exec = b.exec;
    const cudaStream_t cs = cuda_stream(exec);
    const std::span<T> flat = b.buffer;
    Bucket& ps = bucket(b);
    const PowerSgdOptions& o = s.options;
    const PowerSgdPlan& plan = ps.plan;
    if (o.use_error_feedback) {  // 1.
      if (ps.error_valid)
        kernels::cuda::for_each_index(
            exec, flat.size(),
            PowerSgdAddError<T>{.buffer = flat.data(), .error = ps.error.data()});
      DDP_CUDA_CHECK(cudaMemcpyAsync(ps.input.data(), flat.data(), flat.size_bytes(),
                                     cudaMemcpyDeviceToDevice, cs));
    }
    // 3. the CPU's values
    if (s.needs_new_q(ps.q_valid ? static_cast<std::size_t>(plan.n_q) : 0, plan)) {
      std::vector<T> q0(static_cast<std::size_t>(plan.n_q));
      s.initial_q(b.index, plan, std::span<T>(q0));
      if (!q0.empty())  // pageable: read before the call returns
        DDP_CUDA_CHECK(cudaMemcpyAsync(ps.q.data(), q0.data(), q0.size() * sizeof(T),
                                       cudaMemcpyHostToDevice, cs));
      // as the CPU's bk.q now holds n_q values (finish sets warm_start's answer)
      ps.q_valid = true;
    }
    std::int64_t at = 0;
    for (const auto& [off, n] : plan.uncompressed) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(ps.send.data() + at, flat.data() + off,
                                     static_cast<std::size_t>(n) * sizeof(T),
                                     cudaMemcpyDeviceToDevice, cs));
      at += n;
    }
    if (!plan.matrices.empty()) orthogonalize(exec, ps.q.data(), ps.q_jobs, ps);
    PowerSgdBlas& blas = blas_on(cs);
    for (const PowerSgdMatrix& m : plan.matrices)  // P (rows x r) = M Q
      blas.gemm<T>(CUBLAS_OP_N, CUBLAS_OP_N, m.rank, m.rows, m.cols, ps.q.data() + m.q_offset,
                   m.rank, flat.data() + m.offset, m.cols, ps.send.data() + plan.n_unc + m.p_offset,
                   m.rank);
    s.count_compressed(plan, b.is_last);  // 4.
    return b.comm->all_reduce(TensorView<T, Cuda>(ps.send.data(), Shape{plan.send_numel()}),
                              {.op = comm::ReduceOp::Sum, .stream = cs});
  }

  // The CPU hook's `then` (steps 5-6) on exec's stream, after the launched all-reduce: the
  // uncompressed part averaged back into flat; each P orthonormalised; Q = M^T P (gemm N, T); the Q
  // all-reduce (Sum), stream-ordered, its Work deferred (waited by DDP at the next step); Q /= W;
  // M = P Q^T (gemm T, N); the new error. The host does not wait for any of it.
  void finish(const GradBucket<T, Cuda>& b) {
    PowerSgdState<T>& s = *state_;
    Bucket& ps = buckets_[b.index];
    const PowerSgdOptions& o = s.options;
    const PowerSgdPlan& plan = ps.plan;
    const Exec<Cuda>& exec = b.exec;
    const cudaStream_t cs = cuda_stream(exec);
    T* flat = b.buffer.data();
    const double world = b.comm->size();
    if (plan.n_unc > 0)
      kernels::cuda::for_each_index(
          exec, static_cast<std::size_t>(plan.n_unc),
          PowerSgdDivide<T>{.src = ps.send.data(), .dst = ps.send.data(), .world = world});
    std::int64_t at = 0;
    for (const auto& [off, n] : plan.uncompressed) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(flat + off, ps.send.data() + at,
                                     static_cast<std::size_t>(n) * sizeof(T),
                                     cudaMemcpyDeviceToDevice, cs));
      at += n;
    }
    if (!plan.matrices.empty()) {
      PowerSgdBlas& blas = blas_on(cs);
      orthogonalize(exec, ps.send.data(), ps.p_jobs, ps);  // the P jobs' offsets include n_unc
      for (const PowerSgdMatrix& m : plan.matrices)        // Q (cols x r) = M^T P
        blas.gemm<T>(CUBLAS_OP_N, CUBLAS_OP_T, m.rank, m.cols, m.rows,
                     ps.send.data() + plan.n_unc + m.p_offset, m.rank, flat + m.offset, m.cols,
                     ps.q.data() + m.q_offset, m.rank);
      b.defer(b.comm->all_reduce(TensorView<T, Cuda>(ps.q.data(), Shape{plan.n_q}),
                                 {.op = comm::ReduceOp::Sum, .stream = cs}));
      kernels::cuda::for_each_index(
          exec, static_cast<std::size_t>(plan.n_q),
          PowerSgdDivide<T>{.src = ps.q.data(), .dst = ps.q.data(), .world = world});
      for (const PowerSgdMatrix& m : plan.matrices)  // M (rows x cols) = P Q^T
        blas.gemm<T>(CUBLAS_OP_T, CUBLAS_OP_N, m.cols, m.rows, m.rank, ps.q.data() + m.q_offset,
                     m.rank, ps.send.data() + plan.n_unc + m.p_offset, m.rank, flat + m.offset,
                     m.cols);
    }
    if (o.use_error_feedback) {
      kernels::cuda::for_each_index(
          exec, b.buffer.size(),
          PowerSgdNewError<T>{.input = ps.input.data(), .buffer = flat, .error = ps.error.data()});
      ps.error_valid = true;
    }
    ps.q_valid = o.warm_start;
    s.end_compressed_bucket(b.is_last);
  }

 private:
  // What one bucket keeps on the device across steps (the CPU hook's PowerSgdState::Bucket). Freed
  // in stream order, like DDP's flat buffers.
  struct Bucket {
    PowerSgdPlan plan;  // plan_powersgd_bucket of the bucket's layout and shapes
    bool planned = false;
    // (numel) e, error feedback; valid once a compressed step finished (error_valid)
    Tensor<T, Cuda> error;
    Tensor<T, Cuda> input;  // (numel) the buffer after error feedback
    // (n_unc + n_p) [uncompressed | every P]: the all-reduce launched with the bucket
    Tensor<T, Cuda> send;
    // (n_q) every Q, back to back: the all-reduce at finish, kept for warm start
    Tensor<T, Cuda> q;
    // (matrices x kernels::cuda::kOrthogonalizeJobFields) orthogonalisation jobs
    Tensor<std::int64_t, Cuda> q_jobs, p_jobs;
    Tensor<double, Cuda> work;  // Householder scratch (matrices with r > 2)
    bool error_valid = false, q_valid = false;
  };

  // Bucket b.index, planned (host, the CPU hook's function) from b's layout and shapes each call as
  // the CPU hook does; a changed plan (DDP rebuilt its buckets) gets new device buffers. As on the
  // CPU, the error survives when the bucket keeps its size and Q when it keeps n_q.
  Bucket& bucket(const GradBucket<T, Cuda>& b) {
    if (buckets_.size() <= b.index) buckets_.resize(b.index + 1);
    Bucket& ps = buckets_[b.index];
    PowerSgdPlan plan = plan_powersgd_bucket(*b.layout, b.shapes, state_->options);
    if (ps.planned && plan == ps.plan) return ps;
    const auto sized = [](Tensor<T, Cuda>& t, std::int64_t n) {
      if (t.numel() == n) return false;
      t = Tensor<T, Cuda>(Shape{n});
      return true;
    };
    if (state_->options.use_error_feedback) {
      sized(ps.input, plan.numel);
      if (sized(ps.error, plan.numel)) ps.error_valid = false;
    }
    if (sized(ps.q, plan.n_q)) ps.q_valid = false;
    sized(ps.send, plan.send_numel());
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
    // uploaded on the bucket's stream; the host values are read before the copy returns
    const auto upload = [&b](const std::vector<std::int64_t>& v) {
      return to<Cuda>(
          TensorView<const std::int64_t, Cpu>(v.data(), Shape{static_cast<std::int64_t>(v.size())}),
          b.exec);
    };
    ps.q_jobs = upload(qj);
    ps.p_jobs = upload(pj);
    ps.work = std::max(q_work, p_work) > 0 ? Tensor<double, Cuda>(Shape{std::max(q_work, p_work)})
                                           : Tensor<double, Cuda>();
    ps.plan = std::move(plan);
    ps.planned = true;
    return ps;
  }

  // Orthonormalises the matrices `jobs` names in base (one block each), on exec's stream.
  void orthogonalize(const Exec<Cuda>& exec, T* base, const Tensor<std::int64_t, Cuda>& jobs,
                     Bucket& ps) {
    const auto n = static_cast<unsigned>(ps.plan.matrices.size());
    kernels::cuda::orthogonalize_columns(exec, base, jobs.data(), n, ps.work.data(),
                                         state_->options.orthogonalization_epsilon);
  }

  // The GEMM handle (made on first use, on the thread and device that drive DDP), set to stream s.
  PowerSgdBlas& blas_on(cudaStream_t s) {
    if (!blas_) blas_.emplace();
    blas_->set_stream(s);
    return *blas_;
  }

  std::shared_ptr<PowerSgdState<T>> state_;
  std::vector<Bucket> buckets_;
  std::optional<PowerSgdBlas> blas_;
};

}  // namespace detail

// torch's powerSGD_hook on a CUDA model's buckets (see the file comment); copies share one device
// state, and each `then` keeps it alive.
template <class T>
class PowerSgdHook<T, Cuda> {
 public:
  explicit PowerSgdHook(std::shared_ptr<PowerSgdState<T>> state)
      : dev_(std::make_shared<detail::PowerSgdDevice<T>>(std::move(state))) {}
  HookResult operator()(GradBucket<T, Cuda>& b) const {
    // before start_iter: the plain average (torch's _allreduce_fut)
    if (!dev_->state().begin_bucket(b.buffer.size(), b.is_last))
      return detail::all_reduce_average(b);
    comm::Work w = dev_->launch(b);
    return HookResult{.work = std::move(w), .then = [dev = dev_, b] { dev->finish(b); }};
  }

 private:
  std::shared_ptr<detail::PowerSgdDevice<T>> dev_;
};

}  // namespace ddp::parallel
