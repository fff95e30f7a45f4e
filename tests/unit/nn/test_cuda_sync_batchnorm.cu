// SyncBatchNorm on the GPU: two ranks as processes (support/rank_processes.hpp says why not threads) on device
// 0 over tcp ("gloo") staged through pinned memory (docs/decisions/0023), a resnet18 at width 4 with
// convert_sync_batchnorm, each rank on half the batch, against the CPU model (ordinary BatchNorm) on the whole
// batch: logits, input gradient, DDP-averaged parameter gradients, running statistics. The fused BatchNorm +
// ReLU kernels run synchronised here. Skips (exit 77) without a GPU; the check that a host-memory communicator
// is refused for CUDA needs none.
// SPDX-License-Identifier: MIT
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ddp/comm/staging/cuda/staging_device.hpp>
#include <ddp/comm/factory.hpp>
#include <ddp/kernels/cuda/kernels.cuh>
#include <ddp/nn/resnet.hpp>
#include <ddp/nn/sync_batchnorm.hpp>
#include <ddp/store/file_store.hpp>
#include <ddp/store/hash_store.hpp>
#include <ddp/tensor/cuda/copy.hpp>
#include <ddp/tensor/cuda/stream.hpp>
#include <ddp/tensor/random.hpp>

#include "support/gpu.hpp"
#include "support/rank_processes.hpp"
#include "unit/comm/comm_harness.hpp"

