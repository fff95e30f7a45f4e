// tcp ("gloo") with CUDA tensors, two ranks on one GPU (as processes): the collectives on a non-default stream,
// stream-ordered (a device copy enqueued after the op sees its result), pinned blocks reused; and a DDP step
// whose gradients equal the mean of the ranks' CPU gradients. The factory's device check needs no GPU.
// SPDX-License-Identifier: MIT
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

#include <ddp/comm/staging/cuda/staging_device.hpp>
#include <ddp/comm/factory.hpp>
#include <ddp/kernels/cuda/kernels.cuh>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/parallel/cuda/transport.cuh>
#include <ddp/parallel/ddp.hpp>
#include <ddp/store/hash_store.hpp>
#include <ddp/store/file_store.hpp>
#include <ddp/tensor/cuda/copy.hpp>
#include <ddp/tensor/random.hpp>

#include "support/gpu.hpp"
#include "support/rank_processes.hpp"

namespace {

using ddp::Cpu;
using ddp::Cuda;
using ddp::Exec;
using ddp::Tensor;

// The cases with two ranks on the GPU run them as processes (support/rank_processes.hpp says why not threads).
constexpr const char* kCollectives =
    "gloo, world 2 on one GPU: all_reduce and broadcast on a stream, stream-ordered; pinned blocks reused";
constexpr const char* kDdpStep = "gloo, world 2 on one GPU: a DDP step's gradients equal the mean of the ranks' CPU "
                                 "gradients";
const ddp::nn::ResNetOptions kNet{.arch = "resnet18", .num_classes = 10, .seed = 3, .width = 16};

std::unique_ptr<ddp::comm::Communicator> make_gloo(int rank, int n, ddp::store::Store& store) {
  return ddp::comm::make_communicator("gloo", {.rank = rank, .world_size = n, .master_addr = "127.0.0.1"}, store,
                                      {.timeout = std::chrono::seconds(60), .cuda_device = 0});
}

Tensor<float, Cuda> device_of(const std::vector<float>& v, const Exec<Cuda>& e) {
  return ddp::to<Cuda>(ddp::TensorView<const float, Cpu>(v.data(), ddp::Shape{static_cast<std::int64_t>(v.size())}), e);
}
std::vector<float> host_of(const Tensor<float, Cuda>& t, const Exec<Cuda>& e) {
  Tensor<float, Cpu> h = ddp::to<Cpu>(t.cview(), e);  // waits for e's stream
  return std::vector<float>(h.data(), h.data() + h.numel());
}

// A batch of rank r: images (4, 32, 32, 3) and labels, on the host.
struct HostBatch {
  Tensor<float, Cpu> x;
  Tensor<std::int64_t, Cpu> y;
};
HostBatch batch_of(int rank) {
  HostBatch b{Tensor<float, Cpu>({4, 32, 32, 3}), Tensor<std::int64_t, Cpu>({4})};
  ddp::Generator(100 + static_cast<std::uint64_t>(rank)).fill_normal(b.x.view(), 0.0, 1.0);
  for (std::int64_t i = 0; i < 4; ++i) b.y.data()[i] = (i * 3 + rank) % 10;
  return b;
}

// One forward/backward of the plain model on the CPU: rank r's local gradients.
std::vector<Tensor<float, Cpu>> cpu_grads(int rank) {
  Exec<Cpu> e;
  ddp::nn::ResNet<float, Cpu> net(kNet);
  HostBatch b = batch_of(rank);
  ddp::nn::CrossEntropyLoss<float, Cpu> ce;
  net.zero_grad();
  auto logits = net.forward(e, b.x.cview());
  ce.forward(e, logits.cview(), b.y.cview());
  net.backward(e, ce.backward(e).cview());
  std::vector<Tensor<float, Cpu>> out;
  for (auto* p : net.parameters()) out.push_back(ddp::to<Cpu>(p->grad().cview(), e));
  return out;
}

// Largest |got - ref| - rtol (|ref| + max|ref|); <= 0: within tolerance (tests/unit/nn/test_cuda_resnet.cu).
double excess(const Tensor<float, Cpu>& ref, const Tensor<float, Cpu>& got, double rtol) {
  double scale = 0.0, worst = -1e300;
  for (std::int64_t i = 0; i < ref.numel(); ++i) scale = std::fmax(scale, std::fabs(double(ref.data()[i])));
  for (std::int64_t i = 0; i < ref.numel(); ++i) {
    const double r = ref.data()[i], g = got.data()[i];
    worst = std::fmax(worst, std::fabs(r - g) - rtol * (std::fabs(r) + scale));
  }
  return worst;
}

}  // namespace

