// Reducer: DistributedDataParallel's gradient bookkeeping (the bucket schedule), written once for
// every device; a transport per device moves the data (Transport<T, D>: parallel/transport.hpp for
// the CPU, parallel/cuda/transport.cuh for CUDA under nvcc; a recording fake in the unit tests).
// SPDX-License-Identifier: MIT
//
// How it works, per synchronised step (PyTorch's Reducer):
//   prepare_step(step, exec)  every parameter "not ready", every bucket's pending count = its
//     parameter count;
//                             a step that never finished (backward threw) first drains its
//                               collectives
//   mark_ready(p)             (the grad-ready hook, on the backward thread) counts p in its bucket;
//     when the
//                             bucket's last gradient arrives it is complete, and every complete
//                               bucket at the
//                             head of the launch order is handed to transport.launch(b) -- buckets
//                               launch
//                             strictly in index order, so that all ranks issue the same collectives
//                               in the
//                             same order, while backward carries on with earlier layers. Outside a
//                             synchronised step (no_sync) it only notes that p was used.
//   finish()                  after backward: a parameter that never reported is an Error naming
//     every such
//                             parameter (the transport is drained first, so no collective still
//                               writes into
//                             a bucket while the error unwinds). With find_unused_parameters (torch
//                               >= 2.0's
//                             reducer, docs/decisions/0025): the ranks agree which parameters were
//                               used
//                             on some rank since the last synchronised step (no_sync passes
//                               included) with
//                             one all-reduce (max) of a flag per parameter after the last bucket; a
//                               parameter
//                             that was not reported is launched with its accumulated gradient in
//                               its slot, or
//                             zeros when it has none (has_grad() false); a parameter no rank used
//                               keeps its
//                             grad() untouched -- no gradient after zero_grad(), so the optimizer
//                               skips it. Then transport.finish(b)
//                             for every bucket makes the averages visible in grad()
//                             static_graph (torch's): unused parameters are allowed as with
//                             find_unused_parameters, and the first synchronised step's answer is
//                               kept: later
//                             steps skip the flag all-reduce, and the parameters this rank did not
//                               use are
//                             counted ready when the step starts, so their buckets need not wait
//                               for finish().
//                             A later step that uses another set of parameters is an Error naming
//                               one.
//   shadow_step()             a joined rank's part in the others' step (uneven inputs,
//     docs/decisions/0030):
//                             the same collectives with zeros, no grad() written
// Example: 3 parameters p0 p1 p2 in buckets {p2} {p1, p0} (reverse order). Gradients arrive p1, p2,
//   p0:
// p1 completes nothing; p2 completes bucket 0 -> launch(0); p0 completes bucket 1 -> launch(1). Had
// p0 and p1 arrived before p2, bucket 1 would wait and launch right after bucket 0. After the first
// synchronised step the buckets are rebuilt in the order gradients actually arrived (unused
// parameters last): rank 0's order, broadcast by the transport, so every rank builds the same
// buckets. Tracing: the last step's bucket launch and completion times and the end of backward, to
// show the overlap (last_trace(); the metrics' comm_ms and comm_exposed_ms), and the same as events
// of an active trace recorder.
//
// The transport only packs, launches, unpacks and broadcasts; see BucketTransport below.
// Example: resnet18 (1000 classes, 62 parameters) with the default caps -> 3 buckets: {fc.bias,
//   fc.weight}
// (2.0 MiB >= 1 MiB) is all-reduced while layer4 still runs backward, the next 12 tensors (27.5
// MiB, within layer4) while layers 3..1 run, the last 48 (15.1 MiB) after conv1. Not thread-safe:
// one thread drives prepare_step, the hooks and finish.
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ddp/core/clock.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/core/trace.hpp"
#include "ddp/nn/parameter.hpp"
#include "ddp/parallel/bucket.hpp"
#include "ddp/parallel/ddp_options.hpp"
#include "ddp/parallel/step_trace.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::parallel {

