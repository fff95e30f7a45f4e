// PowerSGD gradient compression (Vogels et al., "PowerSGD: Practical Low-Rank Gradient Compression
// for Distributed Optimization", NeurIPS 2019) as a DDP communication hook: the semantics of torch
// 1.13's powerSGD_hook (torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py); the CPU
// hook here, the CUDA one in parallel/cuda/powersgd.cuh (nvcc).
// SPDX-License-Identifier: MIT
//
//   auto state = std::make_shared<parallel::PowerSgdState<float>>(
//       parallel::PowerSgdOptions{.start_iter = 10});
//   model.register_comm_hook(parallel::powersgd_hook<float>(state));   // or --comm-hook powersgd
//   // a CUDA model: parallel::powersgd_hook<float, Cuda>(state)
//   ... state->bytes_last_step: what the last step put on the wire
//
// For the first start_iter steps every bucket is averaged with a plain all-reduce (compressing too
// early costs accuracy, and DDP rebuilds its buckets after step 0). From then on, per bucket (W
// ranks):
//   1. error feedback: buffer += e, this rank's compression error of this bucket from the last step
//   2. every gradient is viewed as a matrix M (rows = its torch shape[0], cols = the rest) and
//      compressed when should_compress(rows, cols, r): (rows + cols) r min_compression_rate < rows
//      cols, r = min(rows, cols, rank); the others (every 1-D tensor: cols = 1) are summed
//      uncompressed
//   3. Q (cols x r): last step's Q when warm_start, else N(0, 1) values; orthogonalised. P = M Q
//      (rows x r)
//   4. all-reduce (sum) [uncompressed | every P] -- launched here, overlaps backward
//   5. `then`, at finish: uncompressed / W; orthogonalise each P; Q = M^T P; all-reduce (sum) every
//      Q and wait -- after backward, not overlapped; Q /= W; M = P Q^T written into the buffer
//   6. e = the buffer after step 1 - the buffer after step 5 (for uncompressed tensors: local -
//      average, as torch)
// Worked example: a bucket {fc.weight (10 x 64), fc.bias (10)}, rank 1: fc.weight is compressed (74
// * 2 < 640), fc.bias is not; the wire carries 10 + 10 (P) + 64 (Q) = 84 values instead of 650.
// torch runs the uncompressed all-reduce and the P all-reduce as two collectives; they do not
// depend on each other, so we send them as one (the same bytes and sums). Iterations are counted on
// the last bucket of a step (torch's maybe_increase_iter): iter = the number of steps whose last
// bucket completed. Orthogonalisation as torch 1.13: Gram-Schmidt for r <= 2, Householder QR above
// (ours; torch calls LAPACK through torch.linalg.qr). Column signs may differ from LAPACK's, and do
// not matter: flipping P's column j flips Q's column j (Q = M^T P) and P Q^T keeps its value;
// likewise for Q's columns (docs/decisions/0029). The column order of a matrix is ours (conv
// weights are KRSC: columns (kH, kW, C_in), torch's (C_in, kH, kW)): the algorithm is equivariant
// under a column permutation (P = M Q is unchanged when Q's rows are permuted alike), so only a
// test that feeds torch's initial Q has to permute its rows. Both devices: the host-side planning
// below (plan_powersgd_bucket: which tensors are compressed, each matrix's rows / cols / r and its
// offsets in the wire buffers; PowerSgdState's start_iter rule, initial Q and byte counters; the
// element functors) is what both hooks call; only the matrix products and the orthogonalisation are
// written per device (docs/decisions/0029).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "ddp/comm/types.hpp"
#include "ddp/config.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/parallel/bucket.hpp"
#include "ddp/parallel/comm_hooks.hpp"
#include "ddp/parallel/grad_bucket.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/random.hpp"
#include "ddp/tensor/shape.hpp"

