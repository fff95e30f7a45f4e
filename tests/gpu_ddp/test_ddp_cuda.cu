// DistributedDataParallel<float, Cuda> over NCCL: the averaged gradients, the overlap bookkeeping, and the
// stream ordering (the optimizer step on the compute stream sees the all-reduced gradients, no host wait).
// SPDX-License-Identifier: MIT
//
// World size 1 (one GPU): DDP's gradients equal the plain model's bit for bit (NCCL's average over one
// rank is a copy), every bucket is launched, the unused-parameter error names the parameter, and a step
// of SGD issued right after backward on the same stream matches the plain model's. With two or more GPUs
// the same job runs with two ranks (one thread and one device each, different data): every rank ends with
// the same gradients, the mean of the ranks' local gradients. Skips (exit 77) without a GPU.
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ddp/comm/factory.hpp>
#include <ddp/comm/nccl/nccl_communicator.hpp>
#include <ddp/kernels/cuda/kernels.cuh>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/parallel/cuda/transport.cuh>
#include <ddp/parallel/ddp.hpp>
#include <ddp/store/hash_store.hpp>

// Every member of the CUDA DDP and its bucket schedule compiles under nvcc, including the paths no test here
// drives yet (join(), shadow_step(), static_graph, gradient_as_bucket_view).
template class ddp::parallel::DistributedDataParallel<float, ddp::Cuda>;
template class ddp::parallel::BucketSchedule<float, ddp::Cuda, ddp::parallel::Transport<float, ddp::Cuda>>;
#include <ddp/tensor/cuda/copy.hpp>
#include <ddp/tensor/random.hpp>

#include "support/gpu.hpp"

namespace {

using ddp::Cpu;
using ddp::Cuda;
using ddp::Exec;
using ddp::Tensor;
using Net = ddp::nn::ResNet<float, Cuda>;

const ddp::nn::ResNetOptions kNet{.arch = "resnet18", .num_classes = 10, .seed = 3, .width = 16};

std::unique_ptr<ddp::comm::Communicator> make_nccl(int rank, int n, ddp::store::Store& store) {
  return ddp::comm::make_communicator("nccl",
                                      {.rank = rank, .world_size = n, .local_rank = rank, .master_addr = "127.0.0.1"},
                                      store, {.timeout = std::chrono::seconds(30)});
}

// A batch of rank r: images (4, 32, 32, 3) and labels, on the device.
struct Batch {
  Tensor<float, Cuda> x;
  Tensor<std::int64_t, Cuda> y;
};
Batch batch_of(int rank, const Exec<Cuda>& e) {
  Tensor<float, Cpu> x({4, 32, 32, 3});
  ddp::Generator(100 + static_cast<std::uint64_t>(rank)).fill_normal(x.view(), 0.0, 1.0);
  Tensor<std::int64_t, Cpu> y({4});
  for (std::int64_t i = 0; i < 4; ++i) y.data()[i] = (i * 3 + rank) % 10;
  return {ddp::to<Cuda>(x.cview(), e), ddp::to<Cuda>(y.cview(), e)};
}

// Each parameter's gradient, on the host.
std::vector<Tensor<float, Cpu>> grads_of(Net& net, const Exec<Cuda>& e) {
  std::vector<Tensor<float, Cpu>> out;
  for (auto* p : net.parameters()) out.push_back(ddp::to<Cpu>(p->grad().cview(), e));
  return out;
}

// One forward/backward of the plain (non-DDP) model: the local gradients.
std::vector<Tensor<float, Cpu>> local_grads(int rank, ddp::Stream& stream) {
  Exec<Cuda> e = stream.exec(ddp::Precision::Fp32);
  Net net(kNet);
  Batch b = batch_of(rank, e);
  ddp::nn::CrossEntropyLoss<float, Cuda> ce;
  net.zero_grad();
  auto logits = net.forward(e, b.x.cview());
  ce.forward(e, logits.cview(), b.y.cview());
  net.backward(e, ce.backward(e).cview());
  return grads_of(net, e);
}

double max_abs_diff(const Tensor<float, Cpu>& a, const Tensor<float, Cpu>& b) {
  double m = 0.0;
  for (std::int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(double(a.data()[i]) - double(b.data()[i])));
  return m;
}

}  // namespace

