// Shutdown in the order programs use, world size 1 on one GPU: DistributedDataParallel<float, Cuda> (and the
// streams it made) is destroyed after a step; then the communicator still runs a collective and a barrier,
// and its destructor (a bounded barrier) runs last. Before the stream travelled with each call (docs/
// docs/decisions/0016) the nccl backend kept pointing at the destroyed reducer stream here (issue 13, item 2).
// For nccl (when built) and for tcp staged through pinned memory. Skips (exit 77) without a GPU.
// SPDX-License-Identifier: MIT
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <ddp/comm/factory.hpp>
#include <ddp/config.hpp>
#include <ddp/kernels/cuda/kernels.cuh>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/parallel/cuda/transport.cuh>
#include <ddp/parallel/ddp.hpp>
#include <ddp/store/hash_store.hpp>
#include <ddp/tensor/cuda/copy.hpp>
#include <ddp/tensor/random.hpp>

#include "support/gpu.hpp"

namespace {

using ddp::Cpu;
using ddp::Cuda;
using ddp::Exec;
using ddp::Tensor;

void step_then_shutdown(const std::string& backend) {
  CAPTURE(backend);
  ddp::store::HashStore store(std::chrono::seconds(30));
  auto comm = ddp::comm::make_communicator(backend, {.rank = 0, .world_size = 1, .master_addr = "127.0.0.1"}, store,
                                           {.timeout = std::chrono::seconds(30), .cuda_device = 0});
  {
    auto stream = std::make_unique<ddp::Stream>();  // the compute stream, destroyed with the model
    Exec<Cuda> e = stream->exec(ddp::Precision::Fp32);
    ddp::nn::ResNet<float, Cuda> net({.arch = "resnet18", .num_classes = 10, .seed = 3, .width = 8});
    ddp::parallel::DistributedDataParallel<float, Cuda> model(net, *comm);
    Tensor<float, Cpu> hx({2, 32, 32, 3});
    ddp::Generator(7).fill_normal(hx.view(), 0.0, 1.0);
    Tensor<std::int64_t, Cpu> hy({2});
    hy.data()[0] = 1;
    hy.data()[1] = 4;
    Tensor<float, Cuda> x = ddp::to<Cuda>(hx.cview(), e);
    Tensor<std::int64_t, Cuda> y = ddp::to<Cuda>(hy.cview(), e);
    ddp::nn::CrossEntropyLoss<float, Cuda> ce;
    net.zero_grad();
    auto logits = model.forward(e, x.cview());
    ce.forward(e, logits.cview(), y.cview());
    model.backward(e, ce.backward(e).cview());
    ddp::synchronize(e);
  }  // DDP, its transport's comm stream and the compute stream are gone
  std::vector<float> h(1000, 2.0f);
  Exec<Cuda> legacy{};  // the legacy default stream
  Tensor<float, Cuda> d = ddp::to<Cuda>(ddp::TensorView<const float, Cpu>(h.data(), ddp::Shape{1000}), legacy);
  comm->all_reduce(d.view(), {.op = ddp::comm::ReduceOp::Avg}).wait();  // .stream null: legacy
  comm->barrier().wait();
  const Tensor<float, Cpu> back = ddp::to<Cpu>(d.cview(), legacy);
  CHECK(back.data()[999] == 2.0f);
  comm.reset();  // the destructor's barrier (world 1: none for nccl; the staged one drains its worker)
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(cudaGetLastError() == cudaSuccess);
}

}  // namespace

TEST_SUITE("gpu_staged") {
  TEST_CASE("shutdown: DDP destroyed, then a collective, a barrier and the communicator's destruction") {
    if (ddp::test::skip_without_gpu()) return;
    if (ddp::BuildConfig::with_nccl) step_then_shutdown("nccl");
    step_then_shutdown("gloo");
  }
}
