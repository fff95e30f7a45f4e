// DistributedDataParallel over op-written models (nn::OpsModule, tests/unit/autograd/ops_models.hpp), ranks as
// threads: each of ResCnn, SwiGluMlp and TinyGpt (tied embedding) trained at world 2 and 4 with per-rank batch B
// ends with the parameters of world 1 trained on the same samples (batch W*B), float64; buckets overlapping the
// tape's backward; DDP with ZeRO-1; an op model that skips a parameter (find_unused_parameters, static_graph); no_sync
// accumulation. SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <ddp/nn/loss.hpp>
#include <ddp/nn/ops_module.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/parallel/ddp.hpp>
#include <ddp/parallel/zero.hpp>

#include "parallel_test_util.hpp"
#include "unit/autograd/ops_models.hpp"

namespace test_ddp_ops_models {
using namespace ddp;
using namespace ddp::test::ops_models;
using parallel::DistributedDataParallel;
using Td = Tensor<double, Cpu>;
using I64 = Tensor<std::int64_t, Cpu>;
using ParamsD = std::map<std::string, std::vector<double>>;

constexpr optim::SgdOptions kSgd{.lr = 0.1, .momentum = 0.9};

void fill_params(nn::Module<double, Cpu>& m, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-0.4, 0.4);
  for (auto* p : m.parameters())
    for (std::int64_t i = 0; i < p->numel(); ++i) p->value().data()[i] = u(rng);
}
ParamsD snapshot(nn::Module<double, Cpu>& m) {
  ParamsD out;
  for (auto* p : m.parameters())
    out[p->name()] = std::vector<double>(p->value().data(), p->value().data() + p->numel());
  return out;
}
double max_abs_diff(const ParamsD& a, const ParamsD& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (const auto& [name, vb] : b)
    for (std::size_t i = 0; i < vb.size(); ++i) d = std::max(d, std::abs(a.at(name)[i] - vb[i]));
  return d;
}

// Samples [from, from + n) of t (dim 0 indexes samples); `flat`: as one dimension (cross-entropy's labels).
template <class E>
Tensor<E, Cpu> slice(const Tensor<E, Cpu>& t, std::int64_t from, std::int64_t n, bool flat = false) {
  const std::int64_t per = t.numel() / t.shape()[0];
  std::vector<std::int64_t> dims(t.shape().begin(), t.shape().end());
  dims[0] = n;
  Tensor<E, Cpu> out(flat ? Shape{n * per} : Shape(dims));
  std::memcpy(out.data(), t.data() + from * per, static_cast<std::size_t>(n * per) * sizeof(E));
  return out;
}

// A model's data: inputs X (doubles, or int64 token ids) and int64 labels, `total` samples.
template <class X>
struct Data {
  Tensor<X, Cpu> x;
  I64 labels;
};

// forward, mean cross-entropy, backward of `model` (a module or its DDP wrapper) on samples [from, from + n),
// the loss gradient scaled by `scale`.
template <class M, class X>
void step_pass(Exec<Cpu>& exec, M& model, const Data<X>& d, std::int64_t from, std::int64_t n, double scale = 1.0) {
  const auto x = slice(d.x, from, n);
  const auto t = slice(d.labels, from, n, true);
  nn::CrossEntropyLoss<double, Cpu> ce;
  const Td y = model.forward(exec, x.cview());
  ce.forward(exec, y.cview(), t.cview());
  Td dy = ce.backward(exec);
  for (std::int64_t i = 0; i < dy.numel(); ++i) dy.data()[i] *= scale;
  model.backward(exec, dy.cview());
}

// World W with per-rank batch B for `steps` SGD steps vs world 1 with batch W*B on the same samples; every rank's
// parameters, the worst |difference| over ranks. Ranks start from different values (DDP broadcasts rank 0's).
template <class Model, class X>
double ddp_vs_world1(int world, std::int64_t B, int steps, const Data<X>& d) {
  Exec<Cpu> exec;
  Model ref;
  fill_params(ref, 5);
  optim::SGD<double, Cpu> ropt(ref.parameters(), kSgd);
  for (int s = 0; s < steps; ++s) {
    ropt.zero_grad();
    step_pass(exec, ref, d, s * world * B, world * B);
    ropt.step(exec);
  }
  std::vector<ParamsD> got(static_cast<std::size_t>(world));
  test::check_all_ok(test::run_ranks(world, [&](comm::TcpCommunicator& c) {
    Exec<Cpu> ex;
    Model net;
    fill_params(net, 5 + static_cast<std::uint64_t>(c.rank()));
    DistributedDataParallel<double, Cpu> model(net, c);
    optim::SGD<double, Cpu> opt(net.parameters(), kSgd);
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      step_pass(ex, model, d, s * world * B + c.rank() * B, B);
      opt.step(ex);
    }
    got[static_cast<std::size_t>(c.rank())] = snapshot(net);
  }));
  const ParamsD want = snapshot(ref);
  double worst = 0;
  for (const auto& g : got) {
    if (g.empty()) return 1e9;  // that rank failed (reported above)
    worst = std::max(worst, max_abs_diff(g, want));
  }
  return worst;
}

