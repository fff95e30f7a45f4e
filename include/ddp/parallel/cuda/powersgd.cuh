// PowerSGD on the device: PowerSgdDevice<T>, what Transport<T, Cuda> (parallel/cuda/transport.cuh)
// runs for --comm-hook powersgd, and its orthogonalisation kernel and cuBLAS handle. Compiled only
// by nvcc.
// SPDX-License-Identifier: MIT
//
// The host-side part is the CPU hook's own (parallel/powersgd.hpp): plan_powersgd_bucket,
// PowerSgdState's start_iter rule, initial Q and counters, and the element functors. Per bucket (W
// ranks), on the transport's communication stream, after the bucket's copies:
//   launch   flat += e; input = flat; Q = the CPU hook's initial values (host generator, copied up)
//     or last
//            step's; orthogonalise Q (kernel); P = M Q (cuBLAS) per compressed matrix M; all-reduce
//              (Sum) of
//            [uncompressed | every P]. Before start_iter: nothing (the transport runs the plain
//              average).
//   finish   uncompressed /= W back into flat; orthogonalise every P; Q = M^T P; all-reduce (Sum)
//     of every Q;
//            Q /= W; M = P Q^T into flat; e = input - flat (the CPU hook's `then`, after backward).
// Orthogonalisation is one kernel per bucket, one block per matrix
// (kernels/cuda/orthogonalize.cuh): the CPU's steps with block-tree sums, so the result follows the
// CPU hook to rounding, not bit for bit (docs/decisions/0029). The GEMMs use a cuBLAS handle of
// this object's own, bound to the comm stream, not the thread's handle that backward uses on the
// compute stream.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
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
#include "ddp/nn/parameter.hpp"
#include "ddp/parallel/bucket.hpp"
#include "ddp/parallel/powersgd.hpp"
#include "ddp/tensor/cuda/allocator.hpp"
#include "ddp/tensor/cuda/copy.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::parallel::detail {

// PowerSGD's GEMMs on the comm stream go through a cuBLAS handle of the transport's own: the
// thread's handle (kernels/cuda/blas.cuh) serves backward's GEMMs on the compute stream at the same
// time, and one handle's workspace must not serve two streams at once. Bound to the comm stream for
// life; destroyed with the transport (cublasDestroy waits for the device, after drain() has waited
// for the collectives).
class PowerSgdBlas {
 public:
  explicit PowerSgdBlas(cudaStream_t s) {
    DDP_CUBLAS_CHECK(cublasCreate(&h_));
    // the same bits run to run
    DDP_CUBLAS_CHECK(cublasSetAtomicsMode(h_, CUBLAS_ATOMICS_NOT_ALLOWED));
    DDP_CUBLAS_CHECK(cublasSetStream(h_, s));
  }
  PowerSgdBlas(const PowerSgdBlas&) = delete;
  PowerSgdBlas& operator=(const PowerSgdBlas&) = delete;
  ~PowerSgdBlas() {
    if (const cublasStatus_t st = cublasDestroy(h_); st != CUBLAS_STATUS_SUCCESS)
      DDP_LOG_ERROR(ddp::detail::cublas_error_text("cublasDestroy(h_)", st, __FILE__, __LINE__));
  }

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

// --comm-hook powersgd on a CUDA model: the state (counters, iter, the generator of initial Q) and,
// per bucket, the device buffers. Driven by Transport<T, Cuda>: build at every bucket (re)build,
// launch and finish per bucket.
template <class T>
class PowerSgdDevice {
 public:
  // Validates the options (PowerSgdState); `comm_stream` is the transport's, which outlives this
  // object.
  PowerSgdDevice(const PowerSgdOptions& o, cudaStream_t comm_stream)
      : state_(o), blas_(comm_stream) {}

  // The counters (bytes on the wire, compression_stats, iter); its host `buckets` stay empty (ours
  // are here).
  const PowerSgdState<T>& state() const noexcept { return state_; }

  // One bucket per layout, planned from the parameters' torch shapes; the old ones are freed in
  // stream order.
  void build(const std::vector<BucketLayout>& layouts,
             const std::vector<nn::Parameter<T, Cuda>*>& params, const Exec<Cuda>& comm_exec) {
    std::vector<Bucket> fresh(layouts.size());
    for (std::size_t b = 0; b < layouts.size(); ++b) plan(fresh[b], layouts[b], params, comm_exec);
    buckets_ = std::move(fresh);
  }

  // torch's powerSGD_hook up to the first all-reduce, on exec's stream (the comm stream, after the
  // bucket's copies); the host never waits. Before start_iter: nullopt, and the caller runs the
  // plain Avg all-reduce. The steps and their order are the CPU hook's (parallel/powersgd.hpp,
  // steps 1-4); row-major M (rows x cols) is cuBLAS's column-major M^T, so P = M Q is computed as
  // P^T = Q^T M^T (gemm N, N).
  std::optional<comm::Work> launch(std::size_t b, const Exec<Cuda>& exec, std::span<T> flat,
                                   comm::Communicator& comm) {
    PowerSgdState<T>& s = state_;
    Bucket& ps = buckets_[b];
    const bool is_last = b + 1 == buckets_.size();
    const cudaStream_t cs = cuda_stream(exec);
    ps.compressed = s.begin_bucket(flat.size(), is_last);
    if (!ps.compressed) return std::nullopt;
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
      s.initial_q(b, plan, std::span<T>(q0));
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
    for (const PowerSgdMatrix& m : plan.matrices)  // P (rows x r) = M Q
      blas_.gemm<T>(CUBLAS_OP_N, CUBLAS_OP_N, m.rank, m.rows, m.cols, ps.q.data() + m.q_offset,
                    m.rank, flat.data() + m.offset, m.cols,
                    ps.send.data() + plan.n_unc + m.p_offset, m.rank);
    s.count_compressed(plan, is_last);  // 4.
    return comm.all_reduce(TensorView<T, Cuda>(ps.send.data(), Shape{plan.send_numel()}),
                           {.op = comm::ReduceOp::Sum, .stream = cs});
  }