TEST_SUITE("gpu_staged") {
  TEST_CASE("factory: CUDA tensors on a device that is not visible are a ConfigError before connecting") {
    ddp::store::HashStore store(std::chrono::seconds(5));
    CHECK_THROWS_WITH_AS(ddp::comm::make_communicator("gloo", {.rank = 0, .world_size = 1}, store, {.cuda_device = 4096}),
                         doctest::Contains("--backend gloo with CUDA tensors needs CUDA device 4096, but"),
                         ddp::ConfigError);
  }

  TEST_CASE(kCollectives) {
    if (ddp::test::skip_without_gpu()) return;
    const auto me = ddp::test::as_rank_processes(kCollectives, 2);  // the parent runs the ranks
    if (!me) return;
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    ddp::store::FileStore store(me->store_path, std::chrono::seconds(60));
    const int r = me->rank;
    {
      auto comm = make_gloo(r, 2, store);
      CHECK(comm->memory() == ddp::comm::MemoryKind::Cuda);
      CHECK(comm->backend() == "tcp");
      ddp::Stream stream;  // non-blocking order must come from the stream, not the legacy default stream
      Exec<Cuda> e = stream.exec();
      const cudaStream_t s = ddp::cuda_stream(e);
      const std::size_t n = (1u << 20) + 3;  // 4 MiB + 12 B
      std::vector<float> h(n);
      for (std::size_t i = 0; i < n; ++i) h[i] = static_cast<float>((i % 7) * static_cast<std::size_t>(r + 1));
      Tensor<float, Cuda> a = device_of(h, e), after(ddp::Shape{static_cast<std::int64_t>(n)});
      auto* staged = dynamic_cast<ddp::comm::CudaStagedCommunicator*>(comm.get());
      REQUIRE(staged != nullptr);
      std::int64_t warm_allocs = 0;
      for (int step = 0; step < 4; ++step) {
        a = device_of(h, e);
        ddp::comm::Work w = comm->all_reduce(a.view(), {.op = ddp::comm::ReduceOp::Sum, .stream = s});
        // Enqueued right after the call, no host wait: must see the sum.
        REQUIRE(cudaMemcpyAsync(after.data(), a.data(), n * sizeof(float), cudaMemcpyDeviceToDevice, s) == cudaSuccess);
        const std::vector<float> got = host_of(after, e);
        w.wait();
        for (std::size_t i = 0; i < n; i += 4097) REQUIRE(got[i] == static_cast<float>((i % 7) * 3));
        if (step == 0) warm_allocs = staged->stats().pinned_allocs;
      }
      CHECK(staged->stats().pinned_allocs == warm_allocs);

      std::vector<float> mine(33, static_cast<float>(r == 1 ? 7 : -1));
      Tensor<float, Cuda> b = device_of(mine, e);
      comm->broadcast(b.view(), {.root = 1, .stream = s});
      CHECK(host_of(b, e) == std::vector<float>(33, 7.0f));
      comm->barrier({.stream = s}).wait();
    }
  }

  // Two processes, as `ddprun --nproc-per-node 2 ... --backend gloo --device cuda` runs them, DDP with several
  // staged ops in flight per rank.
  TEST_CASE(kDdpStep) {
    if (ddp::test::skip_without_gpu()) return;
    const auto me = ddp::test::as_rank_processes(kDdpStep, 2);  // the parent runs the ranks
    if (!me) return;
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    const int r = me->rank;
    std::vector<std::vector<Tensor<float, Cpu>>> cpu(2);
    for (int k = 0; k < 2; ++k) cpu[static_cast<std::size_t>(k)] = cpu_grads(k);
    ddp::store::FileStore store(me->store_path, std::chrono::seconds(60));
    auto comm = make_gloo(r, 2, store);
    ddp::Stream stream;
    Exec<Cuda> e = stream.exec(ddp::Precision::Fp32);  // exact fp32 kernels: the CPU's 1e-3 bound holds
    ddp::nn::ResNet<float, Cuda> net(kNet);
    ddp::parallel::DistributedDataParallel<float, Cuda> model(
        net, *comm, {.bucket_cap_bytes = 256 << 10, .first_bucket_cap_bytes = 64 << 10});
    ddp::nn::CrossEntropyLoss<float, Cuda> ce;
    HostBatch hb = batch_of(r);
    Tensor<float, Cuda> x = ddp::to<Cuda>(hb.x.cview(), e);
    Tensor<std::int64_t, Cuda> y = ddp::to<Cuda>(hb.y.cview(), e);
    for (int step = 0; step < 2; ++step) {  // step 2 runs on the rebuilt buckets
      CAPTURE(step);
      net.zero_grad();
      auto logits = model.forward(e, x.cview());
      ce.forward(e, logits.cview(), y.cview());
      model.backward(e, ce.backward(e).cview());
      auto params = net.parameters();
      for (std::size_t i = 0; i < params.size(); ++i) {
        CAPTURE(params[i]->name());
        Tensor<float, Cpu> mean(cpu[0][i].shape());
        for (std::int64_t j = 0; j < mean.numel(); ++j)
          mean.data()[j] = 0.5f * (cpu[0][i].data()[j] + cpu[1][i].data()[j]);
        CHECK(excess(mean, ddp::to<Cpu>(params[i]->grad().cview(), e), 1e-3) <= 0.0);
      }
    }
  }
}
