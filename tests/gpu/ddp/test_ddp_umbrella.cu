// <ddp/ddp.hpp> alone gives a working DistributedDataParallel<float, Cuda> under nvcc (the CUDA transport comes
// with the umbrella), and the train layer's device-state helpers work for a GPU model.
// SPDX-License-Identifier: MIT
//
// World size 1 over NCCL (one GPU): a DDP step on Linear(20, 3) with two buckets equals the plain model's step
// bit for bit (the average over one rank is a copy); state_on<Cpu> mirrors parameters and momentum buffers on
// the host and push() writes them back; read_and_broadcast staged through the GPU finds no file. The
// static_asserts need no device; the test cases skip (exit 77) without one.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <ddp/ddp.hpp>

#include "support/gpu.hpp"

namespace {

using ddp::Cpu;
using ddp::Cuda;
using ddp::Exec;
using ddp::Tensor;

static_assert(sizeof(ddp::parallel::Transport<float, Cuda>) > 0, "the umbrella brings the CUDA transport under nvcc");
static_assert(ddp::parallel::BucketTransport<ddp::parallel::Transport<float, Cuda>, Cuda>);
static_assert(!ddp::train::StateOn<ddp::nn::Linear<float, Cpu>, ddp::nn::Linear<float, Cuda>>::is_view);
static_assert(ddp::train::StateOn<ddp::nn::Linear<float, Cuda>, ddp::nn::Linear<float, Cuda>>::is_view);

const ddp::nn::LinearOptions kLinear{.in_features = 20, .out_features = 3};
const ddp::optim::SgdOptions kSgd{.lr = 0.1, .momentum = 0.9};

// Linear(20, 3) with torch's initialisation from `seed`.
struct Net {
  ddp::nn::Linear<float, Cuda> linear{kLinear};
  explicit Net(std::uint64_t seed) {
    ddp::Generator g(seed);
    linear.reset_parameters(g);
  }
};

// One forward + MSE + backward of `model` (the Linear or its DDP wrapper) on seeded data.
template <class M>
void pass(M& model, Exec<Cuda>& e) {
  Tensor<float, Cpu> x({4, 20}), t({4, 3});
  ddp::Generator(7).fill_normal(x.view(), 0.0, 1.0);
  ddp::Generator(8).fill_normal(t.view(), 0.0, 1.0);
  const auto xd = ddp::train::on_device<Cuda>(x.cview(), e);
  const auto td = ddp::train::on_device<Cuda>(t.cview(), e);
  ddp::nn::MSELoss<float, Cuda> mse;
  auto y = model.forward(e, xd.cview());
  mse.forward(e, y.cview(), td.cview());
  model.backward(e, mse.backward(e).cview());
}

std::vector<float> host(const Tensor<float, Cuda>& t, Exec<Cuda>& e) {
  const auto h = ddp::to<Cpu>(t.cview(), e);
  return std::vector<float>(h.data(), h.data() + h.numel());
}
std::vector<float> host(const Tensor<float, Cpu>& t) { return std::vector<float>(t.data(), t.data() + t.numel()); }

}  // namespace

TEST_SUITE("gpu_ddp") {
  TEST_CASE(
      "umbrella only: DistributedDataParallel<float, Cuda> steps like the plain model; state_on<Cpu> mirrors it") {
    if (ddp::test::skip_without_gpu()) return;
    ddp::store::HashStore store(std::chrono::seconds(30));
    auto comm =
        ddp::comm::make_communicator("nccl", {.rank = 0, .world_size = 1, .local_rank = 0, .master_addr = "127.0.0.1"},
                                     store, {.timeout = std::chrono::seconds(30)});
    ddp::Stream stream;
    Exec<Cuda> e = stream.exec(ddp::Precision::Fp32);

    Net plain(1), net(1);
    ddp::optim::SGD<float, Cuda> plain_opt(plain.linear, kSgd), opt(net.linear, kSgd);
    ddp::parallel::DistributedDataParallel<float, Cuda> model(net.linear, *comm,
                                                              {.bucket_cap_bytes = 64, .first_bucket_cap_bytes = 8});
    CHECK(model.buckets().size() == 2);  // {bias (12 bytes)}, {weight (240 bytes)}
    for (int step = 0; step < 2; ++step) {
      plain_opt.zero_grad();
      pass(plain.linear, e);
      plain_opt.step(e);
      opt.zero_grad();
      pass(model, e);
      opt.step(e);
    }
    auto pp = plain.linear.parameters(), pn = net.linear.parameters();
    for (std::size_t i = 0; i < pp.size(); ++i) {
      INFO(pp[i]->name());
      CHECK(host(pp[i]->value(), e) == host(pn[i]->value(), e));
    }

    auto mirror = ddp::train::state_on<Cpu>(e, net.linear, opt, kLinear);
    auto ph = mirror.model().parameters();
    for (std::size_t i = 0; i < pn.size(); ++i) {
      INFO(pn[i]->name());
      CHECK(host(ph[i]->value()) == host(pn[i]->value(), e));
      REQUIRE(mirror.optimizer().momentum_buffer(i) != nullptr);
      CHECK(host(*mirror.optimizer().momentum_buffer(i)) == host(*opt.momentum_buffer(i), e));
    }
    CHECK(mirror.optimizer().steps() == 2);
    ph[0]->value().data()[0] = 42.0f;
    mirror.push(e);
    CHECK(host(pn[0]->value(), e)[0] == 42.0f);

    CHECK(ddp::train::read_and_broadcast(*comm, "no-such-snapshot.safetensors", e).empty());
  }
}
