// ZeroRedundancyOptimizer on CUDA: two ranks as processes (support/rank_processes.hpp says why not threads) on
// device 0 over tcp ("gloo") staged through pinned memory (docs/decisions/0023, 0031), a resnet18 at width
// 4, SGD (momentum) and AdamW: the parameters equal a plain optimizer on the same device and gradients bit for
// bit after every step, and the state consolidated to rank 0 equals the plain optimizer's. Skips (exit 77)
// without a GPU.
// SPDX-License-Identifier: MIT
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include <ddp/comm/staging/cuda/staging_device.hpp>
#include <ddp/comm/factory.hpp>
#include <ddp/kernels/cuda/kernels.cuh>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/adamw.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/parallel/zero.hpp>
#include <ddp/store/file_store.hpp>
#include <ddp/store/prefix_store.hpp>
#include <ddp/tensor/cuda/copy.hpp>
#include <ddp/tensor/cuda/stream.hpp>

#include "support/gpu.hpp"
#include "support/rank_processes.hpp"

namespace {

using ddp::Cpu;
using ddp::Cuda;
using ddp::Exec;
using ddp::Tensor;

const ddp::nn::ResNetOptions kNet{.arch = "resnet18", .num_classes = 5, .seed = 11, .width = 4};

float pattern(std::uint64_t salt, std::size_t param, std::int64_t k) {
  const std::uint64_t h = (salt * 1000003u + param * 7919u + static_cast<std::uint64_t>(k) * 104729u) % 2001u;
  return static_cast<float>(static_cast<double>(h) / 1000.0 - 1.0);
}

// Every parameter value (or gradient, marked written) from pattern(salt, ...), uploaded on exec's stream.
void upload(ddp::nn::ResNet<float, Cuda>& m, Exec<Cuda>& exec, std::uint64_t salt, bool grads) {
  const auto params = m.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    Tensor<float, Cpu> host(params[i]->shape());
    for (std::int64_t k = 0; k < host.numel(); ++k) host.data()[k] = (grads ? 0.1f : 1.0f) * pattern(salt, i, k);
    ddp::copy(host.cview(), grads ? params[i]->grad().view() : params[i]->value().view(), exec);
    if (grads) params[i]->set_grad_written();
  }
  ddp::synchronize(exec);  // the host tensors die here
}

bool same(const Tensor<float, Cuda>& a, const Tensor<float, Cuda>& b, Exec<Cuda>& exec) {
  const auto ha = ddp::to<Cpu>(a.cview(), exec), hb = ddp::to<Cpu>(b.cview(), exec);
  return std::memcmp(ha.data(), hb.data(), ha.bytes()) == 0;
}

// Rank r of 2 (a process: support/rank_processes.hpp) against the plain optimizer, over `store`.
template <template <class, ddp::Device> class Opt, class Options>
void check_on_gpu(const Options& o, int r, ddp::store::Store& store) {
  {
    if (cudaSetDevice(0) != cudaSuccess) throw ddp::CudaError("cudaSetDevice(0) failed");
    auto comm = ddp::comm::make_communicator("gloo", {.rank = r, .world_size = 2, .master_addr = "127.0.0.1"}, store,
                                             {.timeout = std::chrono::seconds(60), .cuda_device = 0});
    ddp::Stream stream;
    Exec<Cuda> exec = stream.exec(ddp::Precision::Fp32);
    ddp::nn::ResNet<float, Cuda> zm(kNet), rm(kNet);
    upload(zm, exec, 1, false);
    upload(rm, exec, 1, false);
    ddp::parallel::ZeroRedundancyOptimizer<Opt<float, Cuda>> zero(zm, o, *comm);
    Opt<float, Cuda> ref(rm, o);
    for (std::uint64_t s = 0; s < 3; ++s) {
      upload(zm, exec, 100 + s, true);
      upload(rm, exec, 100 + s, true);
      zero.step(exec);
      ref.step(exec);
      const auto zp = zm.parameters(), rp = rm.parameters();
      for (std::size_t i = 0; i < zp.size(); ++i) REQUIRE(same(zp[i]->value(), rp[i]->value(), exec));
    }
    CHECK(zero.state_bytes() < ddp::parallel::optimizer_state_bytes(ref));
    auto full = zero.consolidate(exec, 0);
    CHECK((full != nullptr) == (r == 0));
    if (!full) return;
    for (std::size_t i = 0; i < full->parameters().size(); ++i)
      for (const ddp::optim::StateTensor& st : Opt<float, Cuda>::state_tensors) {
        auto* a = full->state(st.name, i);
        auto* b = ref.state(st.name, i);
        REQUIRE((a == nullptr) == (b == nullptr));
        if (a) CHECK(same(*a, *b, exec));
      }
  }
}

constexpr const char* kTwoRanks =
    "ZeroRedundancyOptimizer on CUDA (staged gloo, 2 rank processes on one GPU) equals plain SGD and AdamW";

}  // namespace

TEST_CASE(kTwoRanks) {
  if (ddp::test::skip_without_gpu()) return;
  const auto me = ddp::test::as_rank_processes(kTwoRanks, 2);  // the parent runs the ranks
  if (!me) return;
  ddp::store::FileStore store(me->store_path, std::chrono::seconds(120));
  ddp::store::PrefixStore sgd("sgd/", store), adamw("adamw/", store);  // one rendezvous each
  check_on_gpu<ddp::optim::SGD>(ddp::optim::SgdOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3}, me->rank,
                                sgd);
  check_on_gpu<ddp::optim::AdamW>(ddp::optim::AdamwOptions{.lr = 1e-2, .weight_decay = 0.05}, me->rank, adamw);
}
