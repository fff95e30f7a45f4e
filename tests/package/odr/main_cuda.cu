// ODR test, first translation unit: uses the library and calls into the second one.
// SPDX-License-Identifier: MIT
//
// Also the one fully compiled and linked nvcc TU that CI builds without a GPU (its .cu doctests go to PTX only,
// so their host code is never seen by the host compiler): gpt_cuda_step() instantiates GPT<float, Cuda>'s forward
// and backward, DistributedDataParallel<float, Cuda>'s forward with token ids, clip_grad_norm and AdamW<float,
// Cuda>. It runs only when a GPU is present (a world-1 step over the tcp backend; its loss is not checked here,
// tests/unit/nn/test_cuda_gpt.cu compares the GPU with the CPU).
#include <ddp/ddp.hpp>

#include <iostream>

int second_tu_uses_ddp();

namespace {

// One minGPT training step on GPU 0, world size 1; returns the loss.
double gpt_cuda_step() {
  using ddp::Cpu;
  using ddp::Cuda;
  ddp::store::HashStore store;
  auto comm = ddp::comm::make_communicator("tcp", {.rank = 0, .world_size = 1, .master_addr = "127.0.0.1"}, store,
                                           {.cuda_device = 0});
  ddp::Stream stream;
  ddp::Exec<Cuda> e = stream.exec(ddp::Precision::Fp32);
  ddp::nn::GPT<float, Cuda> net({.vocab_size = 5, .block_size = 4, .n_layer = 1, .n_head = 2, .n_embd = 8});
  ddp::parallel::DistributedDataParallel<float, Cuda> model(net, *comm);
  ddp::optim::AdamW<float, Cuda> opt(net, {.lr = 1e-3});
  ddp::Tensor<std::int64_t, Cpu> ids({2, 4}), targets({8});
  for (std::int64_t i = 0; i < 8; ++i) {
    ids.data()[i] = i % 5;
    targets.data()[i] = (i + 1) % 5;
  }
  const auto gids = ddp::to<Cuda>(ids.cview(), e);
  const auto gtargets = ddp::to<Cuda>(targets.cview(), e);
  ddp::nn::CrossEntropyLoss<float, Cuda> ce;
  net.zero_grad();
  auto logits = model.forward(e, gids.cview());
  const double loss = ce.forward(e, logits.cview().reshape(ddp::Shape{8, 5}), gtargets.cview());
  auto dlogits = ce.backward(e);
  model.backward(e, dlogits.cview().reshape(ddp::Shape{2, 4, 5}));
  ddp::optim::clip_grad_norm(e, net.parameters(), 1.0);
  opt.step(e);
  ddp::synchronize(e);
  return loss;
}

}  // namespace

int main() {
  ddp::store::HashStore store;
  store.set("k", std::string_view("v"));
  if (ddp::cuda_device_count() > 0) std::cout << "gpt step on the GPU: loss " << gpt_cuda_step() << '\n';
  std::cout << "odr ok: " << ddp::version_string() << ' ' << second_tu_uses_ddp() + store.num_keys() << '\n';
  return 0;
}
