// DistributedDataParallel's join (uneven inputs, docs/decisions/0030) with ranks as threads (HashStore + tcp
// communicator): ranks run different numbers of steps, the joined ones shadow the others' collectives, and every rank
// ends with the model of the last to join -- which must equal a single process that, at each step, sums the
// gradients of the ranks still training and divides by the full world size (torch's divide_by_initial_world_size).
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ddp/nn/linear.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/parallel/ddp.hpp>
#include <ddp/tensor/random.hpp>

#include "parallel_test_util.hpp"

using namespace ddp;
using test::check_all_ok;
using test::max_rel_diff;
using test::Params;
using test::snapshot_params;
using test::mse_pass;
using test::RegressionData;
using ddp::parallel::DistributedDataParallel;

namespace {

// Two heads on 20 features, out = a(x) [+ b(x)] by `mode`: "b" is unused where mode is "a".
class Heads : public nn::Module<float, Cpu> {
 public:
  explicit Heads(std::uint64_t seed) {
    a_ = &register_module("a", std::make_unique<nn::Linear<float, Cpu>>(nn::LinearOptions{.in_features = 20, .out_features = 3}));
    b_ = &register_module("b", std::make_unique<nn::Linear<float, Cpu>>(nn::LinearOptions{.in_features = 20, .out_features = 3}));
    Generator g(seed);
    a_->reset_parameters(g);
    b_->reset_parameters(g);
  }
  std::string mode = "ab";
  Tensor<float, Cpu> forward_impl(Exec<Cpu>& e, TensorView<const float, Cpu> x) override {
    used_ = mode;
    Tensor<float, Cpu> out = a_->forward(e, x);
    if (used_ == "ab") {
      auto y = b_->forward(e, x);
      for (std::int64_t i = 0; i < out.numel(); ++i) out.data()[i] += y.data()[i];
    }
    return out;
  }
  Tensor<float, Cpu> backward_impl(Exec<Cpu>& e, TensorView<const float, Cpu> dy) override {
    Tensor<float, Cpu> dx = a_->backward(e, dy);
    if (used_ == "ab") {
      auto d = b_->backward(e, dy);
      for (std::int64_t i = 0; i < dx.numel(); ++i) dx.data()[i] += d.data()[i];
    }
    return dx;
  }
  std::string describe() const override { return "Heads"; }