Td uniform(Shape s, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  Td t(s);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = u(rng);
  return t;
}
I64 tokens(Shape s, std::int64_t vocab, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  I64 t(s);
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.data()[i] = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(vocab));
  return t;
}

constexpr std::int64_t kB = 2;
constexpr int kSteps = 3;
constexpr std::int64_t kSamples = 4 * kB * kSteps;  // enough for world 4

TEST_CASE("op-written ResCnn, SwiGluMlp, TinyGpt under DDP at world 2 and 4 end with world 1's parameters") {
  const Data<double> images{uniform(Shape{kSamples, 6, 6, 3}, 1), tokens(Shape{kSamples}, 5, 2)};
  const Data<double> features{uniform(Shape{kSamples, 6}, 3), tokens(Shape{kSamples}, 5, 4)};
  const Data<std::int64_t> text{tokens(Shape{kSamples, TinyGpt<double>::kLen}, TinyGpt<double>::kVocab, 5),
                                tokens(Shape{kSamples, TinyGpt<double>::kLen}, TinyGpt<double>::kVocab, 6)};
  for (int world : {2, 4}) {
    CAPTURE(world);
    const double cnn = ddp_vs_world1<ResCnn<double>>(world, kB, kSteps, images);
    const double mlp = ddp_vs_world1<SwiGluMlp<double>>(world, kB, kSteps, features);
    const double gpt = ddp_vs_world1<TinyGpt<double>>(world, kB, kSteps, text);
    CHECK(cnn < 1e-12);
    CHECK(mlp < 1e-12);
    CHECK(gpt < 1e-12);
    MESSAGE("world ", world, ", ", kSteps, " SGD steps, max |param - world 1's|: ResCnn ", cnn, ", SwiGluMlp ", mlp,
            ", TinyGpt ", gpt);
  }
}

TEST_CASE("DDP over an op model: with small buckets, all-reduces start while the tape's backward still runs") {
  const Data<std::int64_t> text{tokens(Shape{8, TinyGpt<double>::kLen}, TinyGpt<double>::kVocab, 10),
                                tokens(Shape{8, TinyGpt<double>::kLen}, TinyGpt<double>::kVocab, 11)};
  std::vector<parallel::StepTrace> traces(2);
  test::check_all_ok(test::run_ranks(2, [&](comm::TcpCommunicator& c) {
    Exec<Cpu> ex;
    TinyGpt<double> net;
    fill_params(net, 5);
    // about 1 K doubles (8 KB): 1 KiB buckets give several
    DistributedDataParallel<double, Cpu> model(net, c, {.bucket_cap_bytes = 1 << 10, .first_bucket_cap_bytes = 256});
    for (int s = 0; s < 2; ++s) step_pass(ex, model, text, c.rank() * 4, 4);
    traces[static_cast<std::size_t>(c.rank())] = model.last_trace();
  }));
  for (const auto& t : traces) {
    CHECK(t.buckets.size() > 3);
    CHECK(t.launched_during_backward() >= 1);
    MESSAGE("TinyGpt (op-written): buckets launched while backward still produced gradients: ",
            t.launched_during_backward(), " of ", t.buckets.size());
  }
}

TEST_CASE("DDP and ZeRO-1 over an op model (TinyGpt, tied embedding): world 2 ends with world 1's parameters") {
  const Data<std::int64_t> text{tokens(Shape{kSamples, TinyGpt<double>::kLen}, TinyGpt<double>::kVocab, 12),
                                tokens(Shape{kSamples, TinyGpt<double>::kLen}, TinyGpt<double>::kVocab, 13)};
  Exec<Cpu> exec;
  TinyGpt<double> ref;
  fill_params(ref, 5);
  optim::SGD<double, Cpu> ropt(ref.parameters(), kSgd);
  for (int s = 0; s < kSteps; ++s) {
    ropt.zero_grad();
    step_pass(exec, ref, text, s * 2 * kB, 2 * kB);
    ropt.step(exec);
  }
  std::vector<ParamsD> got(2);
  test::check_all_ok(test::run_ranks(2, [&](comm::TcpCommunicator& c) {
    Exec<Cpu> ex;
    TinyGpt<double> net;
    fill_params(net, 5);
    DistributedDataParallel<double, Cpu> model(net, c);
    parallel::ZeroRedundancyOptimizer<optim::SGD<double, Cpu>> opt(net.parameters(), kSgd, c);
    for (int s = 0; s < kSteps; ++s) {
      net.zero_grad();
      step_pass(ex, model, text, s * 2 * kB + c.rank() * kB, kB);
      opt.step(ex);
    }
    got[static_cast<std::size_t>(c.rank())] = snapshot(net);
  }));
  const double d = std::max(max_abs_diff(got[0], snapshot(ref)), max_abs_diff(got[1], snapshot(ref)));
  CHECK(d < 1e-12);
  MESSAGE("DDP + ZeRO-1 (SGD, momentum), TinyGpt, world 2: max |param - world 1's| ", d);
}

