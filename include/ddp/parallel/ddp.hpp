// DistributedDataParallel: wraps a Module so that every rank trains the same model on its own data
// (PyTorch DDP).
// SPDX-License-Identifier: MIT
//
//   ddp::parallel::DistributedDataParallel<float, Cpu> model(
//       net, *comm, {.bucket_cap_bytes = 25 << 20});
//   Tensor<float, Cpu> y = model.forward(exec, x.cview());   // broadcasts rank 0's buffers first
//   double loss = ce.forward(exec, y.cview(), labels.cview());
//   model.backward(exec, ce.backward(exec).cview());         // all-reduces buckets while backward
//     runs;
//   opt.step(exec);                                           // grads are the average over ranks
//     here
//   { auto guard = model.no_sync(); ... forward + backward ... }  // accumulate locally, no
//     communication
//   { auto guard = model.no_grad(); ... forward only ... }         // evaluation: no step, no
//     buffer sync after
//
// Semantics (docs/decisions/0008, PyTorch's):
// - Construction broadcasts every parameter and buffer from rank 0 (one flat broadcast per dtype),
//   so ranks may initialise differently; every rank must construct it (it is collective).
// - Construction also checks that every rank has the same parameter shapes in the same order; a
//   mismatch is a ValueError on every rank naming the first differing rank and parameter (torch's
//   _verify_params_across_processes).
// - forward(): broadcasts the buffers (BatchNorm running statistics, num_batches_tracked) from rank
//   0 when broadcast_buffers is set AND the previous forward was a synchronised one with gradients
//   (the first forward counts as such) -- torch's require_forward_param_sync rule: buffers follow
//   rank 0 at each synchronised step, not inside no_sync() accumulation or after inference; then it
//   starts a synchronised step unless a no_sync() or no_grad() guard is alive.
// - no_grad(): torch.no_grad() for this wrapper: forwards under it do not start a synchronised step
//   (no backward follows, e.g. evaluation) and count as gradient-free for the buffer rule.
// - backward(): the module's backward; each parameter's grad-ready hook fills its bucket and
//   launches the bucket's all-reduce (Avg) as soon as the bucket is complete (reducer.hpp); when
//   backward returns, finish() waits for every bucket and writes the averaged gradients into
//   grad(), exactly as torch's loss.backward() returns with averaged .grad. Call finish() yourself
//   if you run the module's backward directly.
// - no_sync(): while the guard lives, forward/backward only accumulate gradients locally; the next
//   synchronised backward all-reduces the accumulated sum (divided by world size, as in PyTorch).
// - A parameter without a gradient in a synchronised step is an Error naming it, unless
//   find_unused_parameters (then torch >= 2.0's rules, reducer.hpp, docs/decisions/0025).
// - register_comm_hook(hook): what a full bucket's gradients go through (parallel/grad_bucket.hpp),
//   a built-in (parallel/comm_hooks.hpp, powersgd.hpp; also by name: DdpOptions::comm_hook) or
//   your own, on either device.
// - gradient_as_bucket_view: grad() is a view into its bucket (parallel/grad_views.hpp), by default
//   on CPU (docs/decisions/0054); static_graph: the first step's unused parameters are reused
//   without the flag all-reduce (docs/decisions/0033).
// - Uneven inputs (torch's `with model.join():`, docs/decisions/0030): ranks may run different
//   numbers of steps inside a join context; a rank out of data calls join(), which takes part in
//   the others' collectives with zero gradients until every rank has joined, then gives every rank
//   the model of the last rank to join:
//     { auto joining = model.join_context();   // every forward now also counts the ranks still
//       training
//       for (auto& batch : my_batches) { ...forward, backward, opt.step... }
//       model.join(); }                         // returns on every rank at once, parameters equal
//         everywhere
//   Inside the context buffers follow the highest rank still training (rank 0 may be done), and the
//     average
//   divides by the full world size (joined ranks add zeros: torch's
//     divide_by_initial_world_size=True).
// Not thread-safe: one thread drives forward/backward (the backend runs the all-reduces on its own
// thread). Devices: the bucket schedule is the same on both (parallel/reducer.hpp); the data moves
// through the device's transport (parallel/transport.hpp, parallel/cuda/transport.cuh). CUDA models
// (DistributedDataParallel<float, Cuda>, --backend nccl) need a .cu file that includes
// <ddp/ddp.hpp>: buckets are reduced on a communication stream ordered by events and the compute
// stream waits for them (no host synchronisation in backward); broadcasts are enqueued on the
// exec's stream (the host waits only for the one at construction).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/parameter.hpp"
#include "ddp/parallel/bucket.hpp"
#include "ddp/parallel/comm_hooks.hpp"
#include "ddp/parallel/ddp_options.hpp"
#include "ddp/parallel/reducer.hpp"
#include "ddp/parallel/step_trace.hpp"
#include "ddp/parallel/transport.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::parallel {