// What the schedule asks of a transport. Every call comes from the thread that drives the schedule.
//   build(layouts)        (re)allocates one flat buffer per bucket; layouts[b].params index the
//     parameter list
//                         the transport was constructed with. Nothing of the old buckets is in
//                           flight.
//   begin_step(exec)      a synchronised step starts and backward runs on exec; raises errors of
//     earlier
//                         collectives that were never waited for (CUDA retires them here)
//   launch(b, zero)       bucket b is complete: pack its gradients (zeros where zero[i], i a
//     parameter index)
//                         and start its reduction (the comm hook; Avg by default) without waiting
//                           for it
//   finish(b, keep)       after backward, in bucket order: the averaged gradients of bucket b are
//     in grad()
//                         for whatever runs next (CPU: wait and unpack; CUDA: the compute stream
//                           waits),
//                         except where keep[i]: that parameter's grad() is left as it is
//   any_rank(flags)       every element of the host flags becomes its maximum over ranks; the host
//     waits
//   drain()               waits for every collective in flight and drops its errors; never throws
//   broadcast_order(o)    rank 0's values of o (host memory) on every rank; the host waits
template <class Tr, class D>
concept BucketTransport = requires(Tr& t, const std::vector<BucketLayout>& layouts, std::size_t b,
                                   const std::vector<bool>& mask, const Exec<D>& exec,
                                   std::span<std::int64_t> order) {
  t.build(layouts);
  t.begin_step(exec);
  t.launch(b, mask);
  t.finish(b, mask);
  t.any_rank(order);
  { t.drain() }
  noexcept;
  t.broadcast_order(order);
};

// The device's transport: the CPU's in parallel/transport.hpp, CUDA's in
// parallel/cuda/transport.cuh.
template <class T, Device D>
class Transport;

// Tr: the transport (the device's by default; the unit tests pass a recording fake).
template <class T, Device D, class Tr = Transport<T, D>>
class Reducer {
 public:
  // The transport is constructed as Tr(parameters, options, transport_args...) (DDP: the
  // communicator).
  template <class... TransportArgs>
  Reducer(std::vector<nn::Parameter<T, D>*> params, const DdpOptions& o,
          TransportArgs&&... transport_args)
      : params_(std::move(params)),
        o_(o),
        transport_(params_, o_, std::forward<TransportArgs>(transport_args)...) {
    static_assert(BucketTransport<Tr, D>, "ddp: the transport lacks a member Reducer calls");
    for (std::size_t i = 0; i < params_.size(); ++i) index_[params_[i]] = i;
    used_since_sync_.assign(params_.size(), false);
    last_used_.assign(params_.size(), 0);
    build(reverse_order(params_.size()));
  }
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;
  // The transport's destructor drains what is still in flight (backward threw half-way).
  ~Reducer() = default;

  // Groups the parameters into buckets in `order` (a permutation of the parameter indices).
  void build(const std::vector<std::size_t>& order) {
    std::vector<std::int64_t> numel(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) numel[i] = params_[i]->numel();
    layouts_ =
        assign_buckets(order, numel, sizeof(T), o_.bucket_cap_bytes, o_.first_bucket_cap_bytes);
    pending_.assign(layouts_.size(), 0);
    where_.assign(params_.size(), 0);
    for (std::size_t b = 0; b < layouts_.size(); ++b)
      for (std::size_t i : layouts_[b].params) where_[i] = b;
    transport_.build(layouts_);
  }

  const std::vector<BucketLayout>& layouts() const noexcept { return layouts_; }
  const StepTrace& last_trace() const noexcept { return trace_; }
  bool active() const noexcept { return active_; }
  std::int64_t synced_steps() const noexcept { return synced_steps_; }
  // DDP's collectives outside the buckets, through the same transport (so on the same streams):
  // parameter and buffer broadcasts, the element-wise max over ranks of host flags (join, shape
  // checks), the bucket hook.
  auto& broadcaster() noexcept { return transport_.broadcaster(); }
  void any_rank(std::span<std::int64_t> flags) { transport_.any_rank(flags); }
  template <class Hook>
  void set_comm_hook(Hook&& hook) {
    transport_.set_comm_hook(std::forward<Hook>(hook));
  }