// An op model whose forward never uses `unused.weight` / `unused.bias`.
class SkipsOne : public nn::OpsModule<double, Cpu> {
 public:
  SkipsOne() : used_(register_module("used", std::make_unique<LinearOp<double>>(6, 5))) {
    register_module("unused", std::make_unique<LinearOp<double>>(6, 5));
  }
  std::string describe() const override { return "SkipsOne"; }

 protected:
  Var forward_ops(Graph& g, const Var& x) override { return g(used_, x); }

 private:
  LinearOp<double>& used_;
};

TEST_CASE("DDP over op models: find_unused_parameters and static_graph with a skipped parameter, no_sync") {
  const Data<double> features{uniform(Shape{kSamples, 6}, 7), tokens(Shape{kSamples}, 5, 8)};
  // Without the flag the skipped parameter is named; with it, training equals world 1 and it keeps no gradient.
  test::check_all_ok(test::run_ranks(2, [&](comm::TcpCommunicator& c) {
    Exec<Cpu> ex;
    SkipsOne net;
    DistributedDataParallel<double, Cpu> model(net, c);
    CHECK_THROWS_WITH_AS(step_pass(ex, model, features, c.rank() * kB, kB),
                         doctest::Contains("parameter 'unused.weight' received no gradient in step 0"), Error);
  }));
  Exec<Cpu> exec;
  SkipsOne ref;
  fill_params(ref, 5);
  optim::SGD<double, Cpu> ropt(ref.parameters(), kSgd);
  for (int s = 0; s < kSteps; ++s) {
    ropt.zero_grad();
    step_pass(exec, ref, features, s * 2 * kB, 2 * kB);
    ropt.step(exec);
  }
  double skip = 0;
  for (const parallel::DdpOptions& o :
       {parallel::DdpOptions{.find_unused_parameters = true}, parallel::DdpOptions{.static_graph = true}}) {
    CAPTURE(o.static_graph);
    std::vector<ParamsD> got(2);
    std::vector<int> unused_has_grad(2, -1);
    test::check_all_ok(test::run_ranks(2, [&](comm::TcpCommunicator& c) {
      Exec<Cpu> ex;
      SkipsOne net;
      fill_params(net, 5);
      DistributedDataParallel<double, Cpu> model(net, c, o);
      optim::SGD<double, Cpu> opt(net.parameters(), kSgd);
      for (int s = 0; s < kSteps; ++s) {
        opt.zero_grad();
        step_pass(ex, model, features, s * 2 * kB + c.rank() * kB, kB);
        opt.step(ex);
      }
      unused_has_grad[static_cast<std::size_t>(c.rank())] = net.find_parameter("unused.weight")->has_grad();
      got[static_cast<std::size_t>(c.rank())] = snapshot(net);
    }));
    CHECK(unused_has_grad == std::vector<int>{0, 0});  // no rank used it: torch's .grad is None
    skip = std::max({skip, max_abs_diff(got[0], snapshot(ref)), max_abs_diff(got[1], snapshot(ref))});
    CHECK(skip < 1e-12);
  }

  // no_sync: m micro-batches per rank accumulated locally, the last one synchronised, equal one world-1 step on
  // the concatenated batch (each micro-batch's loss scaled by 1/m, as with torch).
  const int m = 3;
  SwiGluMlp<double> one;
  fill_params(one, 9);
  optim::SGD<double, Cpu> oopt(one.parameters(), kSgd);
  oopt.zero_grad();
  step_pass(exec, one, features, 0, 2 * m * kB);
  oopt.step(exec);
  std::vector<ParamsD> acc(2);
  test::check_all_ok(test::run_ranks(2, [&](comm::TcpCommunicator& c) {
    Exec<Cpu> ex;
    SwiGluMlp<double> net;
    fill_params(net, 9);
    DistributedDataParallel<double, Cpu> model(net, c);
    optim::SGD<double, Cpu> opt(net.parameters(), kSgd);
    opt.zero_grad();
    {
      auto guard = model.no_sync();
      for (int j = 0; j + 1 < m; ++j) step_pass(ex, model, features, c.rank() * m * kB + j * kB, kB, 1.0 / m);
    }
    CHECK(model.steps() == 0);  // nothing synchronised yet
    step_pass(ex, model, features, c.rank() * m * kB + (m - 1) * kB, kB, 1.0 / m);
    opt.step(ex);
    acc[static_cast<std::size_t>(c.rank())] = snapshot(net);
  }));
  const double nosync = std::max(max_abs_diff(acc[0], snapshot(one)), max_abs_diff(acc[1], snapshot(one)));
  CHECK(nosync < 1e-12);
  MESSAGE("find_unused_parameters and static_graph (skipped parameter), world 2: max |param - world 1's| ", skip,
          "; no_sync, ", m, " micro-batches, world 2: ", nosync);
}

}  // namespace test_ddp_ops_models
