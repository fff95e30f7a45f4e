// Checkpoints: state_dict and snapshot round trips, OIHW at the boundary, and errors naming file and tensor.
// (PyTorch loading our files and the reverse is tested in tests/interop/torchvision_resnet/test_resnet_reference.cpp.)
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include <ddp/nn/conv2d.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/train/checkpoint.hpp>

#include "support/temp_dir.hpp"

using namespace ddp;

namespace test_checkpoint {

// A per-process scratch directory, removed when the test program exits.
std::string temp_path(const std::string& name) {
  static ddp::test::TempDir tmp("ddp_nn_ckpt_");
  return tmp.file(name);
}

bool same_params(nn::Module<float, Cpu>& a, nn::Module<float, Cpu>& b) {
  auto pa = a.parameters(), pb = b.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i)
    if (std::memcmp(pa[i]->value().data(), pb[i]->value().data(), pa[i]->value().bytes()) != 0) return false;
  return true;
}

void train_step(Exec<Cpu>& exec, nn::ResNet<float, Cpu>& m, optim::SGD<float, Cpu>& opt) {
  auto x = Tensor<float, Cpu>::full({2, 32, 32, 3}, 0.3f);
  x.data()[7] = -1.0f;
  auto y = Tensor<std::int64_t, Cpu>::from({2}, {0, 1});
  opt.zero_grad();
  auto logits = m.forward(exec, x.cview());
  nn::CrossEntropyLoss<float, Cpu> ce;
  ce.forward(exec, logits.cview(), y.cview());
  m.backward(exec, ce.backward(exec).cview());
  opt.step(exec);
}


