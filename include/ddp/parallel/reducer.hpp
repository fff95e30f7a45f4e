// Reducer: the gradient all-reduce engine behind DistributedDataParallel (buckets, readiness, overlap, copy-back).
// SPDX-License-Identifier: MIT
//
// How it works, per synchronised step (PyTorch's Reducer, CPU):
//   prepare_step()     every parameter "not ready", every bucket's pending count = its parameter count
//   mark_ready(p)      (the grad-ready hook, on the backward thread) copies p.grad() into p's slot of its
//                      bucket's flat buffer; when the bucket's last gradient arrives the bucket is ready, and
//                      every ready bucket at the head of the launch order is all-reduced asynchronously
//                      (Work) -- buckets launch strictly in index order so that all ranks issue the same
//                      collectives in the same order, while backward carries on with earlier layers
//   finish()           after backward: a parameter that never reported is an error naming it (or, with
//                      find_unused_parameters, contributes zeros); waits for every bucket and copies the
//                      averaged gradients back into the parameters' grad()
// Example: resnet18 (44 parameters cast into 2 buckets with a 25 MiB cap) -> bucket 0 (fc and layer4's
// last tensors, >= 1 MiB) is all-reduced while layers 3..1 still run backward; bucket 1 after conv1.
// After the first synchronised step the buckets are rebuilt in the order gradients actually arrived
// (rank 0's order, broadcast, so every rank builds the same buckets).
// Compression (optional): the bucket is converted to bf16 or fp16 before the all-reduce (half the bytes)
// and back to T afterwards; the reduction itself runs in float inside the backend.
// Tracing: the last step's bucket launch times and the end of backward, to show the overlap.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/core/dtype.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/nn/parameter.hpp"
#include "ddp/parallel/bucket.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::parallel {

enum class GradCompression : std::uint8_t { None, Bf16, Fp16 };

// "none" | "bf16" | "fp16" (--grad-compression); ValueError otherwise.
inline GradCompression parse_grad_compression(const std::string& s) {
  if (s == "none" || s.empty()) return GradCompression::None;
  if (s == "bf16") return GradCompression::Bf16;
  if (s == "fp16") return GradCompression::Fp16;
  throw ValueError(ddp::detail::str("ddp: unknown gradient compression ", ddp::detail::quoted(s),
                                    "; valid: none, bf16, fp16 (--grad-compression)"));
}

struct ReducerOptions {
  std::size_t bucket_cap_bytes = kDefaultBucketCapBytes;
  std::size_t first_bucket_cap_bytes = kDefaultFirstBucketCapBytes;
  GradCompression compression = GradCompression::None;
  bool find_unused_parameters = false;  // unused parameters contribute zeros instead of raising
  bool rebuild_buckets = true;          // rebuild in arrival order after the first synchronised step
};

using Clock = std::chrono::steady_clock;

struct BucketTrace {
  std::size_t index = 0;
  std::int64_t numel = 0;
  std::size_t num_params = 0;
  Clock::time_point launched;  // when its all-reduce was issued
};
// The last synchronised step as seen by the reducer.
struct StepTrace {
  std::int64_t step = -1;
  Clock::time_point backward_start;  // prepare_step()
  Clock::time_point last_gradient;   // the last grad-ready hook of this backward
  Clock::time_point backward_end;    // finish() entered
  std::vector<BucketTrace> buckets;  // in launch order
  // How many buckets were launched before backward ended (the overlap).
  std::size_t launched_before_backward_end() const {
    std::size_t n = 0;
    for (const auto& b : buckets) n += b.launched < backward_end ? 1 : 0;
    return n;
  }
  // How many buckets were launched while backward was still producing gradients (strict overlap: the
  // bucket holding the last gradient can only start after it, so at most buckets.size() - 1).
  std::size_t launched_during_backward() const {
    std::size_t n = 0;
    for (const auto& b : buckets) n += b.launched < last_gradient ? 1 : 0;
    return n;
  }
};

// The CPU reducer. Reducer<T, Cuda> is a specialisation in parallel/cuda/reducer.cuh (device buffers, a
// communication stream ordered by events); it is compiled only by nvcc.
template <class T, Device D>
class Reducer {
  static_assert(std::is_same_v<D, Cpu>,
                "ddp: DistributedDataParallel on CUDA needs #include <ddp/parallel/cuda/reducer.cuh> before "
                "<ddp/parallel/ddp.hpp> is used, in a .cu file compiled by nvcc and linked with ddp::cuda");