// T: the parameters' type (buckets, hooks and broadcasts are T); A: the module's activations'
// (nn::Module<T, D, A>, A = bfloat16 for bf16 activation storage, docs/decisions/0070).
template <class T, Device D, class A = T>
class DistributedDataParallel {
 public:
  using value_type = T;
  using activation_type = A;
  using device_type = D;

  // RAII guard returned by no_sync() and no_grad(): clears one of the two mode flags and restores
  // its previous value when destroyed.
  class ModeGuard {
   public:
    explicit ModeGuard(bool& flag) : flag_(&flag), prev_(flag) { flag = false; }
    ModeGuard(const ModeGuard&) = delete;
    ModeGuard& operator=(const ModeGuard&) = delete;
    ~ModeGuard() { *flag_ = prev_; }

   private:
    bool* flag_;  // a mode flag of the DistributedDataParallel that made the guard
    bool prev_;
  };

  // RAII guard returned by join_context(): join mode while it lives. Its destructor only clears the
  // mode (no collectives); leaving the scope without join() (an exception) leaves the other ranks
  // to their timeout.
  class JoinContext {
   public:
    explicit JoinContext(DistributedDataParallel& ddp) : ddp_(&ddp) {
      if (ddp.join_mode_)
        throw ValueError(
            "ddp: join_context() is already active on this model; keep one join context per loop");
      ddp.join_mode_ = true;
      ddp.joined_ = false;
    }
    JoinContext(const JoinContext&) = delete;
    JoinContext& operator=(const JoinContext&) = delete;
    ~JoinContext() { ddp_->join_mode_ = ddp_->joined_ = false; }

   private:
    DistributedDataParallel* ddp_;
  };

  // Collective: every rank constructs it with the same model structure. The module and communicator
  // must outlive this object.
  DistributedDataParallel(nn::Module<T, D, A>& module, comm::Communicator& comm,
                          const DdpOptions& o = {})
      : module_(&module), comm_(&comm), o_(o), reducer_(module.parameters(), o, comm) {
    verify_shapes_across_ranks();
    broadcast_parameters();
    broadcast_buffers();
    module_->set_grad_ready_hook([this](nn::Parameter<T, D>& p) { reducer_.mark_ready(p); });
  }
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;
  ~DistributedDataParallel() { module_->set_grad_ready_hook({}); }

  Tensor<A, D> forward(Exec<D>& exec, TensorView<const A, D> x) {
    begin_forward(exec);
    return module_->forward(exec, x);
  }
  // The same for a module whose input is int64 token ids (nn::Embedding, nn::GPT).
  Tensor<A, D> forward(Exec<D>& exec, TensorView<const std::int64_t, D> ids) {
    begin_forward(exec);
    return module_->forward(exec, ids);
  }

  // The module's backward, then finish(): gradients are averaged over ranks when it returns.
  Tensor<A, D> backward(Exec<D>& exec, TensorView<const A, D> dy) {
    Tensor<A, D> dx = module_->backward(exec, dy);
    finish();
    return dx;
  }

