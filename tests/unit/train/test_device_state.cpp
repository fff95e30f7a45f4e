// train: device_state.hpp on the CPU: state_on<Cpu> of a CPU model is a view, copy_state mirrors parameters,
// buffers, momentum buffers, learning rate and steps, on_device<Cpu> of a host tensor is the tensor itself.
// (The GPU directions run in tests/gpu/ddp/test_ddp_umbrella.cu.)
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include <ddp/nn/batchnorm2d.hpp>
#include <ddp/nn/linear.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/tensor/random.hpp>
#include <ddp/train/device_state.hpp>

using namespace ddp;

namespace {

const nn::ResNetOptions kNet{.arch = "resnet18", .num_classes = 5, .seed = 1, .width = 4};
const optim::SgdOptions kSgd{.lr = 0.1, .momentum = 0.9};

std::vector<float> values(const Tensor<float, Cpu>& t) { return std::vector<float>(t.data(), t.data() + t.numel()); }

}  // namespace

TEST_SUITE("train") {
  TEST_CASE("state_on<Cpu> of a CPU model is the model and optimizer themselves (no copy)") {
    Exec<Cpu> exec;
    nn::ResNet<float, Cpu> net(kNet);
    optim::SGD<float, Cpu> opt(net.parameters(), kSgd);
    auto host = train::state_on<Cpu>(exec, net, opt, kNet);
    static_assert(decltype(host)::is_view);
    CHECK(&host.model() == &net);
    CHECK(&host.optimizer() == &opt);
    host.pull(exec);  // nothing to copy
    host.push(exec);

    Tensor<float, Cpu> x({2, 3});
    const auto same = train::on_device<Cpu>(x.cview(), exec);
    CHECK(same.cview().data() == x.data());
    CHECK(same.cview().shape() == x.shape());
  }

  TEST_CASE("copy_state: parameters, buffers, momentum buffers, learning rate and steps; mismatches are errors") {
    Exec<Cpu> exec;
    nn::ResNet<float, Cpu> src(kNet), dst({.arch = "resnet18", .num_classes = 5, .seed = 2, .width = 4});
    optim::SGD<float, Cpu> sopt(src.parameters(), kSgd), dopt(dst.parameters(), {.lr = 0.5, .momentum = 0.9});
    auto sp = src.parameters(), dp = dst.parameters();
    REQUIRE(values(sp[0]->value()) != values(dp[0]->value()));
    Generator(3).fill_normal(sopt.set_momentum_buffer(1).view(), 0.0, 1.0);
    Generator(4).fill_normal(dopt.set_momentum_buffer(2).view(), 0.0, 1.0);  // src has none there: cleared
    sopt.set_steps(7);
    src.find_buffer("bn1.running_mean")->real().data()[0] = 3.5f;
    src.find_buffer("bn1.num_batches_tracked")->count().data()[0] = 11;

    train::copy_state(exec, src, sopt, dst, dopt);
    for (std::size_t i = 0; i < sp.size(); ++i) {
      INFO(sp[i]->name());
      CHECK(values(sp[i]->value()) == values(dp[i]->value()));
    }
    CHECK(dst.find_buffer("bn1.running_mean")->real().data()[0] == 3.5f);
    CHECK(dst.find_buffer("bn1.num_batches_tracked")->count().data()[0] == 11);
    REQUIRE(dopt.momentum_buffer(1) != nullptr);
    CHECK(values(*dopt.momentum_buffer(1)) == values(*sopt.momentum_buffer(1)));
    CHECK(dopt.momentum_buffer(2) == nullptr);
    CHECK(dopt.lr() == 0.1);
    CHECK(dopt.steps() == 7);

    nn::Linear<float, Cpu> other({.in_features = 3, .out_features = 2});
    optim::SGD<float, Cpu> oopt(other.parameters(), kSgd);
    CHECK_THROWS_WITH_AS(train::copy_state(exec, src, sopt, other, oopt),
                         "ddp: copy_state: the source model has 62 parameters and 60 buffers, the destination 2 and 0; "
                         "both models must be built with the same options",
                         ValueError);
  }
}