namespace ddp::parallel {

// torch's PowerSGDState hyperparameters (same defaults).
struct PowerSgdOptions {
  int matrix_approximation_rank = 1;  // r: the rank of P Q^T (--powersgd-rank)
  // torch's start_powerSGD_iter: plain all-reduce before it (--powersgd-start-iter)
  std::int64_t start_iter = 1000;
  double min_compression_rate = 2;  // compress a matrix only when it shrinks by more than this
  bool use_error_feedback = true;   // add the last step's compression error back in
  bool warm_start = true;           // start from the last step's Q instead of new random values
  double orthogonalization_epsilon = 0;  // added to each column norm (0: a zero column stays zero)
  std::uint64_t random_seed = 0;         // the initial Q's N(0, 1) values (the same on every rank)
  // Optional source of the initial Q instead of the seeded normal values: fills q, the (cols x r)
  // row-major Q of parameter `param` (an index into the module's parameters()) in bucket `bucket`.
  // Tests feed torch's here.
  std::function<void(std::size_t bucket, std::size_t param, std::span<double> q)> initial_q;
};

// ValueError naming the option: rank >= 1, start_iter >= 0, and torch's rule that error feedback
// and warm start need start_iter > 1 (what they remember must not outlive the bucket rebuild after
// step 0).
inline void validate_powersgd_options(const PowerSgdOptions& o) {
  if (o.matrix_approximation_rank < 1)
    throw ValueError(ddp::detail::str("ddp: PowerSGD matrix_approximation_rank must be >= 1, got ",
                                      o.matrix_approximation_rank, " (--powersgd-rank)"));
  if (o.start_iter < 0)
    throw ValueError(ddp::detail::str("ddp: PowerSGD start_iter must be >= 0, got ", o.start_iter,
                                      " (--powersgd-start-iter)"));
  if ((o.use_error_feedback || o.warm_start) && o.start_iter <= 1)
    throw ValueError(ddp::detail::str(
        "ddp: PowerSGD start_iter must be > 1 when use_error_feedback or warm_start is on, got ",
        o.start_iter,
        " (--powersgd-start-iter): DDP rebuilds its buckets after the first step, which would "
        "invalidate the "
        "remembered error and Q"));
  if (!(o.min_compression_rate >= 0) || !(o.orthogonalization_epsilon >= 0))
    throw ValueError(ddp::detail::str(
        "ddp: PowerSGD min_compression_rate and orthogonalization_epsilon must be >= 0, got ",
        o.min_compression_rate, " and ", o.orthogonalization_epsilon));
}

// torch's _should_compress: a rows x cols matrix is worth sending as rank-r factors when (rows +
// cols) r min_rate < rows cols (e.g. 10 x 64 at r = 1: 74 * 2 < 640, yes; a bias 10 x 1: 11 * 2 <
// 10, no).
inline bool should_compress(std::int64_t rows, std::int64_t cols, std::int64_t rank,
                            double min_rate) {
  return static_cast<double>((rows + cols) * rank) * min_rate < static_cast<double>(rows * cols);
}

// One gradient matrix of a bucket that is compressed: M is the (rows x cols) row-major view of the
// bucket buffer at `offset`; its P (rows x r) sits at p_offset in the P part of the launched
// all-reduce, its Q (cols x r) at q_offset in the Q all-reduce (every Q of the bucket, back to
// back).
struct PowerSgdMatrix {
  std::size_t param = 0;    // index into the module's parameters()
  std::int64_t offset = 0;  // element offset in the bucket buffer
  std::int64_t rows = 0, cols = 0, rank = 0;
  // into the P part of the send buffer (after the n_unc uncompressed values)
  std::int64_t p_offset = 0;
  std::int64_t q_offset = 0;  // into the Q buffer
  bool operator==(const PowerSgdMatrix&) const = default;
};

// What one bucket sends once compression started, the same on both devices. Wire buffers
// (elements):
//   send = [uncompressed tensors, bucket order (n_unc) | every P, bucket order (n_p)]   all-reduced
//     at launch
//   q    = [every Q, bucket order (n_q)]
//     all-reduced at finish
// Example (the file head's bucket {fc.weight 10 x 64, fc.bias 10}, r = 1, fc.bias first in the
// bucket): uncompressed = {(0, 10)}, matrices = {offset 10, 10 x 64, p_offset 0, q_offset 0}; n_unc
// 10, n_p 10, n_q 64.
struct PowerSgdPlan {
  std::vector<PowerSgdMatrix> matrices;
  // (offset, numel) in the bucket buffer
  std::vector<std::pair<std::int64_t, std::int64_t>> uncompressed;
  std::int64_t n_unc = 0, n_p = 0, n_q = 0;
  std::int64_t numel = 0;             // the bucket's elements (torch's numel before compression)
  std::int64_t compressed_numel = 0;  // n_unc + n_p + n_q (torch's numel after compression)
  std::int64_t send_numel() const noexcept { return n_unc + n_p; }
  bool operator==(const PowerSgdPlan&) const = default;
};

// The plan of a bucket of `layout`, shapes[k] being the torch shape of layout.params[k]
// (GradBucket::shapes): each gradient viewed as (shape[0], rest), compressed when should_compress
// with r = min(rows, cols, rank). ValueError when the shapes do not match the layout (a transport
// that does not provide them).
inline PowerSgdPlan plan_powersgd_bucket(const BucketLayout& layout, std::span<const Shape> shapes,
                                         const PowerSgdOptions& o) {
  const std::size_t np = layout.params.size();
  if (shapes.size() != np)
    throw ValueError(ddp::detail::str(
        "ddp: the PowerSGD hook needs each parameter's shape (GradBucket::shapes), got ",
        shapes.size(), " for a bucket of ", np,
        " parameters; this transport does not provide them"));
  PowerSgdPlan plan;
  for (std::size_t k = 0; k < np; ++k) {
    const Shape& sh = shapes[k];
    const std::int64_t numel = sh.numel();
    const std::int64_t rows = sh.rank() == 0 ? 1 : sh[0];
    const std::int64_t cols = rows > 0 ? numel / rows : 0;
    const std::int64_t r = std::min<std::int64_t>({rows, cols, o.matrix_approximation_rank});
    const std::int64_t offset = layout.offsets[k];
    plan.numel += numel;
    if (r > 0 && should_compress(rows, cols, r, o.min_compression_rate)) {
      plan.matrices.push_back({.param = layout.params[k],
                               .offset = offset,
                               .rows = rows,
                               .cols = cols,
                               .rank = r,
                               .p_offset = plan.n_p,
                               .q_offset = plan.n_q});
      plan.n_p += rows * r;
      plan.n_q += cols * r;
    } else {
      plan.uncompressed.emplace_back(offset, numel);
      plan.n_unc += numel;
    }
  }
  plan.compressed_numel = plan.n_unc + plan.n_p + plan.n_q;
  return plan;
}

namespace detail {
// The element steps of PowerSGD, written once for both devices (the CPU hook's loops, the CUDA
// transport's for_each_index kernels), so both round alike. Error feedback in: buffer[i] +=
// error[i].
template <class T>
struct PowerSgdAddError {
  T* buffer;
  const T* error;
  DDP_HOST_DEVICE void operator()(std::size_t i) const { buffer[i] += error[i]; }
};
// Error feedback out: error[i] = input[i] - buffer[i] (input: the buffer after PowerSgdAddError).
template <class T>
struct PowerSgdNewError {
  const T* input;
  const T* buffer;
  T* error;
  DDP_HOST_DEVICE void operator()(std::size_t i) const { error[i] = input[i] - buffer[i]; }
};
// The sum over ranks to the average: dst[i] = T(double(src[i]) / world) (src == dst allowed).
template <class T>
struct PowerSgdDivide {
  const T* src;
  T* dst;
  double world;
  DDP_HOST_DEVICE void operator()(std::size_t i) const {
    dst[i] = static_cast<T>(static_cast<double>(src[i]) / world);
  }
};

// Modified Gram-Schmidt on the columns of a (rows x cols) row-major matrix, in place, as torch's
// _orthogonalize_gram_schmidt: column i /= (its norm + eps), then its projection leaves the later
// columns. With eps = 0 a zero column stays zero (torch 1.13 divides by zero there and gets NaN;
// its try/except cannot catch a tensor division).
template <class T>
void gram_schmidt(T* a, std::int64_t rows, std::int64_t cols, double eps) {
  for (std::int64_t i = 0; i < cols; ++i) {
    double sq = 0;
    for (std::int64_t j = 0; j < rows; ++j) sq += double(a[j * cols + i]) * double(a[j * cols + i]);
    const double norm = std::sqrt(sq) + eps;
    const double inv = norm > 0 ? 1.0 / norm : 0.0;
    for (std::int64_t j = 0; j < rows; ++j)
      a[j * cols + i] = static_cast<T>(double(a[j * cols + i]) * inv);
    for (std::int64_t c = i + 1; c < cols; ++c) {
      double dot = 0;
      for (std::int64_t j = 0; j < rows; ++j)
        dot += double(a[j * cols + i]) * double(a[j * cols + c]);
      for (std::int64_t j = 0; j < rows; ++j)
        a[j * cols + c] = static_cast<T>(double(a[j * cols + c]) - dot * double(a[j * cols + i]));
    }
  }
}

// Householder QR of a (rows x cols) row-major matrix, rows >= cols, replaced by its orthonormal
// factor (thin Q), as torch.linalg.qr (LAPACK geqrf + orgqr) in torch's _orthogonalize for rank >
// 2. Unlike Gram-Schmidt it stays orthonormal to rounding when the matrix is (nearly)
// rank-deficient -- e.g. the gradient of a classifier's weight, whose rows sum to zero under
// cross-entropy -- where Gram-Schmidt normalises rounding noise into a column that is not
// orthogonal to the others. Computed in double; a zero column (H = I) is allowed.
template <class T>
void householder_orthonormalize(T* a, std::int64_t rows, std::int64_t cols) {
  const auto at = [cols](std::int64_t i, std::int64_t j) {
    return static_cast<std::size_t>(i * cols + j);
  };
  std::vector<double> r(static_cast<std::size_t>(rows * cols)),
      v(static_cast<std::size_t>(rows * cols), 0.0);
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = a[i];
  // Reflector k: v_k (stored in column k of v, rows k..), H_k = I - 2 v_k v_k^T, zeroes r[k+1..,
  // k].
  for (std::int64_t k = 0; k < cols; ++k) {
    double norm = 0;
    for (std::int64_t i = k; i < rows; ++i) norm += r[at(i, k)] * r[at(i, k)];
    norm = std::sqrt(norm);
    if (norm == 0) continue;  // nothing to reflect: v_k = 0
    const double alpha = r[at(k, k)] > 0 ? -norm : norm;
    double vnorm = 0;
    for (std::int64_t i = k; i < rows; ++i) {
      v[at(i, k)] = r[at(i, k)] - (i == k ? alpha : 0.0);
      vnorm += v[at(i, k)] * v[at(i, k)];
    }
    vnorm = std::sqrt(vnorm);
    for (std::int64_t i = k; i < rows; ++i) v[at(i, k)] /= vnorm;
    for (std::int64_t j = k; j < cols; ++j) {
      double dot = 0;
      for (std::int64_t i = k; i < rows; ++i) dot += v[at(i, k)] * r[at(i, j)];
      for (std::int64_t i = k; i < rows; ++i) r[at(i, j)] -= 2 * dot * v[at(i, k)];
    }
  }
  // Thin Q = H_0 H_1 ... H_{cols-1} applied to the first cols columns of the identity.
  std::vector<double> q(static_cast<std::size_t>(rows * cols), 0.0);
  for (std::int64_t j = 0; j < cols; ++j) q[at(j, j)] = 1;
  for (std::int64_t k = cols - 1; k >= 0; --k)
    for (std::int64_t j = 0; j < cols; ++j) {
      double dot = 0;
      for (std::int64_t i = k; i < rows; ++i) dot += v[at(i, k)] * q[at(i, j)];
      for (std::int64_t i = k; i < rows; ++i) q[at(i, j)] -= 2 * dot * v[at(i, k)];
    }
  for (std::size_t i = 0; i < q.size(); ++i) a[i] = static_cast<T>(q[i]);
}

// torch's _orthogonalize for one matrix: Gram-Schmidt for up to 2 columns, Householder QR above
// (epsilon is Gram-Schmidt's only, as in torch).
template <class T>
void orthogonalize(T* a, std::int64_t rows, std::int64_t cols, double eps) {
  if (cols <= 2)
    gram_schmidt(a, rows, cols, eps);
  else
    householder_orthonormalize(a, rows, cols);
}

// out (n x r) = m (n x k) x q (k x r), or with transpose_m: out (k x r) = m^T x q (q then n x r).
// Row-major; double accumulation.
template <class T>
void matmul(const T* m, const T* q, T* out, std::int64_t n, std::int64_t k, std::int64_t r,
            bool transpose_m) {
  const std::int64_t out_rows = transpose_m ? k : n;
  std::vector<double> acc(static_cast<std::size_t>(out_rows * r), 0.0);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < k; ++j) {
      const double mij = m[i * k + j];
      if (transpose_m)
        for (std::int64_t c = 0; c < r; ++c)
          acc[static_cast<std::size_t>(j * r + c)] += mij * double(q[i * r + c]);
      else
        for (std::int64_t c = 0; c < r; ++c)
          acc[static_cast<std::size_t>(i * r + c)] += mij * double(q[j * r + c]);
    }
  for (std::size_t i = 0; i < acc.size(); ++i) out[i] = static_cast<T>(acc[i]);
}
}  // namespace detail