TEST_SUITE("nn") {
  TEST_CASE("conv weights are OIHW in the file and KRSC in memory") {
    nn::Conv2d<float, Cpu> conv({.in_channels = 2, .out_channels = 3, .kernel_size = 2});
    auto& w = conv.weight().value();  // (3, 2, 2, 2) KRSC
    for (std::int64_t i = 0; i < w.numel(); ++i) w.data()[i] = static_cast<float>(i);
    const std::string path = temp_path("conv.safetensors");
    train::save_state_dict(path, conv);
    const auto f = train::read_safetensors(path);
    const auto& e = f.at("weight");
    CHECK(e.shape == std::vector<std::int64_t>{3, 2, 2, 2});
    const auto v = e.as<float>();
    // OIHW (o, c, r, s) = KRSC (o, r, s, c): element (1, 1, 0, 1) is KRSC index ((1*2+0)*2+1)*2+1 = 11.
    CHECK(v[static_cast<std::size_t>(((1 * 2 + 1) * 2 + 0) * 2 + 1)] == 11.0f);
    nn::Conv2d<float, Cpu> back({.in_channels = 2, .out_channels = 3, .kernel_size = 2});
    train::load_state_dict(path, back);
    CHECK(std::memcmp(back.weight().value().data(), w.data(), w.bytes()) == 0);
  }

  TEST_CASE("snapshot round trip: model, momentum, epoch, RNG; training continues identically") {
    kernels::cpu::ThreadPool pool(1);
    Exec<Cpu> exec{.pool = &pool};
    nn::ResNet<float, Cpu> a({.arch = "resnet18", .num_classes = 3, .seed = 1, .width = 4});
    optim::SGD<float, Cpu> oa(a, {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
    train_step(exec, a, oa);
    const std::string path = temp_path("snap.safetensors");
    const train::SnapshotInfo info{.epoch = 5, .rng = {.seed = 9, .rank = 0, .stream = 1, .offset = 77},
                                   .metadata = {{"note", "hello"}}};
    train::save_snapshot(path, a, oa, info);

    nn::ResNet<float, Cpu> b({.arch = "resnet18", .num_classes = 3, .seed = 2, .width = 4});
    optim::SGD<float, Cpu> ob(b, {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
    const auto got = train::load_snapshot(path, b, ob);
    CHECK(got.epoch == 5);
    CHECK(got.rng == info.rng);
    CHECK(got.metadata.at("note") == "hello");
    CHECK(ob.steps() == 1);
    CHECK(same_params(a, b));
    CHECK(b.find_buffer("bn1.num_batches_tracked")->count().data()[0] == 1);

    // The same bytes through serialize / load_snapshot_bytes (the broadcast path).
    nn::ResNet<float, Cpu> c({.arch = "resnet18", .num_classes = 3, .seed = 3, .width = 4});
    optim::SGD<float, Cpu> oc(c, {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
    const auto bytes = train::serialize_snapshot(a, oa, info);
    train::load_snapshot_bytes(bytes, c, oc);

    train_step(exec, a, oa);  // momentum restored: one more step agrees exactly
    train_step(exec, b, ob);
    train_step(exec, c, oc);
    CHECK(same_params(a, b));
    CHECK(same_params(a, c));
  }

  TEST_CASE("mismatching files are IoErrors naming the file and the tensor; the model is untouched") {
    nn::ResNet<float, Cpu> r18({.arch = "resnet18", .num_classes = 10, .width = 4});
    nn::ResNet<float, Cpu> r34({.arch = "resnet34", .num_classes = 10, .width = 4});
    nn::ResNet<float, Cpu> r18c({.arch = "resnet18", .num_classes = 7, .width = 4});
    const std::string path = temp_path("r18.safetensors");
    train::save_state_dict(path, r18);
    auto before = r34.find_parameter("conv1.weight")->value().clone();
    CHECK_THROWS_WITH_AS(train::load_state_dict(path, r34),
                         ("ddp: checkpoint '" + path +
                          "' has no tensor 'layer1.2.conv1.weight' that ResNet(resnet34, num_classes=10, width=4) "
                          "needs (the file was written for ResNet(resnet18, num_classes=10, width=4)); is it a "
                          "checkpoint of another architecture?")
                             .c_str(),
                         IoError);
    CHECK(std::memcmp(before.data(), r34.find_parameter("conv1.weight")->value().data(), before.bytes()) == 0);
    CHECK_THROWS_WITH_AS(train::load_state_dict(path, r18c),
                         ("ddp: checkpoint '" + path +
                          "': tensor 'fc.weight' has shape [10, 32] but ResNet(resnet18, num_classes=7, width=4) "
                          "needs [7, 32] (the file was written for ResNet(resnet18, num_classes=10, width=4)); wrong "
                          "--arch or --num-classes?")
                             .c_str(),
                         IoError);
    // A file with an extra tensor (strict) and one with a wrong dtype.
    train::SafetensorsWriter w;
    train::detail::add_state_dict(w, r18);
    w.add<float>("extra.weight", {1}, std::vector<float>{1.0f});
    const std::string extra = temp_path("extra.safetensors");
    w.write(extra);
    CHECK_THROWS_WITH_AS(train::load_state_dict(extra, r18),
                         ("ddp: checkpoint '" + extra +
                          "' holds tensor 'extra.weight' that ResNet(resnet18, num_classes=10, width=4) does not have "
                          "(the file was written for ResNet(resnet18, num_classes=10, width=4)); is it a checkpoint "
                          "of another architecture?")
                             .c_str(),
                         IoError);
    CHECK_NOTHROW(train::load_state_dict(extra, r18, /*strict=*/false));
    nn::Conv2d<float, Cpu> conv({.in_channels = 1, .out_channels = 1, .kernel_size = 1});
    train::SafetensorsWriter w64;
    w64.add<double>("weight", {1, 1, 1, 1}, std::vector<double>{2.0});
    const std::string f64 = temp_path("f64.safetensors");
    w64.write(f64);
    CHECK_THROWS_WITH_AS(train::load_state_dict(f64, conv),
                         ("ddp: checkpoint '" + f64 +
                          "': tensor 'weight' has dtype F64 but the model holds F32; convert the file (e.g. .float())")
                             .c_str(),
                         IoError);
    // A state dict is not a snapshot; a truncated file is the reader's IoError.
    optim::SGD<float, Cpu> opt(r18, {.lr = 0.1});
    CHECK_THROWS_WITH_AS(train::load_snapshot(path, r18, opt),
                         ("ddp: '" + path +
                          "' is not a ddp snapshot (metadata ddp.kind is 'state_dict'); pass a snapshot a training run "
                          "saved (save_snapshot)")
                             .c_str(),
                         IoError);
    std::filesystem::resize_file(path, 100);
    CHECK_THROWS_AS(train::load_state_dict(path, r18), IoError);
  }
}

}  // namespace test_checkpoint