  // The CPU hook's `then` (steps 5-6) on exec's stream, after the launched all-reduce: the
  // uncompressed part averaged back into flat; each P orthonormalised; Q = M^T P (gemm N, T); the Q
  // all-reduce (Sum) stream- ordered, its Work appended to `retired` (waited at the next begin_step
  // like the bucket's); Q /= W; M = P Q^T (gemm T, N); the new error. Enqueued at finish, after
  // backward, as on the CPU; the host does not wait for any of it. Nothing when this step's launch
  // did not compress.
  void finish(std::size_t b, const Exec<Cuda>& exec, std::span<T> flat_span,
              comm::Communicator& comm, std::vector<comm::Work>& retired) {
    PowerSgdState<T>& s = state_;
    Bucket& ps = buckets_[b];
    if (!ps.compressed) return;
    const PowerSgdOptions& o = s.options;
    const PowerSgdPlan& plan = ps.plan;
    const cudaStream_t cs = cuda_stream(exec);
    T* flat = flat_span.data();
    const double world = comm.size();
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
      orthogonalize(exec, ps.send.data(), ps.p_jobs, ps);  // the P jobs' offsets include n_unc
      for (const PowerSgdMatrix& m : plan.matrices)        // Q (cols x r) = M^T P
        blas_.gemm<T>(CUBLAS_OP_N, CUBLAS_OP_T, m.rank, m.cols, m.rows,
                      ps.send.data() + plan.n_unc + m.p_offset, m.rank, flat + m.offset, m.cols,
                      ps.q.data() + m.q_offset, m.rank);
      retired.push_back(comm.all_reduce(TensorView<T, Cuda>(ps.q.data(), Shape{plan.n_q}),
                                        {.op = comm::ReduceOp::Sum, .stream = cs}));
      kernels::cuda::for_each_index(
          exec, static_cast<std::size_t>(plan.n_q),
          PowerSgdDivide<T>{.src = ps.q.data(), .dst = ps.q.data(), .world = world});
      for (const PowerSgdMatrix& m : plan.matrices)  // M (rows x cols) = P Q^T
        blas_.gemm<T>(CUBLAS_OP_T, CUBLAS_OP_N, m.cols, m.rows, m.rank, ps.q.data() + m.q_offset,
                      m.rank, ps.send.data() + plan.n_unc + m.p_offset, m.rank, flat + m.offset,
                      m.cols);
    }
    if (o.use_error_feedback) {
      kernels::cuda::for_each_index(
          exec, flat_span.size(),
          PowerSgdNewError<T>{.input = ps.input.data(), .buffer = flat, .error = ps.error.data()});
      ps.error_valid = true;
    }
    ps.q_valid = o.warm_start;
    ps.compressed = false;
    s.end_compressed_bucket(b + 1 == buckets_.size());
  }

 private:
  // What one bucket keeps on the device across steps (the CPU hook's PowerSgdState::Bucket),
  // allocated by build() from the bucket's plan. Freed in stream order, like the transport's flat
  // buffers.
  struct Bucket {
    // plan_powersgd_bucket, fixed for the bucket's life (its shapes do not change)
    PowerSgdPlan plan;
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
    // this step's launch compressed (false: a plain Avg all-reduce, before start_iter)
    bool compressed = false;
  };

  // A bucket's plan (host, the CPU hook's function), its device buffers, and its orthogonalisation
  // jobs (uploaded on ce, the comm stream; the host values are read before the copy returns).
  void plan(Bucket& ps, const BucketLayout& l, const std::vector<nn::Parameter<T, Cuda>*>& params,
            const Exec<Cuda>& ce) {
    std::vector<Shape> shapes;
    for (std::size_t i : l.params) shapes.push_back(params[i]->torch_shape());
    ps.plan = plan_powersgd_bucket(l, shapes, state_.options);
    const PowerSgdPlan& plan = ps.plan;
    if (state_.options.use_error_feedback) {
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
    const auto upload = [&ce](const std::vector<std::int64_t>& v) {
      return to<Cuda>(
          TensorView<const std::int64_t, Cpu>(v.data(), Shape{static_cast<std::int64_t>(v.size())}),
          ce);
    };
    ps.q_jobs = upload(qj);
    ps.p_jobs = upload(pj);
    if (std::max(q_work, p_work) > 0)
      ps.work = Tensor<double, Cuda>(Shape{std::max(q_work, p_work)});
  }

  // Orthonormalises the matrices `jobs` names in base (one block each), on exec's stream.
  void orthogonalize(const Exec<Cuda>& exec, T* base, const Tensor<std::int64_t, Cuda>& jobs,
                     Bucket& ps) {
    const auto n = static_cast<unsigned>(ps.plan.matrices.size());
    kernels::cuda::orthogonalize_columns(exec, base, jobs.data(), n, ps.work.data(),
                                         state_.options.orthogonalization_epsilon);
  }

  PowerSgdState<T> state_;
  PowerSgdBlas blas_;
  std::vector<Bucket> buckets_;
};

}  // namespace ddp::parallel::detail