// torch's PowerSGDState: the options, the step count, what each bucket remembers, and counters a
// caller reads. Shared by the hook and the caller (std::shared_ptr); touched only on the thread
// that drives DDP.
template <class T>
struct PowerSgdState {
  explicit PowerSgdState(PowerSgdOptions o = {})
      : options(std::move(o)), rng(options.random_seed, 0, kRngStream) {
    validate_powersgd_options(options);
  }

  PowerSgdOptions options;
  std::int64_t iter = 0;  // steps whose last bucket completed (torch's state.iter)

  // Wire payload: the elements of every all-reduce this hook started, times sizeof(T) (what one
  // rank hands to the collective; a ring all-reduce moves about 2 (W-1)/W times that per rank).
  std::uint64_t bytes_this_step = 0;  // buckets of the step in progress
  std::uint64_t bytes_last_step = 0;  // the last step whose last bucket was handed over
  std::uint64_t bytes_total = 0;
  // torch's compression_stats(): elements before / after compression, summed over compressed steps.
  std::int64_t numel_before_compression = 0;
  std::int64_t numel_after_compression = 0;

  using Matrix = PowerSgdMatrix;
  // What the CPU hook remembers per bucket (the CUDA hook keeps the same in device memory).
  struct Bucket {
    std::vector<T> error;  // e, one per buffer element (error feedback)
    std::vector<T> input;  // the buffer after error feedback, for the new e
    // every compressed matrix's Q (cols x r), back to back; kept for warm start
    std::vector<T> q;
    std::vector<T> send;  // [uncompressed values | every P (rows x r)]: the launched all-reduce
    PowerSgdPlan plan;    // this step's plan (plan_powersgd_bucket)
  };
  std::vector<Bucket> buckets;  // by bucket index
  Generator rng;                // the initial Q's values when options.initial_q is empty