 public:
  Reducer(std::vector<nn::Parameter<T, D>*> params, comm::Communicator& comm, const ReducerOptions& o)
      : params_(std::move(params)), comm_(&comm), o_(o) {
    for (std::size_t i = 0; i < params_.size(); ++i) index_[params_[i]] = i;
    build(reverse_order(params_.size()));
  }
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;
  // An all-reduce still in flight (backward threw half-way) writes into our buffers: wait for it first.
  ~Reducer() { drain(); }

  // Groups the parameters into buckets in `order` and allocates the flat buffers.
  void build(const std::vector<std::size_t>& order) {
    std::vector<std::int64_t> numel(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) numel[i] = params_[i]->numel();
    layouts_ = assign_buckets(order, numel, sizeof(T), o_.bucket_cap_bytes, o_.first_bucket_cap_bytes);
    buckets_.assign(layouts_.size(), Bucket{});
    where_.assign(params_.size(), {0, 0});
    for (std::size_t b = 0; b < layouts_.size(); ++b) {
      buckets_[b].flat.assign(static_cast<std::size_t>(layouts_[b].numel), T(0));
      for (std::size_t k = 0; k < layouts_[b].params.size(); ++k) where_[layouts_[b].params[k]] = {b, k};
    }
  }

  const std::vector<BucketLayout>& layouts() const noexcept { return layouts_; }
  const StepTrace& last_trace() const noexcept { return trace_; }
  bool active() const noexcept { return active_; }