  // Starts a synchronised step (called from forward); backward will run on exec. Safe to call again
  // without a finish in between: the unfinished step's collectives are drained (their errors
  // dropped).
  void prepare_step(std::int64_t step, const Exec<D>& exec = {}) {
    if (active_) transport_.drain();
    active_ = false;
    transport_.begin_step(exec);
    ready_.assign(params_.size(), false);
    zero_.assign(params_.size(), false);
    keep_.assign(params_.size(), false);
    for (std::size_t b = 0; b < layouts_.size(); ++b) pending_[b] = layouts_[b].params.size();
    next_launch_ = 0;
    arrival_.clear();
    trace_ = StepTrace{.step = step,
                       .backward_start = Clock::now(),
                       .last_gradient = {},
                       .backward_end = {},
                       .finished = {},
                       .buckets = {},
                       .completions_known = requires {transport_.completed_at(std::size_t{});
  }
};
step_ = step;
active_ = true;
static_marked_ = false;
if (static_known_) keep_ = static_keep_;
}  // namespace ddp::parallel

// The grad-ready hook: p's gradient is final for this backward.
void mark_ready(nn::Parameter<T, D>& p) {
  auto it = index_.find(&p);
  if (it == index_.end()) return;
  const std::size_t i = it->second;
  used_since_sync_[i] = true;
  if (!active_) return;  // no_sync pass, or a backward that DDP's forward did not start
  mark_static_unused();
  if (static_known_ && ready_[i] && static_unused_here_[i])
    throw Error(ddp::detail::str(
        "ddp: static_graph: parameter '", p.name(), "' received a gradient in step ", step_,
        " but not in the first synchronised step; with static_graph every step must use "
        "the same parameters. Turn static_graph off (use find_unused_parameters) for "
        "models whose graph changes"));
  if (ready_[i])
    throw Error(ddp::detail::str(
        "ddp: parameter '", p.name(), "' reported its gradient twice in step ", step_,
        "; DDP supports one backward per synchronised forward (use no_sync() for "
        "accumulation)"));
  ready_[i] = true;
  arrival_.push_back(i);
  trace_.last_gradient = Clock::now();
  if (--pending_[where_[i]] == 0) launch_ready();
}

// Ends the step: checks that every gradient arrived, launches what is left, finishes every bucket.
// No-op outside a synchronised step.
void finish() {
  if (!active_) return;
  active_ = false;
  trace_.backward_end = Clock::now();
  mark_static_unused();  // a backward that produced no gradient at all
  std::vector<std::size_t> missing;
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (!ready_[i]) missing.push_back(i);
  const bool unused_allowed = o_.find_unused_parameters || o_.static_graph;
  if (static_known_ && !missing.empty()) {
    transport_.drain();
    throw Error(ddp::detail::str(
        "ddp: static_graph: parameter '", params_[missing.front()]->name(),
        "' received no gradient in step ", step_,
        " but did in the first synchronised "
        "step; with static_graph every step must use the same parameters. Turn "
        "static_graph off (use find_unused_parameters) for models whose graph changes"));
  }
  if (!missing.empty() && !unused_allowed) {
    transport_.drain();
    std::vector<std::string> names;
    for (std::size_t i : missing) names.push_back(ddp::detail::quoted(params_[i]->name()));
    throw Error(ddp::detail::str(
        "ddp: parameter '", params_[missing.front()]->name(), "' received no gradient in step ",
        step_, " (", missing.size(),
        " parameter(s) without a gradient: ", ddp::detail::join(names, ", "),
        "); DistributedDataParallel all-reduces every parameter in every synchronised step, so "
        "each one must "
        "take part in the loss. Use it in forward, remove it from the model, or set "
        ".find_unused_parameters = true (--find-unused-parameters)"));
  }
  for (std::size_t i : missing) {  // find_unused_parameters or static_graph
    ready_[i] = true;
    zero_[i] = !params_[i]->has_grad();  // torch: the bucket takes .grad when defined, else zeros
    if (--pending_[where_[i]] == 0) launch_ready();
  }
  if (unused_allowed && !static_known_) {
    // Used on some rank since the last synchronised step? Reported parameters were used here; a
    // missing one may have been used in a no_sync pass (its gradient accumulated) or on another
    // rank. Every rank takes part, after its last bucket (collectives are issued in the same order
    // everywhere), as in torch.
    std::vector<std::int64_t> used(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) used[i] = used_since_sync_[i] ? 1 : 0;
    transport_.any_rank(std::span<std::int64_t>(used));
    for (std::size_t i = 0; i < params_.size(); ++i) keep_[i] = used[i] == 0;
    if (o_.static_graph) {  // the answer for every later step
      static_known_ = true;
      static_keep_ = keep_;
      static_missing_ = missing;
      static_unused_here_.assign(params_.size(), false);
      for (std::size_t i : missing) static_unused_here_[i] = true;
    }
    last_used_ = std::move(used);
  }
  for (std::size_t b = 0; b < layouts_.size(); ++b) {
    transport_.finish(b, keep_);
    for (std::size_t i : layouts_[b].params)
      if (!keep_[i]) params_[i]->set_grad_written();  // a zero-slot parameter now has the average
    if constexpr (requires { transport_.completed_at(b); })
      if (const auto t = transport_.completed_at(b); t && b < trace_.buckets.size())
        trace_.buckets[b].completed = *t;
  }
  trace_.finished = Clock::now();
  record_trace();
  end_step(missing);
}

// A rank that ran out of data (DistributedDataParallel::join, docs/decisions/0030) takes part in a
// synchronised step of the others: exactly the collectives a real step issues, in the same order --
// every bucket through the transport as zeros (the comm hook runs on them, so a hook's own
// collectives match too; Avg then divides the others' sum by the full world size), the
// find_unused_parameters flags, each bucket's finish, and the first step's bucket rebuild (this
// rank's order: the parameter order, torch's _push_all_rebuilt_params). Every grad() is left as it
// is. The flags it adds are the agreed ones of its last step, as torch's joined rank adds its
// reduced used map (_match_unused_params_allreduce): a parameter used then counts as used (zero
// gradient from here) in every step it shadows.
void shadow_step(const Exec<D>& exec = {}) {
  if (active_) transport_.drain();
  active_ = false;
  transport_.begin_step(exec);
  const std::vector<bool> all(params_.size(), true);  // zeros in every slot; keep every grad()
  for (std::size_t b = 0; b < layouts_.size(); ++b) transport_.launch(b, all);
  if ((o_.find_unused_parameters || o_.static_graph) && !static_known_) {
    transport_.any_rank(std::span<std::int64_t>(last_used_));
    // static_graph: the others keep their first step's answer and exchange no flags after it;
    // neither does this rank, which never trains again (nothing of the answer itself is needed
    // here).
    static_known_ = o_.static_graph;
  }
  for (std::size_t b = 0; b < layouts_.size(); ++b) transport_.finish(b, all);
  arrival_.clear();
  std::vector<std::size_t> order(params_.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  end_step(order);
}

private:
// static_graph after the first step, once per step at the first gradient of backward (torch marks
// unused parameters there too, so a zero_grad() between forward and backward still counts): the
// parameters this rank does not use are ready, with their gradient (accumulated under no_sync) or
// zeros.
void mark_static_unused() {
  if (!static_known_ || static_marked_) return;
  static_marked_ = true;
  for (std::size_t i : static_missing_) {
    ready_[i] = true;
    zero_[i] = !params_[i]->has_grad();
    if (--pending_[where_[i]] == 0) launch_ready();
  }
}

void launch_ready() {
  while (next_launch_ < layouts_.size() && pending_[next_launch_] == 0) {
    const std::size_t b = next_launch_++;
    transport_.launch(b, zero_);
    const Clock::time_point now = Clock::now();
    trace_.buckets.push_back(BucketTrace{.index = b,
                                         .numel = layouts_[b].numel,
                                         .num_params = layouts_[b].params.size(),
                                         .launched = now,
                                         .completed = now});
  }
}

// With a trace recorder active (core/trace.hpp): each bucket's all-reduce from launch to completion
// on the communication track, and finish()'s wait on the main track.
void record_trace() const {
  trace::Recorder* rec = trace::active();
  if (!rec) return;
  for (const BucketTrace& b : trace_.buckets)
    rec->add(trace::Event{
        .name = ddp::detail::str("all-reduce bucket ", b.index),
        .category = "allreduce",
        .start = b.launched,
        .end = b.completed,
        .track = trace::kCommTrack,
        .args = {trace::number_arg("bucket", static_cast<double>(b.index)),
                 trace::number_arg("ddp_step", static_cast<double>(trace_.step)),
                 trace::number_arg("parameters", static_cast<double>(b.num_params)),
                 trace::number_arg("bytes", static_cast<double>(b.numel) * sizeof(T))}});
  rec->add(trace::Event{.name = "wait for all-reduces",
                        .category = "ddp",
                        .start = trace_.backward_end,
                        .end = trace_.finished,
                        .track = trace::kMainTrack,
                        .args = {}});
}

// After the last bucket of a real or shadowed step: counts it, rebuilds the buckets after the first
// one.
void end_step(const std::vector<std::size_t>& missing) {
  used_since_sync_.assign(params_.size(), false);
  ++synced_steps_;
  if (synced_steps_ == 1 && o_.rebuild_buckets && !rebuilt_) rebuild_from_arrival(missing);
}

// Rank 0's arrival order (unused parameters last) decides the new buckets on every rank.
void rebuild_from_arrival(const std::vector<std::size_t>& missing) {
  rebuilt_ = true;
  std::vector<std::int64_t> order;  // int64: what the broadcast carries
  order.reserve(params_.size());
  for (std::size_t i : arrival_) order.push_back(static_cast<std::int64_t>(i));
  for (std::size_t i : missing) order.push_back(static_cast<std::int64_t>(i));
  transport_.broadcast_order(std::span<std::int64_t>(order));
  // assign_buckets checks it is a permutation
  build(std::vector<std::size_t>(order.begin(), order.end()));
}

std::vector<nn::Parameter<T, D>*> params_;
DdpOptions o_;
Tr transport_;
std::unordered_map<const nn::Parameter<T, D>*, std::size_t> index_;
std::vector<BucketLayout> layouts_;
std::vector<std::size_t> pending_;  // per bucket: gradients still to arrive this step
std::vector<std::size_t> where_;    // parameter -> bucket
std::vector<bool> ready_;           // per parameter, this step
// per parameter: launched with zeros (find_unused_parameters, no gradient)
std::vector<bool> zero_;
std::vector<bool> keep_;  // per parameter: no rank used it, grad() is left untouched
// per parameter: reported since the last synchronised step (no_sync too)
std::vector<bool> used_since_sync_;
// per parameter: used on some rank in the last step (find_unused)
std::vector<std::int64_t> last_used_;
std::vector<std::size_t> arrival_;  // parameter indices in the order their gradients arrived
std::size_t next_launch_ = 0;
bool active_ = false;
bool rebuilt_ = false;
// static_graph, after the first synchronised step: which parameters no rank used (keep_ of that
// step) and which ones this rank did not use (counted ready at prepare_step).
bool static_known_ = false;
bool static_marked_ = false;  // this step's static_missing_ are marked ready
std::vector<bool> static_keep_;
std::vector<std::size_t> static_missing_;
std::vector<bool> static_unused_here_;
std::int64_t step_ = 0;
std::int64_t synced_steps_ = 0;
StepTrace trace_;
}
;

}  // namespace ddp::parallel