  // Waits for every bucket of the current synchronised step and writes the averages into grad().
  // No-op outside a synchronised step (idempotent).
  void finish() { reducer_.finish(); }

  // [[nodiscard]]: the guard must be kept in a variable for the scope of the accumulation.
  [[nodiscard]] ModeGuard no_sync() { return ModeGuard(sync_); }
  bool sync_enabled() const noexcept { return sync_; }
  // Inference forwards (evaluation): no synchronised step starts, and buffers are not broadcast
  // before the next forward (torch.no_grad()). Keep the guard in a variable.
  [[nodiscard]] ModeGuard no_grad() { return ModeGuard(grad_); }

  // Uneven inputs (docs/decisions/0030): every rank enters the context before its loop (keep the
  // guard in a variable) and calls join() after it. Collective: all ranks, the same forwards until
  // one runs out of data.
  [[nodiscard]] JoinContext join_context() { return JoinContext(*this); }

  // This rank is out of data: until every rank has called join(), take part in each forward of the
  // ranks still training -- their buffer broadcast, and for a synchronised one every bucket's
  // reduction with zero gradients (through the comm hook), the find_unused_parameters flags and the
  // first step's bucket rebuild; grad() is left alone. Then the parameters and buffers of the
  // highest-numbered rank among the last to join are broadcast to every rank (the others skipped
  // optimizer steps; optimizer state such as momentum stays each rank's own, as in torch). Returns
  // on every rank after the same collective. Call it between steps, inside join_context(), once;
  // forward() afterwards in the same context is an Error.
  void join(const Exec<D>& exec = {}) {
    if (!join_mode_)
      throw Error(
          "ddp: join() outside a join context; enter `auto joining = model.join_context();` on "
          "every "
          "rank before the training loop and call join() after it");
    if (joined_)
      throw Error(
          "ddp: join() called twice in one join context; call it once, after this rank's loop");
    if (reducer_.active())
      throw Error(ddp::detail::str("ddp: join() during synchronised step ", step_ - 1,
                                   "; run its backward (or finish()) first"));
    joined_ = true;
    bool last = true;  // no rank was still training when this one joined
    while (true) {
      const JoinRound r = join_round(false, false, false);
      if (r.training == 0) break;
      last = false;
      if (r.buffers) broadcast_buffers(exec, r.buffer_root);
      if (r.synchronised) reducer_.shadow_step(exec);
    }
    // torch's _sync_final_model: the highest rank among the last to join holds the model every rank
    // ends with.
    const int world = comm_->size();
    std::vector<std::int64_t> lasts(static_cast<std::size_t>(world), 0);
    lasts[static_cast<std::size_t>(comm_->rank())] = last ? 1 : 0;
    reducer_.any_rank(std::span<std::int64_t>(lasts));
    int root = world - 1;
    while (root > 0 && lasts[static_cast<std::size_t>(root)] == 0) --root;
    broadcast_parameters(root);
    broadcast_buffers(exec, root);
    buffers_follow_ = true;  // every rank the same, whatever its last forward was
  }
  // Inside join_context() (join() may have been called).
  bool join_mode() const noexcept { return join_mode_; }

  // Replaces what a full bucket goes through (parallel/grad_bucket.hpp), e.g.
  // parallel::fp16_compress_hook<float, D>() or your own; call it between steps, on every rank.
  void register_comm_hook(CommHook<T, D> hook) { reducer_.set_comm_hook(std::move(hook)); }

  // Every parameter value from rank `root` (one flat broadcast; the host waits for it).
  void broadcast_parameters(int root = 0) {
    std::vector<std::span<T>> parts;
    for (auto* p : module_->parameters()) parts.push_back(span_of(p->value()));
    reducer_.broadcaster().broadcast(parts, Exec<D>{}, /*host_wait=*/true, root);
  }

