// Layers built on the GPU initialise themselves at construction with the CPU layers' numbers, bit for bit: the
// default generator draws on the host and the values are uploaded (nn/init.hpp, docs/decisions/0064). Skips
// (exit 77) without a GPU.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/kernels/cuda/kernels.cuh>
#include <ddp/nn/batchnorm2d.hpp>
#include <ddp/nn/conv2d.hpp>
#include <ddp/nn/embedding.hpp>
#include <ddp/nn/layer_norm.hpp>
#include <ddp/nn/linear.hpp>
#include <ddp/nn/sequential.hpp>
#include <ddp/tensor/cuda/copy.hpp>
#include <ddp/tensor/random.hpp>

#include "support/gpu.hpp"

namespace test_cuda_init {

// Linear, Conv2d with bias, Embedding, BatchNorm2d and LayerNorm on device D, from the default generator.
template <ddp::Device D>
std::unique_ptr<ddp::nn::Sequential<float, D>> layers() {
  namespace nn = ddp::nn;
  auto m = std::make_unique<nn::Sequential<float, D>>();
  m->push_back(std::make_unique<nn::Linear<float, D>>(nn::LinearOptions{.in_features = 7, .out_features = 5}));
  m->push_back(std::make_unique<nn::Conv2d<float, D>>(
      nn::Conv2dOptions{.in_channels = 3, .out_channels = 4, .kernel_size = 3, .bias = true}));
  m->push_back(std::make_unique<nn::Embedding<float, D>>(nn::EmbeddingOptions{.num_embeddings = 6, .embedding_dim = 5}));
  m->push_back(std::make_unique<nn::BatchNorm2d<float, D>>(nn::BatchNorm2dOptions{.num_features = 4}));
  m->push_back(std::make_unique<nn::LayerNorm<float, D>>(nn::LayerNormOptions{.normalized_shape = 5}));
  return m;
}

}  // namespace test_cuda_init

TEST_SUITE("nn") {
  TEST_CASE("init on the GPU: every layer's default initialisation equals the CPU's, bit for bit") {
    if (ddp::test::skip_without_gpu()) return;
    ddp::manual_seed(21);
    auto cpu = test_cuda_init::layers<ddp::Cpu>();
    ddp::manual_seed(21);
    auto gpu = test_cuda_init::layers<ddp::Cuda>();
    auto pc = cpu->parameters();
    auto pg = gpu->parameters();
    REQUIRE(pc.size() == 9);
    REQUIRE(pg.size() == pc.size());
    const ddp::Exec<ddp::Cuda> exec{};
    for (std::size_t i = 0; i < pc.size(); ++i) {
      INFO(pc[i]->name());
      const auto host = ddp::to<ddp::Cpu>(pg[i]->value().cview(), exec);
      CHECK(std::memcmp(host.data(), pc[i]->value().data(), host.bytes()) == 0);
    }
  }
}
