// ZeroRedundancyOptimizer (ZeRO-1) with ranks as threads (HashStore + tcp communicator), world 1, 2 and 4:
// the parameters equal a plain SGD / AdamW stepped on the same (already all-reduced) gradients bit for bit,
// state lives only on each parameter's owner, LR changes reach the shards, consolidate + snapshot + load
// round-trips, and more ranks than parameters works (empty shards).
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ddp/nn/linear.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/adamw.hpp>
#include <ddp/optim/param_groups.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/parallel/zero.hpp>
#include <ddp/train/checkpoint.hpp>

#include "parallel_test_util.hpp"

using namespace ddp;
using test::check_all_ok;
using test::max_rel_diff;
using test::Params;
using test::snapshot_params;
using parallel::ZeroRedundancyOptimizer;

namespace {

// A deterministic value per (salt, parameter, element) in about [-1, 1].
float pattern(std::uint64_t salt, std::size_t param, std::int64_t k) {
  const std::uint64_t h = (salt * 1000003u + param * 7919u + static_cast<std::uint64_t>(k) * 104729u) % 2001u;
  return static_cast<float>(static_cast<double>(h) / 1000.0 - 1.0);
}

template <class M>
void fill_values(M& model, std::uint64_t salt) {
  const auto params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i)
    for (std::int64_t k = 0; k < params[i]->numel(); ++k) params[i]->value().data()[k] = pattern(salt, i, k);
}

// The gradients every rank has after DDP's all-reduce: the same on every rank. Parameter `skip` gets none
// (has_grad() false: both optimizers must skip it).
template <class M>
void set_grads(M& model, std::uint64_t step, std::size_t skip) {
  model.zero_grad();
  const auto params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (i == skip) continue;
    for (std::int64_t k = 0; k < params[i]->numel(); ++k)
      params[i]->grad().data()[k] = 0.1f * pattern(100 + step, i, k);
    params[i]->set_grad_written();
  }
}

template <class M>
bool same_values(M& a, M& b) {
  const auto pa = a.parameters(), pb = b.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i)
    if (std::memcmp(pa[i]->value().data(), pb[i]->value().data(), pa[i]->value().bytes()) != 0) return false;
  return true;
}

// Whether full (over every parameter) holds exactly ref's state: the same tensors bit for bit, step counts.
template <class O>
bool same_state(O& full, O& ref) {
  if (full.parameters().size() != ref.parameters().size() || full.steps() != ref.steps() || full.lr() != ref.lr())
    return false;
  for (std::size_t i = 0; i < ref.parameters().size(); ++i) {
    for (const optim::StateTensor& st : O::state_tensors) {
      auto* a = full.state(st.name, i);
      auto* b = ref.state(st.name, i);
      if ((a == nullptr) != (b == nullptr)) return false;
      if (a && std::memcmp(a->data(), b->data(), b->bytes()) != 0) return false;
    }
    if constexpr (optim::HasParamSteps<O>)
      if (full.param_step(i) != ref.param_step(i)) return false;
  }
  return true;
}

std::unique_ptr<nn::ResNet<float, Cpu>> small_resnet() {
  return std::make_unique<nn::ResNet<float, Cpu>>(
      nn::ResNetOptions{.arch = "resnet18", .num_classes = 5, .seed = 3, .width = 4});
}

// Two groups: "decay" at its own lr, "no_decay" following lr().
template <class M>
std::vector<optim::ParamGroup<float, Cpu>> groups_of(M& model) {
  auto groups = optim::weight_decay_groups(model.parameters(), 0.01);
  groups[0].lr = 0.02;
  return groups;
}