  // a user stream (tensor/random.hpp: above 255)
  static constexpr std::uint32_t kRngStream = 256 + 15;

  // Adds one hook call's payload; the last bucket of a step closes the step's count.
  void count_bytes(std::size_t elements, bool is_last) {
    const auto b = static_cast<std::uint64_t>(elements * sizeof(T));
    bytes_this_step += b;
    bytes_total += b;
    if (is_last) bytes_last_step = std::exchange(bytes_this_step, 0);
  }

  // The per-bucket rules both devices follow, in call order for one bucket: begin_bucket at launch:
  // false while iter < start_iter, the bucket then being a plain average (Avg all-reduce of all
  // `numel` elements, counted here, as is the step when is_last); true: compress it.
  bool begin_bucket(std::size_t numel, bool is_last) {
    if (iter >= options.start_iter) return true;
    count_bytes(numel, is_last);
    if (is_last) ++iter;
    return false;
  }
  // Compressing: counts the plan's elements (compression_stats) and its wire payload (send + q).
  void count_compressed(const PowerSgdPlan& p, bool is_last) {
    numel_before_compression += p.numel;
    numel_after_compression += p.compressed_numel;
    count_bytes(static_cast<std::size_t>(p.compressed_numel), is_last);
  }
  // Whether Q must be (re)initialised, given how many Q elements the bucket holds from its last
  // step.
  bool needs_new_q(std::size_t q_held, const PowerSgdPlan& p) const {
    return !options.warm_start || q_held != static_cast<std::size_t>(p.n_q);
  }
  // The initial Q of every matrix of bucket `bucket` into q (p.n_q elements, host memory):
  // options.initial_q or N(0, 1) values of rng, matrix after matrix (the same values on every rank
  // and on either device).
  void initial_q(std::size_t bucket, const PowerSgdPlan& p, std::span<T> q) {
    std::vector<double> init;
    for (const auto& m : p.matrices) {
      init.assign(static_cast<std::size_t>(m.cols * m.rank), 0.0);
      if (options.initial_q)
        options.initial_q(bucket, m.param, std::span<double>(init));
      else
        rng.fill_normal(TensorView<double, Cpu>(init.data(), Shape{m.cols * m.rank}), 0.0, 1.0);
      std::transform(init.begin(), init.end(), q.begin() + m.q_offset,
                     [](double v) { return static_cast<T>(v); });
    }
  }
  // At finish of a compressed bucket (after its Q all-reduce): the last bucket of a step ends the
  // step.
  void end_compressed_bucket(bool is_last) {
    if (is_last) ++iter;
  }
};