  // Every buffer from rank `root`: one broadcast for the real-valued ones, one for the int64
  // counters. On CUDA they are enqueued on exec's stream (which waits for them) and the host does
  // not wait.
  void broadcast_buffers(const Exec<D>& exec = {}, int root = 0) {
    std::vector<std::span<T>> reals;
    std::vector<std::span<std::int64_t>> counts;
    for (auto* b : module_->buffers()) {
      if (b->is_integer())
        counts.push_back(span_of(b->count()));
      else
        reals.push_back(span_of(b->real()));
    }
    auto& bc = reducer_.broadcaster();
    bc.broadcast(reals, exec, /*host_wait=*/false, root);
    bc.broadcast(counts, exec, /*host_wait=*/false, root);
  }

  nn::Module<T, D, A>& module() noexcept { return *module_; }
  comm::Communicator& communicator() noexcept { return *comm_; }
  const DdpOptions& options() const noexcept { return o_; }
  // The current buckets (parameter indices into module().parameters()).
  const std::vector<BucketLayout>& buckets() const noexcept { return reducer_.layouts(); }
  // Launch times of the last synchronised step's buckets and the end of its backward.
  const StepTrace& last_trace() const noexcept { return reducer_.last_trace(); }
  // Synchronised forwards so far (the step number that errors quote is 0-based).
  std::int64_t steps() const noexcept { return step_; }

 private:
  // A tensor's elements as a span (in D's memory: the broadcaster's parts).
  template <class V>
  static std::span<V> span_of(Tensor<V, D>& t) {
    return std::span<V>(t.data(), static_cast<std::size_t>(t.numel()));
  }

  nn::Module<T, D, A>* module_;
  comm::Communicator* comm_;
  DdpOptions o_;

  // What every forward does before the module's: the join round or the buffer broadcast, then the
  // reducer's step when this forward is a synchronised one.
  void begin_forward(Exec<D>& exec) {
    const bool synchronised = sync_ && grad_;
    if (join_mode_) {
      if (joined_)
        throw Error(
            "ddp: forward() after join() in the same join context; a joined rank has no data left "
            "-- "
            "leave the context (destroy the join_context() guard) before training or evaluating "
            "again");
      const JoinRound r = join_round(true, o_.broadcast_buffers && buffers_follow_, synchronised);
      if (r.buffers) broadcast_buffers(exec, r.buffer_root);
    } else if (o_.broadcast_buffers && buffers_follow_) {
      broadcast_buffers(exec);
    }
    buffers_follow_ = synchronised;  // torch: require_forward_param_sync
    if (synchronised) reducer_.prepare_step(step_++, exec);
  }