// ZeRO over Opt vs a plain Opt on every rank, `steps` steps with an LR change half-way, then consolidation
// to rank `to`, a snapshot round-trip into a fresh model + ZeRO, and more steps after it.
template <template <class, Device> class Opt, class Options>
void check_equivalence(int world, const Options& o, int to) {
  using Inner = Opt<float, Cpu>;
  constexpr int kSteps = 4;
  // Written by rank `to` before a barrier, read by every rank after it. The barrier orders them, but through the
  // tcp backend's sockets and shared memory, which TSan cannot see: the mutex makes the order visible to it.
  std::vector<std::uint8_t> snapshot;
  std::mutex snapshot_mu;
  check_all_ok(test::run_ranks(world, [&](comm::TcpCommunicator& c) {
    Exec<Cpu> exec;
    auto zm = small_resnet();
    auto rm = small_resnet();
    fill_values(*zm, 1);
    fill_values(*rm, 1);
    ZeroRedundancyOptimizer<Inner> zero(groups_of(*zm), o, c);
    Inner ref(groups_of(*rm), o);
    const auto n = zm->parameters().size();
    auto run = [&](ZeroRedundancyOptimizer<Inner>& z, nn::ResNet<float, Cpu>& m, int from, int until) {
      for (int s = from; s < until; ++s) {
        if (s == 2) {  // what an LR schedule does: both the optimizer's and a group's own lr
          z.set_lr(z.lr() * 0.5);
          ref.set_lr(ref.lr() * 0.5);
          z.set_group_lr(0, 0.01);
          ref.set_group_lr(0, 0.01);
        }
        set_grads(m, static_cast<std::uint64_t>(s), /*skip=*/s == 1 ? 3 : n);
        set_grads(*rm, static_cast<std::uint64_t>(s), s == 1 ? 3 : n);
        z.step(exec);
        ref.step(exec);
        REQUIRE(same_values(m, *rm));
      }
    };
    run(zero, *zm, 0, kSteps);
    CHECK(zero.steps() == kSteps);
    CHECK(zero.group_lr(0) == 0.01);
    // State only on the owners: the shard holds exactly the own parameters, each with the plain optimizer's
    // state; the ranks' bytes add up to the plain optimizer's.
    const auto& params = zero.parameters();
    REQUIRE(zero.inner() != nullptr);  // 62 parameters: every rank owns some
    CHECK(zero.inner()->parameters().size() == zero.shard_indices().size());
    std::size_t own_bytes = 0;
    for (std::size_t j = 0; j < zero.shard_indices().size(); ++j) {
      const std::size_t i = zero.shard_indices()[j];
      CHECK(zero.owner(i) == c.rank());
      CHECK(zero.inner()->parameters()[j] == params[i]);
      for (const optim::StateTensor& st : Inner::state_tensors) {
        auto* mine = zero.inner()->state(st.name, j);
        auto* theirs = ref.state(st.name, i);
        REQUIRE((mine == nullptr) == (theirs == nullptr));
        if (mine) {
          CHECK(std::memcmp(mine->data(), theirs->data(), theirs->bytes()) == 0);
          own_bytes += mine->bytes();
        }
      }
    }
    CHECK(zero.state_bytes() == own_bytes);
    std::vector<std::int64_t> total{static_cast<std::int64_t>(zero.state_bytes())};
    if (world > 1) c.all_reduce(std::span<std::int64_t>(total)).wait();
    CHECK(total[0] == static_cast<std::int64_t>(parallel::optimizer_state_bytes(ref)));
    if (world > 1) CHECK(zero.state_bytes() < parallel::optimizer_state_bytes(ref));

    // Consolidation: rank `to` gets the plain optimizer's whole state; the shards keep theirs.
    auto full = zero.consolidate(exec, to);
    CHECK((full != nullptr) == (c.rank() == to));
    if (full) {
      CHECK(same_state(*full, ref));
      CHECK(full->group_lr(0) == ref.group_lr(0));
      auto bytes = train::serialize_snapshot(*zm, *full, {.epoch = 1});
      std::lock_guard lock(snapshot_mu);
      snapshot = std::move(bytes);
    }
    CHECK(zero.state_bytes() == own_bytes);
    c.barrier().wait();

    // Resume into a fresh model and ZeRO (values zeroed, lrs at their initial ones) from the snapshot.
    auto zm2 = small_resnet();
    fill_values(*zm2, 99);
    ZeroRedundancyOptimizer<Inner> zero2(groups_of(*zm2), o, c);
    auto loaded = zero2.make_full();
    {
      std::lock_guard lock(snapshot_mu);
      train::load_snapshot_bytes<float>(snapshot, *zm2, *loaded);
    }
    zero2.load_consolidated(*loaded);
    CHECK(parallel::optimizer_state_bytes(*loaded) == 0);  // moved into the shard, then cleared
    CHECK(zero2.steps() == kSteps);
    CHECK(zero2.lr() == ref.lr());
    CHECK(zero2.group_lr(0) == 0.01);
    CHECK(zero2.state_bytes() == own_bytes);
    REQUIRE(same_values(*zm2, *rm));
    run(zero2, *zm2, kSteps, kSteps + 2);
    CHECK(zero2.steps() == kSteps + 2);
    c.barrier().wait();  // `snapshot` stays alive until every rank has read it
  }));
}

}  // namespace