 private:
  nn::Linear<float, Cpu>* a_ = nullptr;
  nn::Linear<float, Cpu>* b_ = nullptr;
  std::string used_;
};

const RegressionData& data() {
  static const RegressionData d(512, 20, 3);
  return d;
}

constexpr std::int64_t kB = 8;
constexpr optim::SgdOptions kJoinSgd{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-2};

// forward + MSE + backward of `model` (Heads or its DDP wrapper) on rows [from, from + kB), dy scaled.
template <class M>
void pass(Exec<Cpu>& exec, M& model, std::int64_t from, float scale = 1.0f) {
  mse_pass(exec, model, data(), from, kB, scale);
}

struct Case {
  std::vector<int> steps;           // per rank
  std::vector<std::string> modes;   // per rank ("ab" everywhere when empty)
  int micro = 1;                    // passes per step: micro - 1 under no_sync, then a synchronised one
  parallel::DdpOptions options{.bucket_cap_bytes = 64, .first_bucket_cap_bytes = 16};  // several buckets
};

// Rank r, step s, micro-batch m reads rows ((s * micro + m) * W + r) * kB.
std::int64_t rows_of(const Case& c, int world, int r, int s, int m) {
  return ((static_cast<std::int64_t>(s) * c.micro + m) * world + r) * kB;
}

std::string mode_of(const Case& c, int r) { return c.modes.empty() ? "ab" : c.modes[static_cast<std::size_t>(r)]; }

// Every rank's parameters after its own steps and join(). Ranks start from different seeds (construction makes
// them rank 0's).
std::vector<Params> run_join(const Case& c) {
  const int world = static_cast<int>(c.steps.size());
  std::vector<Params> out(static_cast<std::size_t>(world));
  auto errors = test::run_ranks(world, [&](comm::TcpCommunicator& comm) {
    const int r = comm.rank();
    Exec<Cpu> exec;
    Heads net(100 + static_cast<std::uint64_t>(r));
    net.mode = mode_of(c, r);
    DistributedDataParallel<float, Cpu> model(net, comm, c.options);
    optim::SGD<float, Cpu> opt(net.parameters(), kJoinSgd);
    {
      auto joining = model.join_context();
      for (int s = 0; s < c.steps[static_cast<std::size_t>(r)]; ++s) {
        opt.zero_grad();
        for (int m = 0; m + 1 < c.micro; ++m) {
          auto guard = model.no_sync();
          pass(exec, model, rows_of(c, world, r, s, m));
        }
        pass(exec, model, rows_of(c, world, r, s, c.micro - 1));
        opt.step(exec);
      }
      model.join();
    }
    out[static_cast<std::size_t>(r)] = snapshot_params(net);
  });
  check_all_ok(errors);
  return out;
}

// One process: at step s, the sum over the ranks still training of their gradients, divided by W. With
// find_unused_parameters a joined rank adds the used flags agreed in the last step it took part in (torch's
// _match_unused_params_allreduce), so from step 1 on, once some rank has joined, a parameter used in the previous
// step counts as used: it gets a zero gradient (weight decay and momentum move it) instead of none.
Params run_reference(const Case& c) {
  const int world = static_cast<int>(c.steps.size());
  Exec<Cpu> exec;
  Heads net(100);
  optim::SGD<float, Cpu> opt(net.parameters(), kJoinSgd);
  const int steps = *std::max_element(c.steps.begin(), c.steps.end());
  const auto params = net.parameters();
  std::vector<bool> used_before(params.size(), false);  // agreed in step s - 1
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    bool someone_joined = false;
    for (int r = 0; r < world; ++r) {
      if (s >= c.steps[static_cast<std::size_t>(r)]) {
        someone_joined = true;
        continue;
      }
      net.mode = mode_of(c, r);
      for (int m = 0; m < c.micro; ++m) pass(exec, net, rows_of(c, world, r, s, m), 1.0f / static_cast<float>(world));
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (c.options.find_unused_parameters && s > 0 && someone_joined && used_before[i] && !params[i]->has_grad()) {
        Tensor<float, Cpu>& g = params[i]->grad();  // a zero gradient: zero_grad() left grad()'s values as they were
        std::fill(g.data(), g.data() + g.numel(), 0.f);
        params[i]->set_grad_written();
      }
      used_before[i] = params[i]->has_grad();
    }
    opt.step(exec);
  }
  return snapshot_params(net);
}

void check_case(const Case& c) {
  const auto got = run_join(c);
  const auto ref = run_reference(c);
  for (std::size_t r = 0; r < got.size(); ++r) {
    CAPTURE(r);
    REQUIRE(!got[r].empty());
    CHECK(got[r] == got[0]);  // bit for bit: the final broadcast
  }
  const double d = max_rel_diff(got[0], ref);
  MESSAGE("max relative difference to the single-process reference: ", d);
  CHECK(d < 1e-5);
}

}  // namespace

