// ZeroRedundancyOptimizer: ZeRO stage 1 (torch.distributed.optim.ZeroRedundancyOptimizer): every
// rank keeps the optimizer state of its own partition of the parameters only, steps that partition,
// and the updated values reach every rank by broadcasts from their owners (docs/decisions/0031).
// SPDX-License-Identifier: MIT
//
//   parallel::DistributedDataParallel<float, D> model(net, comm);                      //
//     all-reduces gradients
//   parallel::ZeroRedundancyOptimizer<optim::AdamW<float, D>> opt(optim::weight_decay_groups(net,
//     0.05),
//                                                                 {.lr = 1e-3}, comm);
//   model.forward(...); model.backward(...);  opt.step(exec);  opt.zero_grad();         // as with
//     a plain AdamW
//   schedule.apply(opt);                                            // lr(), set_lr(), groups(),
//     set_group_lr()
//   if (auto full = opt.consolidate(exec)) save_snapshot(path, net, *full, info);      //
//     collective; rank 0 saves
//   auto full = opt.make_full(); load_snapshot(path, net, *full); opt.load_consolidated(*full);
//     // resume
//
// Partition (torch 1.13's rule, so that a rank holds the same parameters as it would under torch):
// group by group, the group's parameters sorted by numel, largest first (stable: equal sizes keep
// their order), each to the rank with the fewest elements so far (the lowest such rank on a tie);
// the counts carry over from group to group. Example, numels {100, 10, 60, 50} on 2 ranks: 100 ->
// r0, 60 -> r1, 50 -> r1, 10 -> r0 (r0 110, r1 110). More ranks than parameters leaves some ranks
// with an empty shard: they step nothing and only receive. partition()[i] is the owner of
// parameters()[i]. Inner (optim::SGD or optim::AdamW, any optim::Optimizer) is built over the own
// parameters only, in the same groups (a group with none of them stays, empty, so group indices
// agree), so its state exists only for them. A second Inner over every parameter, never stepped,
// holds the learning rates, group lrs and the step count (what LR schedules read and set) and
// validates the options once on every rank. Parameter sync: after the shard's step, one broadcast
// per parameter from its owner, in parameters() order (torch's parameters_as_bucket_view=False).
// Why broadcasts and not an all-gather of flat shards: a broadcast works in place on each
// parameter's own memory, so there is no packing, no padding of unequal shards to one size, and the
// same code serves every device the communicator reaches; the cost is one collective per parameter
// (resnet50: 161 per step). Gradients: DDP all-reduces every gradient (as with torch's ZeRO under
// DDP); reducing each gradient only to its owner (ZeRO-2, reduce-scatter) is not done, nor is
// sharding the parameters (ZeRO-3). A parameter without a gradient is skipped by its owner's Inner
// as by a plain one; its (unchanged) value is still broadcast. Snapshots (train/checkpoint.hpp
// works on a whole Inner, unchanged): consolidate(exec, to) sends each rank's state to rank `to`,
// which gets a full Inner over every parameter (torch's consolidate_state_dict + state_dict);
// load_consolidated(full) keeps the own shard's state of a full Inner every rank loaded (torch's
// load_state_dict). Devices: CPU, and CUDA where the communicator reaches device memory (nccl, or
// tcp/mpi staged, docs/decisions/0023); the broadcasts and transfers are then enqueued on exec's
// stream. The CUDA path compiles but has not been run. World 1: no communication at all. Not
// thread-safe; collective calls must be made on every rank in order.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/parameter.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/optim/param_groups.hpp"
#include "ddp/parallel/rank_sum.hpp"
#include "ddp/tensor/copy.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::parallel {

// Bytes of every state tensor opt holds now (SGD's momentum buffers, AdamW's moments); step
// counters are not counted.
template <optim::Optimizer O>
std::size_t optimizer_state_bytes(O& opt) {
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < opt.parameters().size(); ++i)
    for (const optim::StateTensor& st : O::state_tensors)
      if (const auto* t = opt.state(st.name, i)) bytes += t->bytes();
  return bytes;
}