TEST_CASE("zero_partition follows torch's greedy rule: per group, largest first, to the least loaded rank") {
  nn::Parameter<float, Cpu> a("a", Shape{100}), b("b", Shape{10}), c("c", Shape{60}), d("d", Shape{50}),
      e("e", Shape{5});
  std::vector<nn::Parameter<float, Cpu>*> ps{&a, &b, &c, &d, &e};
  // One group: 100 -> r0, 60 -> r1, 50 -> r1, 10 -> r0, 5 -> r0 (r0 110 vs r1 110: the lower rank).
  CHECK(parallel::zero_partition(ps, {0, 0, 0, 0, 0}, 2) == std::vector<int>{0, 0, 1, 1, 0});
  // Two groups {a, b} and {c, d, e}: the counts carry over (r0 100, r1 10 after the first group), so
  // 60 -> r1 (70), 50 -> r1 (120), 5 -> r0 (105).
  CHECK(parallel::zero_partition(ps, {0, 0, 1, 1, 1}, 2) == std::vector<int>{0, 1, 1, 1, 0});
  // More ranks than parameters: ranks 2..5 get nothing of {a, b}; world 1 owns everything.
  CHECK(parallel::zero_partition(std::vector<nn::Parameter<float, Cpu>*>{&a, &b}, {0, 0}, 6) == std::vector<int>{0, 1});
  CHECK(parallel::zero_partition(ps, {0, 0, 0, 0, 0}, 1) == std::vector<int>(5, 0));
}

TEST_CASE("ZeRO over SGD (momentum, weight decay, groups) equals plain SGD; state on owners; snapshot round-trip") {
  const optim::SgdOptions o{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3};
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    check_equivalence<optim::SGD>(world, o, /*to=*/0);
  }
  check_equivalence<optim::SGD>(2, o, /*to=*/1);
}

TEST_CASE("ZeRO over AdamW (groups) equals plain AdamW; state and step counts on owners; snapshot round-trip") {
  const optim::AdamwOptions o{.lr = 1e-2, .weight_decay = 0.05};
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    check_equivalence<optim::AdamW>(world, o, /*to=*/0);
  }
}

TEST_CASE("ZeRO with more ranks than parameters: empty shards step nothing, receive, and consolidate") {
  // Linear(3 -> 2): weight (6) and bias (2) on 4 ranks: rank 0 owns the weight, rank 1 the bias.
  check_all_ok(test::run_ranks(4, [](comm::TcpCommunicator& c) {
    Exec<Cpu> exec;
    nn::Linear<float, Cpu> zm(nn::LinearOptions{.in_features = 3, .out_features = 2});
    nn::Linear<float, Cpu> rm(nn::LinearOptions{.in_features = 3, .out_features = 2});
    fill_values(zm, 5);
    fill_values(rm, 5);
    const optim::AdamwOptions o{.lr = 0.05};
    ZeroRedundancyOptimizer<optim::AdamW<float, Cpu>> zero(zm, o, c);
    optim::AdamW<float, Cpu> ref(rm, o);
    CHECK(zero.partition() == std::vector<int>{0, 1});
    CHECK((zero.inner() == nullptr) == (c.rank() >= 2));
    for (std::uint64_t s = 0; s < 3; ++s) {
      set_grads(zm, s, 9);
      set_grads(rm, s, 9);
      zero.step(exec);
      ref.step(exec);
      REQUIRE(same_values(zm, rm));
    }
    CHECK(zero.state_bytes() == (c.rank() == 0 ? 2 * 6 * sizeof(float) : c.rank() == 1 ? 2 * 2 * sizeof(float) : 0));
    auto full = zero.consolidate(exec, 3);  // to a rank that owns nothing
    CHECK((full != nullptr) == (c.rank() == 3));
    if (full) CHECK(same_state(*full, ref));
    // Resume from a full state every rank holds: the empty shards keep nothing.
    auto loaded = zero.make_full();
    std::vector<std::uint8_t> bytes = train::serialize_snapshot(rm, ref, {});
    train::load_snapshot_bytes<float>(bytes, zm, *loaded);
    zero.load_consolidated(*loaded);
    CHECK(zero.state_bytes() == (c.rank() == 0 ? 2 * 6 * sizeof(float) : c.rank() == 1 ? 2 * 2 * sizeof(float) : 0));
  }));
}

TEST_CASE("ZeRO rejects a consolidation target out of range and a full optimizer over other parameters") {
  check_all_ok(test::run_ranks(1, [](comm::TcpCommunicator& c) {
    Exec<Cpu> exec;
    nn::Linear<float, Cpu> m(nn::LinearOptions{.in_features = 3, .out_features = 2});
    nn::Linear<float, Cpu> other(nn::LinearOptions{.in_features = 3, .out_features = 2});
    ZeroRedundancyOptimizer<optim::SGD<float, Cpu>> zero(m, {.lr = 0.1, .momentum = 0.9}, c);
    CHECK_THROWS_AS(zero.consolidate(exec, 1), ValueError);
    optim::SGD<float, Cpu> wrong(other, {.lr = 0.1});
    CHECK_THROWS_WITH_AS(zero.load_consolidated(wrong), doctest::Contains("make_full()"), ValueError);
  }));
}