  // Starts a synchronised step (called from forward). Safe to call again without a finish in between.
  // The exec is where backward runs (the CUDA reducer orders its copies after it; unused on the CPU).
  void prepare_step(std::int64_t step, const Exec<D>& = {}) {
    drain();
    ready_.assign(params_.size(), false);
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      buckets_[b].pending = layouts_[b].params.size();
      buckets_[b].work = comm::Work();
      buckets_[b].launched = false;
    }
    next_launch_ = 0;
    arrival_.clear();
    trace_ = StepTrace{.step = step, .backward_start = Clock::now(), .last_gradient = {}, .backward_end = {}, .buckets = {}};
    step_ = step;
    active_ = true;
  }

  // The grad-ready hook: p's gradient is final for this backward.
  void mark_ready(nn::Parameter<T, D>& p) {
    if (!active_) return;  // no_sync pass, or a backward that DDP's forward did not start
    auto it = index_.find(&p);
    if (it == index_.end()) return;
    const std::size_t i = it->second;
    if (ready_[i])
      throw Error(ddp::detail::str("ddp: parameter '", p.name(), "' reported its gradient twice in step ", step_,
                                   "; DDP supports one backward per synchronised forward (use no_sync() for "
                                   "accumulation)"));
    ready_[i] = true;
    arrival_.push_back(i);
    trace_.last_gradient = Clock::now();
    const auto [b, k] = where_[i];
    std::memcpy(buckets_[b].flat.data() + layouts_[b].offsets[k], p.grad().data(), p.grad().bytes());
    if (--buckets_[b].pending == 0) launch_ready();
  }

  // Ends the step: checks that every gradient arrived, waits for all buckets, writes the averages back.
  void finish() {
    if (!active_) return;
    active_ = false;
    trace_.backward_end = Clock::now();
    std::vector<std::size_t> missing;
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!ready_[i]) missing.push_back(i);
    if (!missing.empty() && !o_.find_unused_parameters) {
      drain();
      std::vector<std::string> names;
      for (std::size_t i : missing) names.push_back(ddp::detail::quoted(params_[i]->name()));
      throw Error(ddp::detail::str(
          "ddp: parameter '", params_[missing.front()]->name(), "' received no gradient in step ", step_, " (",
          missing.size(), " parameter(s) without a gradient: ", ddp::detail::join(names, ", "),
          "); DistributedDataParallel all-reduces every parameter in every synchronised step, so each one must "
          "take part in the loss. Use it in forward, remove it from the model, or set "
          ".find_unused_parameters = true (--find-unused-parameters)"));
    }
    for (std::size_t i : missing) {  // find_unused_parameters: contribute zeros
      ready_[i] = true;
      const auto [b, k] = where_[i];
      std::fill_n(buckets_[b].flat.data() + layouts_[b].offsets[k], params_[i]->numel(), T(0));
      if (--buckets_[b].pending == 0) launch_ready();
    }
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      buckets_[b].work.wait();
      unpack(b);
    }
    ++synced_steps_;
    if (synced_steps_ == 1 && o_.rebuild_buckets && !rebuilt_) rebuild_from_arrival(missing);
  }

  std::int64_t synced_steps() const noexcept { return synced_steps_; }

 private:
  struct Bucket {
    std::vector<T> flat;                 // gradients back to back, bucket order
    std::vector<bfloat16> flat_bf16;     // compression buffers (allocated on first use)
    std::vector<half> flat_fp16;
    std::size_t pending = 0;
    bool launched = false;
    comm::Work work;
  };

  void launch_ready() {
    while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) launch(next_launch_++);
  }

  void launch(std::size_t b) {
    Bucket& bk = buckets_[b];
    const comm::AllreduceOptions ar{.op = comm::ReduceOp::Avg};
    if (o_.compression == GradCompression::Bf16) {
      bk.flat_bf16.resize(bk.flat.size());
      for (std::size_t i = 0; i < bk.flat.size(); ++i) bk.flat_bf16[i] = bfloat16(static_cast<float>(bk.flat[i]));
      bk.work = comm_->all_reduce(std::span<bfloat16>(bk.flat_bf16), ar);
    } else if (o_.compression == GradCompression::Fp16) {
      bk.flat_fp16.resize(bk.flat.size());
      for (std::size_t i = 0; i < bk.flat.size(); ++i) bk.flat_fp16[i] = half(static_cast<float>(bk.flat[i]));
      bk.work = comm_->all_reduce(std::span<half>(bk.flat_fp16), ar);
    } else {
      bk.work = comm_->all_reduce(std::span<T>(bk.flat), ar);
    }
    bk.launched = true;
    trace_.buckets.push_back(BucketTrace{.index = b, .numel = layouts_[b].numel,
                                         .num_params = layouts_[b].params.size(), .launched = Clock::now()});
  }

  void unpack(std::size_t b) {
    Bucket& bk = buckets_[b];
    if (o_.compression == GradCompression::Bf16)
      for (std::size_t i = 0; i < bk.flat.size(); ++i) bk.flat[i] = static_cast<T>(static_cast<float>(bk.flat_bf16[i]));
    else if (o_.compression == GradCompression::Fp16)
      for (std::size_t i = 0; i < bk.flat.size(); ++i) bk.flat[i] = static_cast<T>(static_cast<float>(bk.flat_fp16[i]));
    const BucketLayout& l = layouts_[b];
    for (std::size_t k = 0; k < l.params.size(); ++k) {
      auto& g = params_[l.params[k]]->grad();
      std::memcpy(g.data(), bk.flat.data() + l.offsets[k], g.bytes());
    }
  }

  // Waits for launched buckets, ignoring their errors (used before raising another error or resetting).
  void drain() noexcept {
    for (auto& bk : buckets_) {
      try {
        bk.work.wait();
      } catch (...) {
      }
      bk.work = comm::Work();
    }
    active_ = false;
  }

  // Rank 0's arrival order (unused parameters last) decides the new buckets on every rank.
  void rebuild_from_arrival(const std::vector<std::size_t>& missing) {
    rebuilt_ = true;
    std::vector<std::int64_t> order;
    for (std::size_t i : arrival_) order.push_back(static_cast<std::int64_t>(i));
    for (std::size_t i : missing)
      if (std::find(arrival_.begin(), arrival_.end(), i) == arrival_.end()) order.push_back(static_cast<std::int64_t>(i));
    if (order.size() != params_.size()) return;  // cannot happen; keep the current buckets
    if (comm_->size() > 1) comm_->broadcast(std::span<std::int64_t>(order), {.root = 0}).wait();
    std::vector<std::size_t> o(order.begin(), order.end());
    build(o);
  }

  std::vector<nn::Parameter<T, D>*> params_;
  comm::Communicator* comm_;
  ReducerOptions o_;
  std::unordered_map<const nn::Parameter<T, D>*, std::size_t> index_;
  std::vector<BucketLayout> layouts_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<std::size_t, std::size_t>> where_;  // parameter -> (bucket, position)
  std::vector<bool> ready_;
  std::vector<std::size_t> arrival_;
  std::size_t next_launch_ = 0;
  bool active_ = false;
  bool rebuilt_ = false;
  std::int64_t step_ = 0;
  std::int64_t synced_steps_ = 0;
  StepTrace trace_;
};

}  // namespace ddp::parallel