namespace {

using ddp::Cpu;
using ddp::Cuda;
using ddp::Exec;
using ddp::Shape;
using ddp::Tensor;
using Vec = std::vector<double>;

constexpr std::int64_t kN = 8, kClasses = 5;
const ddp::nn::ResNetOptions kNet{.arch = "resnet18", .num_classes = kClasses, .seed = 11, .width = 4};

Tensor<float, Cpu> randn(Shape s, std::uint64_t seed, double mean, double stddev) {
  Tensor<float, Cpu> t(s);
  ddp::Generator g(seed, 0, ddp::kStreamData);
  g.fill_normal(t.view(), mean, stddev);
  return t;
}

Vec vec(const float* p, std::int64_t n) { return Vec(p, p + n); }

double rel_error(const Vec& a, const Vec& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

struct Result {
  Vec logits, dx;
  std::map<std::string, Vec> grad;
  std::vector<Vec> stats;
};

// One training step on the CPU (the reference) or the GPU, with d(loss)/d(logits) = g * scale.
template <ddp::Device D>
Result step(ddp::nn::ResNet<float, D>& m, Exec<D>& exec, const Tensor<float, Cpu>& x, const Tensor<float, Cpu>& g,
            float scale) {
  Tensor<float, Cpu> dl(g.shape());
  for (std::int64_t i = 0; i < g.numel(); ++i) dl.data()[i] = g.data()[i] * scale;
  auto xd = ddp::to<D>(x.cview(), exec);
  auto dld = ddp::to<D>(dl.cview(), exec);
  m.train();
  m.zero_grad();
  auto logits = m.forward(exec, xd.cview());
  auto dx = m.backward(exec, dld.cview());
  Result r;
  auto host = [&](const Tensor<float, D>& t) {
    auto h = ddp::to<Cpu>(t.cview(), exec);
    return vec(h.data(), h.numel());
  };
  r.logits = host(logits);
  r.dx = host(dx);
  for (auto* p : m.parameters()) r.grad[p->name()] = host(p->grad());
  m.visit([&](ddp::nn::Module<float, D>& mod) {
    if (auto* bn = dynamic_cast<ddp::nn::BatchNorm2d<float, D>*>(&mod)) {
      r.stats.push_back(host(bn->running_mean()));
      r.stats.push_back(host(bn->running_var()));
    }
  });
  return r;
}

// A Result as one vector (logits, dx, the gradients in name order, the statistics), and back, shaped like `like`.
Vec flat(const Result& r) {
  Vec v(r.logits);
  v.insert(v.end(), r.dx.begin(), r.dx.end());
  for (const auto& [name, gr] : r.grad) v.insert(v.end(), gr.begin(), gr.end());
  for (const Vec& s : r.stats) v.insert(v.end(), s.begin(), s.end());
  return v;
}
Result unflat(const Vec& v, const Result& like) {
  REQUIRE(v.size() == flat(like).size());
  Result r = like;
  auto it = v.begin();
  auto take = [&](Vec& dst) {
    std::copy_n(it, dst.size(), dst.begin());
    it += static_cast<std::ptrdiff_t>(dst.size());
  };
  take(r.logits);
  take(r.dx);
  for (auto& [name, gr] : r.grad) take(gr);
  for (Vec& s : r.stats) take(s);
  return r;
}

constexpr const char* kTwoRanks =
    "SyncBatchNorm on CUDA: two rank processes on one GPU equal the CPU model on the whole batch";

Tensor<float, Cpu> half_of(const Tensor<float, Cpu>& t, int r) {
  const std::int64_t per = t.numel() / t.shape()[0], n = t.shape()[0] / 2;
  Tensor<float, Cpu> out(t.shape().rank() == 2 ? Shape{n, t.shape()[1]} : Shape{n, t.shape()[1], t.shape()[2], t.shape()[3]});
  std::copy_n(t.data() + r * n * per, n * per, out.data());
  return out;
}

}  // namespace

TEST_SUITE("nn") {
  TEST_CASE("SyncBatchNorm on CUDA refuses a host-memory communicator, naming the fix") {
    const auto errors = ddp::test::run_ranks(1, [](ddp::comm::TcpCommunicator& c) {
      CHECK_THROWS_WITH_AS(ddp::nn::CommChannelSums<Cuda>{c},
                           doctest::Contains("SyncBatchNorm on cuda needs a communicator on CUDA device memory"),
                           ddp::ConfigError);
    });
    for (const auto& e : errors) REQUIRE_MESSAGE(!e, ddp::test::message(e));
  }

  TEST_CASE(kTwoRanks) {
    if (ddp::test::skip_without_gpu()) return;
    const auto me = ddp::test::as_rank_processes(kTwoRanks, 2);  // the parent runs the ranks
    if (!me) return;
    const int r = me->rank;
    const auto x = randn({kN, 16, 16, 3}, 100, 0.5, 2.0);
    const auto g = randn({kN, kClasses}, 200, 0.0, 1.0);
    ddp::nn::ResNet<float, Cpu> single(kNet);
    Exec<Cpu> cpu{};
    const Result ref = step(single, cpu, x, g, 1.0f / kN);

    ddp::store::FileStore store(me->store_path, std::chrono::seconds(120));
    std::vector<Result> per_rank(2);
    {
      REQUIRE(cudaSetDevice(0) == cudaSuccess);
      auto comm = ddp::comm::make_communicator("gloo", {.rank = r, .world_size = 2, .master_addr = "127.0.0.1"},
                                               store, {.timeout = std::chrono::seconds(60), .cuda_device = 0});
      ddp::nn::ResNet<float, Cuda> m(kNet);
      CHECK(ddp::nn::convert_sync_batchnorm(m, *comm) == 20u);
      ddp::Stream stream;
      Exec<Cuda> exec = stream.exec(ddp::Precision::Fp32);
      per_rank[static_cast<std::size_t>(r)] = step(m, exec, half_of(x, r), half_of(g, r), 2.0f / kN);
    }
    // Each rank hands its result to the other through the store; rank 0 compares.
    ddp::test::share(store, "result" + std::to_string(r), flat(per_rank[static_cast<std::size_t>(r)]));
    if (r != 0) return;
    per_rank[1] = unflat(ddp::test::fetch<double>(store, "result1"), per_rank[0]);

    // Float GPU vs float CPU through 20 BatchNorms: the bound of test_cuda_resnet.cu's whole networks.
    constexpr double kTol = 1e-3;
    double worst = 0;
    auto compare = [&](const std::string& what, const Vec& ours, const Vec& theirs) {
      const double e = rel_error(ours, theirs);
      worst = std::max(worst, e);
      INFO(what << ": relative error " << e);
      CHECK(e <= kTol);
    };
    Vec logits, dx;
    std::map<std::string, Vec> grad;
    for (const Result& pr : per_rank) {
      logits.insert(logits.end(), pr.logits.begin(), pr.logits.end());
      for (double v : pr.dx) dx.push_back(v / 2);
      for (const auto& [name, gr] : pr.grad) {
        Vec& acc = grad[name];
        acc.resize(gr.size(), 0.0);
        for (std::size_t i = 0; i < gr.size(); ++i) acc[i] += gr[i] / 2;
      }
      for (std::size_t i = 0; i < ref.stats.size(); ++i) compare("running stats " + std::to_string(i), pr.stats[i], ref.stats[i]);
    }
    compare("logits", logits, ref.logits);
    compare("input gradient", dx, ref.dx);
    for (const auto& [name, gr] : ref.grad) compare("grad " + name, grad[name], gr);
    MESSAGE("worst relative error GPU (2 ranks, synchronised) vs CPU (whole batch): ", worst);
  }
}