TEST_SUITE("parallel") {
  TEST_CASE("join: uneven step counts equal one process summing the ranks still training, / W (world 2 and 4)") {
    for (const auto& steps : std::vector<std::vector<int>>{{1, 3},  // rank 0 joins first
                                                           {3, 1},
                                                           {0, 2},  // rank 0 shadows the first step and its rebuild
                                                           {2, 2},  // even: join() only syncs
                                                           {2, 4, 1, 3},
                                                           {1, 2, 3, 4},
                                                           {4, 3, 2, 0}}) {
      CAPTURE(steps.size());
      CAPTURE(steps[0]);
      CAPTURE(steps[1]);
      check_case(Case{.steps = steps});
    }
  }

  TEST_CASE("join + find_unused_parameters: joined ranks add the used flags of their last step, as torch's do") {
    // "b" is used on odd ranks only. {4, 1}: rank 1 joins after using b, so b stays used (zero gradients, decay
    // and momentum) while rank 0 trains alone; {3, 0}: rank 1 never used it, so b keeps no gradient.
    for (const auto& steps : std::vector<std::vector<int>>{{4, 1}, {3, 0}, {1, 3}, {4, 2, 3, 1}, {2, 0, 3, 0}}) {
      CAPTURE(steps.size());
      CAPTURE(steps[0]);
      Case c{.steps = steps, .modes = {}};
      for (std::size_t r = 0; r < steps.size(); ++r) c.modes.push_back(r % 2 == 1 ? "ab" : "a");
      c.options.find_unused_parameters = true;
      check_case(c);
    }
  }

  TEST_CASE("join + no_sync: accumulation passes of the others are shadowed without a reduction") {
    check_case(Case{.steps = {1, 3}, .modes = {}, .micro = 3});
    check_case(Case{.steps = {3, 0, 2, 1}, .modes = {}, .micro = 2});
  }

  TEST_CASE("join + comm hook: joined ranks run the hook on zero buckets, so its collectives match") {
    // A hook that counts its calls and otherwise is the default: every rank calls it for every bucket of
    // every synchronised step of the rank that trains longest.
    const int world = 2;
    const std::vector<int> steps{1, 3};
    std::vector<int> calls(world, 0), first(world, 0), buckets(world, 0);  // calls; buckets in step 0, at the end
    auto errors = test::run_ranks(world, [&](comm::TcpCommunicator& comm) {
      const int r = comm.rank();
      Exec<Cpu> exec;
      Heads net(7);
      DistributedDataParallel<float, Cpu> model(net, comm, Case{}.options);
      int& n = calls[static_cast<std::size_t>(r)];
      auto inner = parallel::fp16_compress_hook<float>();
      model.register_comm_hook([&n, inner](parallel::GradBucket<float>& b) {
        ++n;
        return inner(b);
      });
      first[static_cast<std::size_t>(r)] = static_cast<int>(model.buckets().size());
      optim::SGD<float, Cpu> opt(net.parameters(), kJoinSgd);
      auto joining = model.join_context();
      for (int s = 0; s < steps[static_cast<std::size_t>(r)]; ++s) {
        opt.zero_grad();
        pass(exec, model, (s * world + r) * kB);
        opt.step(exec);
      }
      model.join();
      buckets[static_cast<std::size_t>(r)] = static_cast<int>(model.buckets().size());
    });
    check_all_ok(errors);
    CHECK(buckets[0] > 1);
    CHECK(first[1] == first[0]);
    CHECK(buckets[1] == buckets[0]);
    CHECK(calls[0] == first[0] + 2 * buckets[0]);  // the buckets are rebuilt after step 0
    CHECK(calls[1] == calls[0]);
  }

  TEST_CASE("join: misuse is an Error on the calling rank, before any collective") {
    auto errors = test::run_ranks(2, [&](comm::TcpCommunicator& comm) {
      Exec<Cpu> exec;
      Heads net(3);
      DistributedDataParallel<float, Cpu> model(net, comm);
      CHECK_THROWS_WITH_AS(model.join(), doctest::Contains("join() outside a join context"), Error);
      {
        auto joining = model.join_context();
        CHECK(model.join_mode());
        CHECK_THROWS_AS((void)model.join_context(), ValueError);
        model.join();
        CHECK_THROWS_WITH_AS(model.join(), doctest::Contains("join() called twice"), Error);
        CHECK_THROWS_WITH_AS(pass(exec, model, 0), doctest::Contains("forward() after join()"), Error);
      }
      CHECK(!model.join_mode());
      pass(exec, model, comm.rank() * kB);  // outside the context: an ordinary step again
    });
    check_all_ok(errors);
  }

  TEST_CASE("join: a rank that leaves without join() makes the others fail within their timeout, not hang") {
    std::vector<int> failed(2, 0);
    auto errors = test::run_ranks(
        2,
        [&](comm::TcpCommunicator& comm) {
          const int r = comm.rank();
          Exec<Cpu> exec;
          Heads net(3);
          DistributedDataParallel<float, Cpu> model(net, comm);
          auto joining = model.join_context();
          try {
            for (int s = 0; s < (r == 0 ? 3 : 1); ++s) pass(exec, model, (s * 2 + r) * kB);
            if (r == 0) model.join();  // rank 1 forgets join()
          } catch (const Error&) {
            failed[static_cast<std::size_t>(r)] = 1;
          }
        },
        comm::CommOptions{.timeout = std::chrono::seconds(2)});
    check_all_ok(errors);
    CHECK(failed[0] == 1);
  }
}