  // What one round of join mode agreed on (every forward inside join_context(), every loop of
  // join()).
  struct JoinRound {
    int training = 0;      // ranks that have not joined
    bool buffers = false;  // the forward broadcasts the buffers ...
    // ... from the highest rank still training (torch: rank 0 may have joined)
    int buffer_root = 0;
    bool synchronised = false;  // a synchronised step follows: joined ranks shadow it
  };
  // One max-reduction of [training on rank 0 .. W-1, buffers, synchronised] (a joined rank adds
  // zeros), so that joined ranks issue exactly the collectives of this forward. torch spends two
  // all-reduces (the count and _check_global_requires_backward_grad_sync) and one more for the
  // buffer rank.
  JoinRound join_round(bool training, bool buffers, bool synchronised) {
    const int world = comm_->size();
    std::vector<std::int64_t> f(static_cast<std::size_t>(world) + 2, 0);
    f[static_cast<std::size_t>(comm_->rank())] = training ? 1 : 0;
    f[static_cast<std::size_t>(world)] = buffers ? 1 : 0;
    f[static_cast<std::size_t>(world) + 1] = synchronised ? 1 : 0;
    reducer_.any_rank(std::span<std::int64_t>(f));
    JoinRound r;
    for (int q = 0; q < world; ++q)
      if (f[static_cast<std::size_t>(q)] != 0) ++r.training, r.buffer_root = q;
    r.buffers = f[static_cast<std::size_t>(world)] != 0;
    r.synchronised = f[static_cast<std::size_t>(world) + 1] != 0;
    return r;
  }
  // Every rank has rank 0's number of parameters and shapes, in the same order; else a ValueError
  // on every rank naming the first rank that differs and, where known, the parameter. Collective
  // (small host messages).
  void verify_shapes_across_ranks() {
    const int world = comm_->size();
    if (world == 1) return;
    const auto params = module_->parameters();
    std::vector<std::int64_t> dims;  // per parameter: its rank, then its torch shape
    for (auto* p : params) {
      const Shape s = p->torch_shape();
      dims.push_back(s.rank());
      dims.insert(dims.end(), s.begin(), s.end());
    }
    // 1. The counts, so that the shape lists have one length everywhere before they are compared.
    std::vector<std::int64_t> head{static_cast<std::int64_t>(params.size()),
                                   static_cast<std::int64_t>(dims.size())};
    std::vector<std::int64_t> mine = head;
    reducer_.broadcaster().broadcast_host(std::span<std::int64_t>(head), Exec<D>{});
    // per rank: 0 fine, 1 + parameter index,
    std::vector<std::int64_t> bad(static_cast<std::size_t>(world), 0);
    const int me = comm_->rank();  // or kCountMismatch
    if (mine != head) bad[static_cast<std::size_t>(me)] = kCountMismatch;
    reducer_.any_rank(std::span<std::int64_t>(bad));
    raise_shape_mismatch(bad, params, head[0]);
    // 2. The shapes.
    std::vector<std::int64_t> ref = dims;
    reducer_.broadcaster().broadcast_host(std::span<std::int64_t>(ref), Exec<D>{});
    std::size_t at = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::size_t n = static_cast<std::size_t>(dims[at]) + 1;
      if (!std::equal(dims.begin() + static_cast<std::ptrdiff_t>(at),
                      dims.begin() + static_cast<std::ptrdiff_t>(at + n),
                      ref.begin() + static_cast<std::ptrdiff_t>(at))) {
        bad[static_cast<std::size_t>(me)] = static_cast<std::int64_t>(i) + 1;
        break;
      }
      at += n;
    }
    reducer_.any_rank(std::span<std::int64_t>(bad));
    raise_shape_mismatch(bad, params, head[0]);
  }

  void raise_shape_mismatch(const std::vector<std::int64_t>& bad,
                            const std::vector<nn::Parameter<T, D>*>& params,
                            std::int64_t rank0_count) {
    for (std::size_t r = 0; r < bad.size(); ++r) {
      if (bad[r] == 0) continue;
      std::string what;
      if (bad[r] == kCountMismatch) {
        what = ddp::detail::str(
            "rank ", r, " has a different number of parameters or dimensions than rank 0 (rank 0: ",
            rank0_count, " parameters; this rank, ", comm_->rank(), ": ", params.size(), ")");
      } else {
        const auto* p = params[static_cast<std::size_t>(bad[r] - 1)];
        what = ddp::detail::str("rank ", r, " differs from rank 0 at parameter #", bad[r] - 1,
                                " (here on rank ", comm_->rank(), ": '", p->name(), "' ",
                                p->torch_shape().to_string(), ")");
      }
      throw ValueError(ddp::detail::str(
          "ddp: DistributedDataParallel needs the same model on every rank: ", what,
          ". Build the same architecture (same options) on every rank before wrapping it"));
    }
  }

  static constexpr std::int64_t kCountMismatch = std::numeric_limits<std::int64_t>::max();

  Reducer<T, D> reducer_;
  bool sync_ = true;  // false inside no_sync()
  bool grad_ = true;  // false inside no_grad()
  // the next forward broadcasts the buffers (the last one was synchronised)
  bool buffers_follow_ = true;
  bool join_mode_ = false;  // inside join_context(): every forward takes part in a join round
  bool joined_ = false;     // join() was called in this context: no more forwards
  std::int64_t step_ = 0;
};

}  // namespace ddp::parallel