TEST_SUITE("gpu_ddp") {
  TEST_CASE("world size 1: DDP gradients equal the plain model's; every bucket launched; SGD sees them") {
    if (ddp::test::skip_without_gpu()) return;
    ddp::store::HashStore store(std::chrono::seconds(30));
    auto comm = make_nccl(0, 1, store);
    ddp::Stream stream;  // a non-default compute stream: ordering must come from events, not the legacy stream
    Exec<Cuda> e = stream.exec(ddp::Precision::Fp32);
    const auto want = local_grads(0, stream);

    Net net(kNet);
    ddp::parallel::DistributedDataParallel<float, Cuda> model(
        net, *comm, {.bucket_cap_bytes = 256 << 10, .first_bucket_cap_bytes = 64 << 10});
    REQUIRE(model.buckets().size() > 2);
    ddp::nn::CrossEntropyLoss<float, Cuda> ce;
    Batch b = batch_of(0, e);
    for (int step = 0; step < 2; ++step) {  // step 2 runs on the rebuilt buckets
      INFO("step ", step);
      net.zero_grad();
      auto logits = model.forward(e, b.x.cview());
      ce.forward(e, logits.cview(), b.y.cview());
      model.backward(e, ce.backward(e).cview());
      CHECK(model.last_trace().buckets.size() == model.buckets().size());
      const auto got = grads_of(net, e);
      auto params = net.parameters();
      for (std::size_t i = 0; i < want.size(); ++i) {
        INFO(params[i]->name());
        CHECK(max_abs_diff(want[i], got[i]) == 0.0);
      }
    }

    // The optimizer step right after backward, on the same stream, without any host synchronisation.
    Net plain(kNet);
    ddp::optim::SGD<float, Cuda> opt_plain(plain, {.lr = 0.1, .momentum = 0.9});
    ddp::optim::SGD<float, Cuda> opt(net, {.lr = 0.1, .momentum = 0.9});
    {
      plain.zero_grad();
      auto logits = plain.forward(e, b.x.cview());
      ce.forward(e, logits.cview(), b.y.cview());
      plain.backward(e, ce.backward(e).cview());
      opt_plain.step(e);
    }
    Net fresh(kNet);
    ddp::parallel::DistributedDataParallel<float, Cuda> model2(fresh, *comm);
    ddp::optim::SGD<float, Cuda> opt2(fresh, {.lr = 0.1, .momentum = 0.9});
    fresh.zero_grad();
    auto logits = model2.forward(e, b.x.cview());
    ce.forward(e, logits.cview(), b.y.cview());
    model2.backward(e, ce.backward(e).cview());
    opt2.step(e);
    auto pp = plain.parameters(), pf = fresh.parameters();
    for (std::size_t i = 0; i < pp.size(); ++i) {
      INFO(pp[i]->name());
      CHECK(max_abs_diff(ddp::to<Cpu>(pp[i]->value().cview(), e), ddp::to<Cpu>(pf[i]->value().cview(), e)) == 0.0);
    }
  }

  TEST_CASE("world size 1: a parameter without a gradient is named; find_unused_parameters contributes zeros") {
    if (ddp::test::skip_without_gpu()) return;
    ddp::store::HashStore store(std::chrono::seconds(30));
    auto comm = make_nccl(0, 1, store);
    ddp::Stream stream;
    Exec<Cuda> e = stream.exec();
    Net net(kNet);
    ddp::parallel::DistributedDataParallel<float, Cuda> model(net, *comm);
    Batch b = batch_of(0, e);
    model.forward(e, b.x.cview());  // a forward whose backward never runs: no gradient arrives
    CHECK_THROWS_WITH_AS(model.finish(), doctest::Contains("received no gradient in step 0"), ddp::Error);

    Net net2(kNet);
    ddp::parallel::DistributedDataParallel<float, Cuda> model2(net2, *comm, {.find_unused_parameters = true});
    model2.forward(e, b.x.cview());
    model2.finish();  // every slot zero; must not throw
    for (auto* p : net2.parameters()) {
      const auto g = ddp::to<Cpu>(p->grad().cview(), e);
      INFO(p->name());
      CHECK(*std::max_element(g.data(), g.data() + g.numel()) == 0.0f);
    }
  }

  TEST_CASE("two ranks on two GPUs: every rank holds the mean of the local gradients") {
    if (ddp::test::skip_without_gpu()) return;
    int devices = 0;
    REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
    if (devices < 2) {
      MESSAGE("one GPU: NCCL allows one rank per device, so the two-rank case needs two (not run)");
      return;
    }
    ddp::store::HashStore store(std::chrono::seconds(60));
    std::vector<std::vector<Tensor<float, Cpu>>> local(2), reduced(2);
    std::vector<std::exception_ptr> errors(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        try {
          REQUIRE(cudaSetDevice(r) == cudaSuccess);
          ddp::Stream stream;
          Exec<Cuda> e = stream.exec(ddp::Precision::Fp32);
          local[r] = local_grads(r, stream);
          auto comm = make_nccl(r, 2, store);
          Net net(kNet);
          ddp::parallel::DistributedDataParallel<float, Cuda> model(net, *comm);
          ddp::nn::CrossEntropyLoss<float, Cuda> ce;
          Batch b = batch_of(r, e);
          net.zero_grad();
          auto logits = model.forward(e, b.x.cview());
          ce.forward(e, logits.cview(), b.y.cview());
          model.backward(e, ce.backward(e).cview());
          reduced[r] = grads_of(net, e);
        } catch (...) {
          errors[r] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    for (auto& ep : errors)
      if (ep) std::rethrow_exception(ep);
    for (std::size_t i = 0; i < local[0].size(); ++i) {
      Tensor<float, Cpu> mean(local[0][i].shape());
      for (std::int64_t j = 0; j < mean.numel(); ++j)
        mean.data()[j] = 0.5f * (local[0][i].data()[j] + local[1][i].data()[j]);
      CHECK(max_abs_diff(reduced[0][i], reduced[1][i]) == 0.0);
      CHECK(max_abs_diff(mean, reduced[0][i]) <=
            1e-6 * (1.0 + max_abs_diff(mean, Tensor<float, Cpu>::full(mean.shape(), 0.f))));
    }
  }
}
