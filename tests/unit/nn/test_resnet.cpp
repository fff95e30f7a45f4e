// ResNet structure: state_dict names against torchvision's, parameter counts, shapes, initialisation.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ddp/nn/resnet.hpp>

using namespace ddp;

namespace {

// The committed fixture: torchvision's state_dict keys per arch (see its first line for how it was made).
std::map<std::string, std::vector<std::string>> torchvision_keys() {
  const auto path = std::filesystem::path(__FILE__).parent_path() / "torchvision_resnet_keys.txt";
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "missing fixture ", path.string());
  std::map<std::string, std::vector<std::string>> out;
  std::string line, arch;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line.front() == '[') {
      arch = line.substr(1, line.size() - 2);
      continue;
    }
    out[arch].push_back(line);
  }
  return out;
}

}  // namespace

TEST_SUITE("nn") {
  TEST_CASE("state_dict keys equal torchvision's, in torchvision's order") {
    const auto ref = torchvision_keys();
    for (const char* arch : {"resnet18", "resnet50"}) {
      nn::ResNet<float, Cpu> m({.arch = arch, .num_classes = 10});
      INFO(arch);
      CHECK(m.state_dict_keys() == ref.at(arch));
    }
    CHECK(ref.at("resnet18").size() == 122);
    CHECK(ref.at("resnet50").size() == 320);
  }

  TEST_CASE("parameter counts equal torchvision's") {
    // torchvision: sum(p.numel() for p in resnetXX(num_classes=1000).parameters())
    const std::map<std::string, std::int64_t> counts = {{"resnet18", 11689512}, {"resnet34", 21797672},
                                                        {"resnet50", 25557032}, {"resnet101", 44549160},
                                                        {"resnet152", 60192808}};
    for (const auto& [arch, n] : counts) {
      nn::ResNet<float, Cpu> m({.arch = arch, .num_classes = 1000});
      CHECK_MESSAGE(m.num_parameters() == n, arch);
    }
  }

  TEST_CASE("names, layouts and shapes of individual tensors") {
    nn::ResNet<float, Cpu> m({.arch = "resnet50", .num_classes = 7});
    auto* w = m.find_parameter("layer2.0.downsample.0.weight");
    REQUIRE(w != nullptr);
    CHECK(w->layout() == nn::Layout::Krsc);
    CHECK(w->shape() == Shape{512, 1, 1, 256});        // KRSC
    CHECK(w->torch_shape() == Shape{512, 256, 1, 1});  // OIHW
    CHECK(m.find_parameter("conv1.weight")->shape() == Shape{64, 7, 7, 3});
    CHECK(m.find_parameter("fc.weight")->shape() == Shape{7, 2048});
    auto* nbt = m.find_buffer("layer4.2.bn3.num_batches_tracked");
    REQUIRE(nbt != nullptr);
    CHECK(nbt->is_integer());
    CHECK(nbt->shape() == Shape{});
    CHECK(m.find_buffer("bn1.running_var")->real().data()[0] == 1.0f);
    CHECK(m.find_parameter("no.such.weight") == nullptr);
    CHECK(m.layer(3).path() == "layer3");
  }

  TEST_CASE("forward shapes at 224x224 and 32x32") {
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> exec{.pool = &pool};
    nn::ResNet<float, Cpu> m({.arch = "resnet18", .num_classes = 5, .width = 8});
    for (std::int64_t hw : {32, 64}) {
      auto x = Tensor<float, Cpu>::full({2, hw, hw, 3}, 0.5f);
      auto y = m.forward(exec, x.cview());
      CHECK(y.shape() == Shape{2, 5});
      auto dx = m.backward(exec, Tensor<float, Cpu>::full({2, 5}, 0.1f).cview());
      CHECK(dx.empty());  // the image gets no gradient
    }
  }

  TEST_CASE("initialisation: kaiming fan_out std, BN 1/0, fc bounds, zero_init_residual, determinism") {
    nn::ResNet<float, Cpu> a({.arch = "resnet18", .num_classes = 10, .seed = 3});
    nn::ResNet<float, Cpu> b({.arch = "resnet18", .num_classes = 10, .seed = 3});
    nn::ResNet<float, Cpu> c({.arch = "resnet18", .num_classes = 10, .seed = 4});
    auto& w = a.find_parameter("layer3.1.conv2.weight")->value();  // (256, 3, 3, 256): fan_out = 2304
    double s2 = 0;
    for (std::int64_t i = 0; i < w.numel(); ++i) s2 += static_cast<double>(w.data()[i]) * w.data()[i];
    const double sd = std::sqrt(s2 / static_cast<double>(w.numel()));
    CHECK(sd == doctest::Approx(std::sqrt(2.0 / 2304)).epsilon(0.01));
    CHECK(a.find_parameter("layer1.0.bn1.weight")->value().data()[5] == 1.0f);
    CHECK(a.find_parameter("layer1.0.bn1.bias")->value().data()[5] == 0.0f);
    const auto& fc = a.find_parameter("fc.weight")->value();
    const float bound = 1.0f / std::sqrt(512.0f);
    bool in_bounds = true;
    for (std::int64_t i = 0; i < fc.numel(); ++i) in_bounds = in_bounds && std::abs(fc.data()[i]) <= bound;
    CHECK(in_bounds);
    CHECK(std::memcmp(w.data(), b.find_parameter("layer3.1.conv2.weight")->value().data(), w.bytes()) == 0);
    CHECK(std::memcmp(w.data(), c.find_parameter("layer3.1.conv2.weight")->value().data(), w.bytes()) != 0);
    nn::ResNet<float, Cpu> z({.arch = "resnet50", .num_classes = 10, .zero_init_residual = true});
    CHECK(z.find_parameter("layer2.3.bn3.weight")->value().data()[0] == 0.0f);
    CHECK(z.find_parameter("layer2.3.bn2.weight")->value().data()[0] == 1.0f);
  }

  TEST_CASE("bad arch and options are ValueErrors listing the choices") {
    auto make = [](const nn::ResNetOptions& o) { return std::make_unique<nn::ResNet<float, Cpu>>(o); };
    CHECK_THROWS_WITH_AS(make({.arch = "resnet19"}),
                         "ddp: unknown ResNet arch 'resnet19'; valid: resnet18, resnet34, resnet50, resnet101, "
                         "resnet152 (--arch)",
                         ValueError);
    CHECK_THROWS_WITH_AS(make({.arch = "resnet18", .num_classes = 0}),
                         "ddp: ResNet needs num_classes >= 1, got 0 (--num-classes)", ValueError);
  }
}