namespace detail {
template <class T>
HookResult powersgd_compress(PowerSgdState<T>& s, GradBucket<T>& b) {
  const PowerSgdOptions& o = s.options;
  if (s.buckets.size() <= b.index) s.buckets.resize(b.index + 1);
  auto& bk = s.buckets[b.index];
  const std::span<T> buf = b.buffer;

  // 1. Error feedback (a bucket of a new size, e.g. rebuilt, starts from zero error: torch would
  //    fail there).
  if (o.use_error_feedback) {
    if (bk.error.size() == buf.size()) {
      const PowerSgdAddError<T> add{.buffer = buf.data(), .error = bk.error.data()};
      for (std::size_t i = 0; i < buf.size(); ++i) add(i);
    } else {
      bk.error.assign(buf.size(), T(0));
    }
    bk.input.assign(buf.begin(), buf.end());
  }

  // 2. Which gradients are compressed.
  bk.plan = plan_powersgd_bucket(*b.layout, b.shapes, o);
  const PowerSgdPlan& plan = bk.plan;
  const std::int64_t n_unc = plan.n_unc;

  // 3. Q: kept from the last step (warm start) or new; orthogonalised either way, as torch. P = M
  //    Q.
  if (s.needs_new_q(bk.q.size(), plan)) {
    bk.q.assign(static_cast<std::size_t>(plan.n_q), T(0));
    s.initial_q(b.index, plan, std::span<T>(bk.q));
  }
  bk.send.assign(static_cast<std::size_t>(plan.send_numel()), T(0));
  std::int64_t at = 0;
  for (const auto& [off, n] : plan.uncompressed) {
    std::copy_n(buf.data() + off, n, bk.send.data() + at);
    at += n;
  }
  for (const auto& m : plan.matrices) {
    T* q = bk.q.data() + m.q_offset;
    orthogonalize(q, m.cols, m.rank, o.orthogonalization_epsilon);
    matmul(buf.data() + m.offset, q, bk.send.data() + n_unc + m.p_offset, m.rows, m.cols, m.rank,
           false);
  }

  // 4. One all-reduce for the uncompressed values and every P (torch: two independent ones).
  s.count_compressed(plan, b.is_last);
  comm::Work work = b.comm->all_reduce(std::span<T>(bk.send), {.op = comm::ReduceOp::Sum});

  // 5./6. At finish. `s` outlives the hook call (the hook holds the shared state); bk is looked up
  // again because a later bucket may grow s.buckets.
  auto then = [&s, index = b.index, buf, comm = b.comm, is_last = b.is_last, n_unc] {
    const PowerSgdOptions& o = s.options;
    auto& bk = s.buckets[index];
    const double world = comm->size();
    std::int64_t at = 0;
    for (const auto& [off, n] : bk.plan.uncompressed) {
      const PowerSgdDivide<T> avg{
          .src = bk.send.data() + at, .dst = buf.data() + off, .world = world};
      for (std::int64_t i = 0; i < n; ++i) avg(static_cast<std::size_t>(i));
      at += n;
    }
    for (const auto& m : bk.plan.matrices) {
      // summed over ranks; orthogonalisation removes the scale
      T* p = bk.send.data() + n_unc + m.p_offset;
      orthogonalize(p, m.rows, m.rank, o.orthogonalization_epsilon);
      matmul(buf.data() + m.offset, p, bk.q.data() + m.q_offset, m.rows, m.cols, m.rank, true);
    }
    if (!bk.q.empty()) comm->all_reduce(std::span<T>(bk.q), {.op = comm::ReduceOp::Sum}).wait();
    const PowerSgdDivide<T> q_avg{.src = bk.q.data(), .dst = bk.q.data(), .world = world};
    for (std::size_t i = 0; i < bk.q.size(); ++i) q_avg(i);
    std::vector<T> qt;
    for (const auto& m : bk.plan.matrices) {
      // M = P Q^T: (rows x r) x (r x cols); Q^T made explicit so matmul's row-major form applies.
      qt.resize(static_cast<std::size_t>(m.rank * m.cols));
      const T* q = bk.q.data() + m.q_offset;
      for (std::int64_t j = 0; j < m.cols; ++j)
        for (std::int64_t c = 0; c < m.rank; ++c)
          qt[static_cast<std::size_t>(c * m.cols + j)] = q[j * m.rank + c];
      matmul(bk.send.data() + n_unc + m.p_offset, qt.data(), buf.data() + m.offset, m.rows, m.rank,
             m.cols, false);
    }
    if (o.use_error_feedback) {
      const PowerSgdNewError<T> err{
          .input = bk.input.data(), .buffer = buf.data(), .error = bk.error.data()};
      for (std::size_t i = 0; i < buf.size(); ++i) err(i);
    }
    if (!o.warm_start) bk.q.clear();
    s.end_compressed_bucket(is_last);
  };
  return HookResult{.work = std::move(work), .then = std::move(then)};
}
}  // namespace detail