// torch 1.13's greedy partition (see the file comment): owner rank of each parameter of `params`,
// where params[i] is in group group_of[i] (groups numbered 0.. in order, each group's parameters in
// order).
template <class T, Device D>
std::vector<int> zero_partition(const std::vector<nn::Parameter<T, D>*>& params,
                                const std::vector<std::size_t>& group_of, int world) {
  if (world < 1)
    throw ValueError(
        ddp::detail::str("ddp: ZeroRedundancyOptimizer: world size ", world, " must be >= 1"));
  std::vector<int> owner(params.size(), 0);
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(world), 0);
  const std::size_t groups =
      group_of.empty() ? 0 : *std::max_element(group_of.begin(), group_of.end()) + 1;
  for (std::size_t g = 0; g < groups; ++g) {
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < params.size(); ++i)
      if (group_of[i] == g) order.push_back(i);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return params[a]->numel() > params[b]->numel();
    });
    for (std::size_t i : order) {
      const auto r =
          static_cast<std::size_t>(std::min_element(sizes.begin(), sizes.end()) - sizes.begin());
      owner[i] = static_cast<int>(r);
      sizes[r] += params[i]->numel();
    }
  }
  return owner;
}

template <optim::Optimizer Inner>
class ZeroRedundancyOptimizer {
 public:
  using value_type = typename Inner::value_type;
  using device_type = typename Inner::device_type;
  using T = value_type;
  using D = device_type;
  using Options = std::remove_cvref_t<decltype(std::declval<const Inner&>().options())>;
  using Group = optim::ParamGroup<T, D>;

