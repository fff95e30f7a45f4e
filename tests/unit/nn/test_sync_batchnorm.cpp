// SyncBatchNorm (nn/sync_batchnorm.hpp) with ranks as threads (HashStore + tcp communicator): a ResNet whose
// BatchNorm2d layers are synchronised, each rank on its slice of a batch, equals the single-process model on
// the concatenated batch (outputs, input gradients, DDP-averaged parameter gradients, running statistics);
// uneven and empty slices; eval communicates nothing; errors name the layer.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <ddp/nn/batchnorm2d.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/nn/sync_batchnorm.hpp>
#include <ddp/tensor/random.hpp>

#include "random_tensor.hpp"
#include "../comm/comm_harness.hpp"

using namespace ddp;

namespace {

using Vec = std::vector<double>;  // every compared tensor, whatever the model computes in

// Rows [begin, begin + n) of a tensor whose first dimension is the batch.
template <class T>
Tensor<T, Cpu> rows_of(const Tensor<T, Cpu>& t, std::int64_t begin, std::int64_t n) {
  const Shape& s = t.shape();
  const std::int64_t per = t.numel() / s[0];
  Tensor<T, Cpu> out(s.rank() == 2 ? Shape{n, s[1]} : Shape{n, s[1], s[2], s[3]});
  std::copy_n(t.data() + begin * per, n * per, out.data());
  return out;
}

template <class T>
Vec vec(const T* p, std::int64_t n) {
  return Vec(p, p + n);
}

// ||a - b|| / ||b|| (the absolute norm when b is zero).
double rel_error(const Vec& a, const Vec& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// What one run (one rank, or the single process) produced after `steps` training steps.
struct Result {
  Vec logits;                       // of the last step, (n, classes)
  Vec dx;                           // d(loss)/d(input) of the last step, NHWC
  std::map<std::string, Vec> grad;  // parameter gradients of the last step
  std::vector<Vec> stats;           // running_mean, running_var of every BatchNorm2d, in visit order
};

// `steps` steps of: zero_grad, forward on x (each step a fresh batch), backward of loss = sum(logits * G) * scale.
// The loss is linear in the logits, so its gradient G * scale is fixed and exact; scale = W / N on every rank
// turns DDP's averaging into the single process's gradient of sum(logits * G) / N even for uneven slices
// (with equal slices it is DDP's own setting: each rank's loss is the mean over its slice).
template <class T>
Result run_resnet(nn::ResNet<T, Cpu>& m, const std::vector<Tensor<T, Cpu>>& xs, const std::vector<Tensor<T, Cpu>>& gs,
                  T scale) {
  Exec<Cpu> exec{};
  Result r;
  m.train();
  for (std::size_t s = 0; s < xs.size(); ++s) {
    m.zero_grad();
    auto logits = m.forward(exec, xs[s].cview());
    Tensor<T, Cpu> dl(logits.shape());
    for (std::int64_t i = 0; i < dl.numel(); ++i) dl.data()[i] = gs[s].data()[i] * scale;
    auto dx = m.backward(exec, dl.cview());
    r.logits = vec(logits.data(), logits.numel());
    r.dx = vec(dx.data(), dx.numel());
  }
  for (auto* p : m.parameters()) r.grad[p->name()] = vec(p->grad().data(), p->numel());
  m.visit([&](nn::Module<T, Cpu>& mod) {
    if (auto* bn = dynamic_cast<nn::BatchNorm2d<T, Cpu>*>(&mod)) {
      r.stats.push_back(vec(bn->running_mean().data(), bn->running_mean().numel()));
      r.stats.push_back(vec(bn->running_var().data(), bn->running_var().numel()));
    }
  });
  return r;
}

// World `sizes.size()`, rank r on rows [offset_r, offset_r + sizes[r]) of each step's batch, vs one process on
// the whole batch, in T. Returns the worst relative error over every compared tensor (each checked <= tol).
template <class T>
double resnet_vs_single_process(const std::vector<std::int64_t>& sizes, const std::string& arch, double tol) {
  const int world = static_cast<int>(sizes.size());
  std::int64_t n = 0;
  for (auto s : sizes) n += s;
  const nn::ResNetOptions opts{.arch = arch, .num_classes = 5, .seed = 11, .width = 4};
  constexpr int kSteps = 2;
  std::vector<Tensor<T, Cpu>> xs, gs;
  for (int s = 0; s < kSteps; ++s) {
    xs.push_back(ddp::test::randn<T>({n, 16, 16, 3}, 100 + s, 0.5, 2.0));  // a mean away from 0 for the one-pass variance
    gs.push_back(ddp::test::randn<T>({n, 5}, 200 + s));
  }

  nn::ResNet<T, Cpu> single(opts);
  const Result ref = run_resnet(single, xs, gs, T(1) / static_cast<T>(n));

  std::vector<Result> per_rank(static_cast<std::size_t>(world));
  std::vector<std::int64_t> offset(sizes.size(), 0);
  for (std::size_t r = 1; r < sizes.size(); ++r) offset[r] = offset[r - 1] + sizes[r - 1];
  const auto errors = test::run_ranks(
      world,
      [&](comm::TcpCommunicator& c) {
        const auto r = static_cast<std::size_t>(c.rank());
        nn::ResNet<T, Cpu> m(opts);
        CHECK(nn::convert_sync_batchnorm(m, c) == (arch == "resnet18" ? 20u : 53u));
        std::vector<Tensor<T, Cpu>> x_r, g_r;
        for (int s = 0; s < kSteps; ++s) {
          x_r.push_back(rows_of(xs[static_cast<std::size_t>(s)], offset[r], sizes[r]));
          g_r.push_back(rows_of(gs[static_cast<std::size_t>(s)], offset[r], sizes[r]));
        }
        per_rank[r] = run_resnet(m, x_r, g_r, static_cast<T>(world) / static_cast<T>(n));
      },
      {.timeout = std::chrono::seconds(60)});
  for (const auto& e : errors) REQUIRE_MESSAGE(!e, test::message(e));

  double worst = 0;
  auto compare = [&](const std::string& what, const Vec& ours, const Vec& theirs) {
    const double e = rel_error(ours, theirs);
    worst = std::max(worst, e);
    INFO(what << ": relative error " << e);
    CHECK(e <= tol);
  };
  Vec logits, dx;
  std::map<std::string, Vec> grad;
  for (int r = 0; r < world; ++r) {
    const Result& pr = per_rank[static_cast<std::size_t>(r)];
    logits.insert(logits.end(), pr.logits.begin(), pr.logits.end());
    for (double v : pr.dx) dx.push_back(v / world);  // rank r's loss is W times its share
    for (const auto& [name, g] : pr.grad) {
      Vec& acc = grad[name];
      acc.resize(g.size(), 0.0);
      for (std::size_t i = 0; i < g.size(); ++i) acc[i] += g[i] / world;  // DDP's average
    }
    for (std::size_t i = 0; i < ref.stats.size(); ++i)
      compare("rank " + std::to_string(r) + " running stats " + std::to_string(i), pr.stats[i], ref.stats[i]);
  }
  compare("logits", logits, ref.logits);
  compare("input gradient", dx, ref.dx);
  for (const auto& [name, g] : ref.grad) compare("grad " + name, grad[name], g);
  return worst;
}

// A lone BatchNorm2d per rank (training, then eval), forward and backward with dy given; returns rank 0's.
struct BnRun {
  Vec y, dx, dgamma, dbeta, running_mean, running_var;
  std::int64_t tracked = 0;
};

}  // namespace

TEST_SUITE("nn") {
  TEST_CASE("SyncBatchNorm: a resnet18 at width 4 on 2 and 4 ranks equals one process on the whole batch") {
    const double w2 = resnet_vs_single_process<float>({4, 4}, "resnet18", 1e-5);
    const double w4 = resnet_vs_single_process<float>({2, 2, 2, 2}, "resnet18", 1e-5);
    MESSAGE("float, worst relative error: world 2 ", w2, ", world 4 ", w4);
  }

  TEST_CASE("SyncBatchNorm: uneven slices (3 and 5) and a bottleneck resnet50") {
    const double uneven = resnet_vs_single_process<float>({3, 5}, "resnet18", 1e-5);
    // resnet50's layer4 sees 8 values per channel here: float rounding of the two batch sizes' convolutions,
    // amplified by those near-degenerate BatchNorms, reaches ~2e-4 in float, so it runs in double (where
    // any error of the synchronisation itself would show far above rounding).
    const double r50 = resnet_vs_single_process<double>({4, 4}, "resnet50", 1e-10);
    MESSAGE("worst relative error: uneven 3+5 (float) ", uneven, ", resnet50 on 2 ranks (double) ", r50);
  }

  TEST_CASE("SyncBatchNorm: a rank with an empty batch takes part (torch >= 1.12), eval communicates nothing") {
    // Rank 1 has no rows: ranks 0 and 2 together are the batch, and rank 1 still joins every all-reduce.
    const std::vector<std::int64_t> sizes{3, 0, 2};
    const auto x = ddp::test::randn({5, 2, 2, 6}, 7, 1.0, 3.0);
    const auto dy = ddp::test::randn({5, 2, 2, 6}, 8);
    auto run_layer = [](nn::BatchNorm2d<float, Cpu>& bn, const Tensor<float, Cpu>& xin, const Tensor<float, Cpu>& dyin) {
      Exec<Cpu> exec{};
      BnRun out;
      bn.train();
      auto y = bn.forward(exec, xin.cview());
      auto dx = bn.backward(exec, dyin.cview());
      out.y = vec(y.data(), y.numel());
      out.dx = vec(dx.data(), dx.numel());
      out.dgamma = vec(bn.weight().grad().data(), 6);
      out.dbeta = vec(bn.bias().grad().data(), 6);
      out.running_mean = vec(bn.running_mean().data(), 6);
      out.running_var = vec(bn.running_var().data(), 6);
      out.tracked = bn.num_batches_tracked().data()[0];
      return out;
    };
    nn::BatchNorm2d<float, Cpu> single({.num_features = 6});
    const BnRun ref = run_layer(single, x, dy);

    std::vector<BnRun> runs(3);
    std::vector<std::int64_t> offset{0, 3, 3};
    const auto errors = test::run_ranks(3, [&](comm::TcpCommunicator& c) {
      const auto r = static_cast<std::size_t>(c.rank());
      nn::BatchNorm2d<float, Cpu> bn({.num_features = 6});
      CHECK(nn::convert_sync_batchnorm(bn, c) == 1u);
      CHECK(bn.describe() == "SyncBatchNorm(6, eps=1e-05, momentum=0.1)");
      runs[r] = run_layer(bn, rows_of(x, offset[r], sizes[r]), rows_of(dy, offset[r], sizes[r]));
      // Eval: the running statistics, no collective (rank 1 skips it: a collective would then time out or
      // be reported as a mismatch on the other ranks).
      if (r != 1) {
        Exec<Cpu> exec{};
        bn.eval();
        auto y = bn.forward(exec, x.cview());
        auto dx = bn.backward(exec, dy.cview());
        CHECK(y.numel() == x.numel());
        CHECK(dx.numel() == x.numel());
      }
    });
    for (const auto& e : errors) REQUIRE_MESSAGE(!e, test::message(e));
    Vec y, dx, dgamma(6, 0.0f), dbeta(6, 0.0f);
    for (std::size_t r = 0; r < 3; ++r) {
      y.insert(y.end(), runs[r].y.begin(), runs[r].y.end());
      dx.insert(dx.end(), runs[r].dx.begin(), runs[r].dx.end());
      for (std::size_t k = 0; k < 6; ++k) {  // dy is the whole batch's: the ranks' own dgamma/dbeta add up
        dgamma[k] += runs[r].dgamma[k];
        dbeta[k] += runs[r].dbeta[k];
      }
      CHECK(rel_error(runs[r].running_mean, ref.running_mean) <= 1e-6);
      CHECK(rel_error(runs[r].running_var, ref.running_var) <= 1e-6);
      CHECK(runs[r].tracked == 1);
    }
    CHECK(runs[1].dgamma == Vec(6, 0.0f));  // no rows, no contribution
    CHECK(rel_error(y, ref.y) <= 1e-6);
    CHECK(rel_error(dx, ref.dx) <= 1e-6);
    CHECK(rel_error(dgamma, ref.dgamma) <= 1e-6);
    CHECK(rel_error(dbeta, ref.dbeta) <= 1e-6);
  }

  TEST_CASE("SyncBatchNorm: too few values over all ranks is a ValueError naming the layer on every rank") {
    const auto errors = test::run_ranks(2, [&](comm::TcpCommunicator& c) {
      nn::ResNet<float, Cpu> m({.arch = "resnet18", .num_classes = 3, .seed = 1, .width = 4});
      nn::convert_sync_batchnorm(m, c);
      // The stem's BatchNorm alone: one value per channel on rank 0, none on rank 1 -> 1 in total.
      auto& bn = dynamic_cast<nn::BatchNorm2d<float, Cpu>&>(*m.children()[1].second);
      Exec<Cpu> exec{};
      auto x = ddp::test::randn({c.rank() == 0 ? 1 : 0, 1, 1, 4}, 4);
      bn.forward(exec, x.cview());
    });
    for (const auto& e : errors) {
      REQUIRE(e);
      const std::string msg = test::message(e);
      INFO(msg);
      CHECK(msg.find("ddp: module 'bn1' (SyncBatchNorm(4, eps=1e-05, momentum=0.1)): batchnorm_forward (synchronised over ranks): training needs more than 1 value per "
                     "channel over all ranks together, got 1") == 0);
    }
  }

  TEST_CASE("SyncBatchNorm: a communicator of one rank leaves the ordinary kernels (bit-identical)") {
    const auto x = ddp::test::randn({4, 3, 3, 5}, 9, 2.0, 1.5);
    const auto dy = ddp::test::randn({4, 3, 3, 5}, 10);
    Exec<Cpu> exec{};
    nn::BatchNorm2d<float, Cpu> plain({.num_features = 5});
    auto y0 = plain.forward(exec, x.cview());
    auto dx0 = plain.backward(exec, dy.cview());
    const auto errors = test::run_ranks(1, [&](comm::TcpCommunicator& c) {
      nn::BatchNorm2d<float, Cpu> bn({.num_features = 5});
      nn::convert_sync_batchnorm(bn, c);
      Exec<Cpu> e{};
      auto y = bn.forward(e, x.cview());
      auto dx = bn.backward(e, dy.cview());
      CHECK(vec(y.data(), y.numel()) == vec(y0.data(), y0.numel()));
      CHECK(vec(dx.data(), dx.numel()) == vec(dx0.data(), dx0.numel()));
    });
    for (const auto& e : errors) REQUIRE_MESSAGE(!e, test::message(e));
  }
}