// The hook object of device D: the CPU one below, PowerSgdHook<T, Cuda> in
// parallel/cuda/powersgd.cuh. The primary template turns a missing device into a message.
template <class T, Device D>
class PowerSgdHook {
  static_assert(ddp::detail::dependent_false<D>,
                "ddp: PowerSGD for CUDA models is in <ddp/parallel/cuda/powersgd.cuh>, which only "
                "nvcc compiles: include <ddp/ddp.hpp> in a .cu file and link ddp::cuda");
};

template <class T>
class PowerSgdHook<T, Cpu> {
 public:
  explicit PowerSgdHook(std::shared_ptr<PowerSgdState<T>> state) : state_(std::move(state)) {}
  HookResult operator()(GradBucket<T, Cpu>& b) const {
    // before start_iter: the plain average (torch's _allreduce_fut)
    if (!state_->begin_bucket(b.buffer.size(), b.is_last)) return detail::all_reduce_average(b);
    HookResult r = detail::powersgd_compress(*state_, b);
    // Keep the state alive for `then` even if the hook is replaced before finish.
    r.then = [state = state_, f = std::move(r.then)] { f(); };
    return r;
  }

 private:
  std::shared_ptr<PowerSgdState<T>> state_;
};

// The PowerSGD hook of device D over a state the caller may keep to read the counters (validated
// at construction).
template <class T, Device D = Cpu>
CommHook<T, D> powersgd_hook(std::shared_ptr<PowerSgdState<T>> state) {
  if (!state)
    throw ValueError(
        "ddp: powersgd_hook got no state; pass std::make_shared<PowerSgdState<T>>(options)");
  return PowerSgdHook<T, D>(std::move(state));
}

template <class T, Device D = Cpu>
CommHook<T, D> powersgd_hook(const PowerSgdOptions& o = {}) {
  return powersgd_hook<T, D>(std::make_shared<PowerSgdState<T>>(o));
}

}  // namespace ddp::parallel