  // Every rank constructs it with the same parameters, groups and options (not collective: the
  // partition is computed locally from the shapes, which DDP has checked to agree). `comm` must
  // outlive this object.
  ZeroRedundancyOptimizer(std::vector<Group> groups, const Options& o, comm::Communicator& comm)
      : comm_(&comm), groups_(groups), full_(std::move(groups), o) {
    const auto& params = full_.parameters();
    std::vector<std::size_t> group_of(params.size());
    for (std::size_t i = 0; i < params.size(); ++i) group_of[i] = full_.group_of(i);
    owner_ = zero_partition(params, group_of, comm.size());
    std::vector<Group> mine;
    for (const Group& g : groups_)
      mine.push_back(Group{.weight_decay = g.weight_decay, .lr = g.lr, .name = g.name});
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (owner_[i] != comm.rank()) continue;
      shard_index_.push_back(i);
      mine[group_of[i]].params.push_back(params[i]);
    }
    if (!shard_index_.empty()) shard_ = std::make_unique<Inner>(std::move(mine), o);
  }
  ZeroRedundancyOptimizer(std::vector<nn::Parameter<T, D>*> params, const Options& o,
                          comm::Communicator& comm)
      : ZeroRedundancyOptimizer(std::vector<Group>{Group{.params = std::move(params)}}, o, comm) {}
  ZeroRedundancyOptimizer(nn::Module<T, D>& model, const Options& o, comm::Communicator& comm)
      : ZeroRedundancyOptimizer(model.parameters(), o, comm) {}
  ZeroRedundancyOptimizer(const ZeroRedundancyOptimizer&) = delete;
  ZeroRedundancyOptimizer& operator=(const ZeroRedundancyOptimizer&) = delete;
  ~ZeroRedundancyOptimizer() { retire(/*rethrow=*/false); }

  // Collective: steps the own shard (gradients must already be the all-reduced ones), then
  // broadcasts every parameter from its owner. On the CPU the values are in place when it returns;
  // on CUDA the broadcasts are enqueued on exec's stream (kernels enqueued after them see the new
  // values) and their Works are waited for at the next collective call of this object.
  void step(Exec<D>& exec) {
    retire(/*rethrow=*/true);
    if (shard_) shard_->step(exec);
    full_.set_steps(full_.steps() + 1);
    if (comm_->size() == 1) return;
    const auto& params = full_.parameters();
    for (std::size_t i = 0; i < params.size(); ++i)
      pending_.push_back(comm_->broadcast(params[i]->value().view(),
                                          {.root = owner_[i], .stream = stream_of(exec)}));
    if constexpr (D::host_memory)
      retire(/*rethrow=*/true);  // no stream orders them: in place on return
  }
  // Clears every parameter's gradient (all of them, not only the shard's: DDP accumulates into
  // all).
  void zero_grad() { full_.zero_grad(); }

  // Learning rates and the step count (what optim::LrSchedule::apply and snapshots use), forwarded
  // to the shard.
  double lr() const noexcept { return full_.lr(); }
  void set_lr(double lr) {
    full_.set_lr(lr);
    if (shard_) shard_->set_lr(lr);
  }
  // params lists empty, as Inner's
  const std::vector<Group>& groups() const noexcept { return full_.groups(); }
  std::size_t group_of(std::size_t i) const { return full_.group_of(i); }
  double group_lr(std::size_t g) const { return full_.group_lr(g); }
  void set_group_lr(std::size_t g, double lr) {
    full_.set_group_lr(g, lr);
    if (shard_) shard_->set_group_lr(g, lr);
  }
  std::int64_t steps() const noexcept { return full_.steps(); }
  void set_steps(std::int64_t n) {
    full_.set_steps(n);
    if (shard_) shard_->set_steps(n);
  }
  const Options& options() const noexcept { return full_.options(); }

  // Every parameter (all ranks'), group after group: the indices partition() and snapshots use.
  const std::vector<nn::Parameter<T, D>*>& parameters() const noexcept {
    return full_.parameters();
  }
  // partition()[i]: the rank that owns parameters()[i] (keeps its state, steps it, broadcasts it).
  const std::vector<int>& partition() const noexcept { return owner_; }
  int owner(std::size_t i) const { return owner_.at(i); }
  // Indices (into parameters()) of this rank's shard, ascending; shard parameter j of inner() is
  // parameters()[shard_indices()[j]].
  const std::vector<std::size_t>& shard_indices() const noexcept { return shard_index_; }
  // The optimizer over this rank's shard, or nullptr when the shard is empty (more ranks than
  // parameters).
  Inner* inner() noexcept { return shard_.get(); }
  const Inner* inner() const noexcept { return shard_.get(); }
  // Bytes of the optimizer state held on this rank (the shard's state tensors;
  // optimizer_state_bytes).
  std::size_t state_bytes() const { return shard_ ? optimizer_state_bytes(*shard_) : 0; }
  comm::Communicator& communicator() noexcept { return *comm_; }

  // A fresh Inner over every parameter in the same groups with the same options, learning rates and
  // step count, without state: what load_snapshot fills before load_consolidated, and what
  // consolidate returns.
  std::unique_ptr<Inner> make_full() const {
    auto full = std::make_unique<Inner>(groups_, full_.options());
    full->set_lr(full_.lr());
    for (std::size_t g = 0; g < full_.groups().size(); ++g)
      if (optim::has_own_group_lr(full_, g)) full->set_group_lr(g, full_.group_lr(g));
    full->set_steps(full_.steps());
    return full;
  }

  // Collective (torch's consolidate_state_dict(to) + state_dict()): rank `to` returns a full Inner
  // holding every rank's state (copies: the shards keep theirs), the other ranks nullptr. One
  // all-reduce of one int64 per parameter (who has state, and AdamW's step counts), then one send
  // per state tensor from its owner to `to`, in parameters() order.
  std::unique_ptr<Inner> consolidate(Exec<D>& exec, int to = 0) {
    retire(/*rethrow=*/true);
    const int world = comm_->size(), me = comm_->rank();
    if (to < 0 || to >= world)
      throw ValueError(ddp::detail::str("ddp: ZeroRedundancyOptimizer::consolidate: rank ", to,
                                        " is out of range for world size ", world));
    const auto& params = full_.parameters();
    // have[i]: 0 = no state yet, else the parameter's step count (HasParamSteps) or 1.
    std::vector<std::int64_t> have(params.size(), 0);
    for (std::size_t j = 0; j < shard_index_.size(); ++j) have[shard_index_[j]] = state_mark(j);
    sum_over_ranks(have, exec);
    std::unique_ptr<Inner> full = me == to ? make_full() : nullptr;
    std::size_t j = 0;  // position of the next own parameter in the shard
    for (std::size_t i = 0; i < params.size(); ++i) {
      const bool mine = owner_[i] == me;
      const std::size_t k = mine ? j++ : 0;
      if (have[i] == 0 || (!mine && me != to)) continue;
      if constexpr (optim::HasParamSteps<Inner>)
        if (full) full->set_param_step(i, have[i]);
      for (const optim::StateTensor& st : Inner::state_tensors) {
        if (mine && me == to)
          full->set_state(st.name, i) = to_device(*shard_->state(st.name, k), exec);
        else if (mine)
          comm_->send(shard_->state(st.name, k)->cview(), to, {.stream = stream_of(exec)});
        else
          comm_->recv(full->set_state(st.name, i).view(), owner_[i], {.stream = stream_of(exec)});
      }
    }
    return full;
  }

  // Not collective (torch's load_state_dict): keeps the state of this rank's shard from `full`, an
  // Inner over the same parameters in the same order (make_full(), then load_snapshot into it, on
  // every rank), and takes its learning rates and step count. The shard's tensors are moved out of
  // `full`, whose state is cleared.
  void load_consolidated(Inner& full) {
    const auto& params = full_.parameters();
    bool same =
        full.parameters().size() == params.size() && full.groups().size() == full_.groups().size();
    for (std::size_t i = 0; same && i < params.size(); ++i)
      same = full.parameters()[i] == params[i];
    if (!same)
      throw ValueError(
          ddp::detail::str("ddp: ZeroRedundancyOptimizer::load_consolidated: the optimizer holds ",
                           full.parameters().size(), " parameters in ", full.groups().size(),
                           " groups, this one ", params.size(), " in ", full_.groups().size(),
                           " (or in another order); build it with make_full()"));
    set_lr(full.lr());
    for (std::size_t g = 0; g < full.groups().size(); ++g)
      if (optim::has_own_group_lr(full, g)) set_group_lr(g, full.group_lr(g));
    set_steps(full.steps());
    if (shard_) {
      shard_->clear_state();
      for (std::size_t j = 0; j < shard_index_.size(); ++j) {
        const std::size_t i = shard_index_[j];
        if constexpr (optim::HasParamSteps<Inner>) shard_->set_param_step(j, full.param_step(i));
        for (const optim::StateTensor& st : Inner::state_tensors)
          if (auto* t = full.state(st.name, i)) shard_->set_state(st.name, j) = std::move(*t);
      }
    }
    full.clear_state();
  }

 private:
  // Shard parameter j: 0 without state, else its step count (HasParamSteps) or 1.
  std::int64_t state_mark(std::size_t j) const {
    if constexpr (optim::HasParamSteps<Inner>) return shard_->param_step(j);
    return shard_->state(Inner::state_tensors[0].name, j) ? 1 : 0;
  }
  static Tensor<T, D> to_device(const Tensor<T, D>& t, Exec<D>& exec) {
    return to<D>(t.cview(), exec);
  }
  // Element-wise sum over ranks of host values (parallel/rank_sum.hpp).
  void sum_over_ranks(std::vector<std::int64_t>& v, Exec<D>& exec) {
    if (comm_->size() == 1) return;
    parallel::sum_over_ranks(*comm_, std::span<std::int64_t>(v), exec);
  }
  // Waits for the broadcasts of the last step still in flight; rethrow false (destructor) drops
  // failures.
  void retire(bool rethrow) {
    std::vector<comm::Work> works = std::exchange(pending_, {});
    for (const comm::Work& w : works) {
      if (rethrow) {
        w.wait();
        continue;
      }
      try {
        w.wait();
      } catch (...) {  // dropped: destruction must not throw, and the communicator reports it again
      }
    }
  }

  comm::Communicator* comm_;
  std::vector<Group> groups_;  // as given (with their params), for make_full()
  // every parameter, never stepped: lrs, step count, groups, validation
  Inner full_;
  std::vector<int> owner_;                // owner_[i]: rank that owns full_.parameters()[i]
  std::vector<std::size_t> shard_index_;  // this rank's parameters, ascending
  std::unique_ptr<Inner> shard_;     // Inner over this rank's parameters; null when it has none
  std::vector<comm::Work> pending_;  // broadcasts of the last step not yet waited for (CUDA)
};

}  // namespace ddp::parallel
