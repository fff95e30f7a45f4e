// train: the torchvision reference files of tests/interop/reference/make_resnet_reference.py read here (names,
// shapes, dtypes, the SGD relation, the loss), and a state dict re-written here loads into torchvision.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ddp/train/safetensors.hpp>
#include <ddp/train/safetensors_writer.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using ddp::DType;
using ddp::train::read_safetensors;
using ddp::train::SafetensorsFile;

namespace {

struct RefDir {
  fs::path path;
  RefDir() {
    path = fs::temp_directory_path() / ("ddp_resnet_ref_" + std::to_string(::getpid()));
    fs::create_directories(path);
  }
  ~RefDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

const fs::path kReferenceDir = fs::path(__FILE__).parent_path().parent_path().parent_path() / "interop" / "reference";

}  // namespace

TEST_SUITE("train") {
  TEST_CASE("resnet reference: torchvision resnet18 files have torch names, OIHW shapes and a consistent SGD step") {
    if (std::system("/usr/bin/python3 -c 'import torch, torchvision' >/dev/null 2>&1") != 0) {
      MESSAGE("skipped: /usr/bin/python3 cannot import torch and torchvision (apt install python3-torchvision)");
      return;
    }
    RefDir dir;
    const std::string cmd = "/usr/bin/python3 " + (kReferenceDir / "make_resnet_reference.py").string() + " " +
                            dir.path.string() + " --archs resnet18 --size 32 --batch 2 --num-classes 10 > " +
                            dir.file("log.json");
    REQUIRE(std::system(cmd.c_str()) == 0);

    const SafetensorsFile init = read_safetensors(dir.file("resnet18_init.safetensors"));
    const SafetensorsFile grads = read_safetensors(dir.file("resnet18_grads.safetensors"));
    const SafetensorsFile fwd = read_safetensors(dir.file("resnet18_after_forward.safetensors"));
    const SafetensorsFile step = read_safetensors(dir.file("resnet18_after_step.safetensors"));
    const SafetensorsFile io = read_safetensors(dir.file("resnet18_io.safetensors"));

    CHECK(init.tensors.size() == 122);  // 62 parameters + 60 buffers
    CHECK(grads.tensors.size() == 62);
    CHECK(step.tensors.size() == 62);
    CHECK(fwd.tensors.size() == 60);
    CHECK(init.metadata.at("arch") == "resnet18");
    CHECK(init.metadata.at("lr") == "0.1");
    using S = std::vector<std::int64_t>;
    CHECK(init.at("conv1.weight").shape == S{64, 3, 7, 7});
    CHECK(init.at("layer1.0.conv1.weight").shape == S{64, 64, 3, 3});
    CHECK(init.at("layer2.0.downsample.0.weight").shape == S{128, 64, 1, 1});
    CHECK(init.at("layer4.1.bn2.running_var").shape == S{512});
    CHECK(init.at("fc.weight").shape == S{10, 512});
    CHECK(init.at("fc.bias").dtype == DType::F32);
    CHECK(init.at("bn1.num_batches_tracked").dtype == DType::I64);
    CHECK(init.at("bn1.num_batches_tracked").shape.empty());
    CHECK(init.at("bn1.num_batches_tracked").as<std::int64_t>()[0] == 3);
    CHECK(fwd.at("bn1.num_batches_tracked").as<std::int64_t>()[0] == 4);

    // One SGD step from zero momentum: p1 = p0 - lr * (g + wd * p0), checked for every parameter.
    std::size_t checked = 0;
    double worst = 0;
    for (const auto& [name, g] : grads.tensors) {
      const auto p0 = init.at(name).as<float>(), p1 = step.at(name).as<float>(), gv = g.as<float>();
      REQUIRE(p0.size() == gv.size());
      CHECK(step.at(name).shape == init.at(name).shape);
      for (std::size_t i = 0; i < p0.size(); ++i) {
        const double want = double{p0[i]} - 0.1 * (double{gv[i]} + 1e-5 * double{p0[i]});
        // float32 rounding of the terms, not of the (possibly cancelling) result, bounds the error.
        const double scale = std::fabs(double{p0[i]}) + 0.1 * std::fabs(double{gv[i]}) + 1e-12;
        worst = std::max(worst, std::fabs(want - double{p1[i]}) / scale);
      }
      ++checked;
    }
    CHECK(checked == 62);
    CHECK(worst < 1e-6);

    // The loss is the mean cross-entropy of the stored logits (computed here in double).
    const auto logits = io.at("logits").as<float>();
    const auto labels = io.at("labels").as<std::int64_t>();
    REQUIRE(io.at("logits").shape == S{2, 10});
    CHECK(io.at("input").shape == S{2, 3, 32, 32});
    CHECK(io.at("input_nhwc").shape == S{2, 32, 32, 3});
    CHECK(io.at("loss").shape.empty());
    const auto x = io.at("input").as<float>(), xh = io.at("input_nhwc").as<float>();
    CHECK(x[((1 * 3 + 2) * 32 + 5) * 32 + 7] == xh[((1 * 32 + 5) * 32 + 7) * 3 + 2]);  // (n=1, c=2, h=5, w=7)
    double loss = 0;
    for (int n = 0; n < 2; ++n) {
      const float* row = logits.data() + n * 10;
      const double m = *std::max_element(row, row + 10);
      double z = 0;
      for (int k = 0; k < 10; ++k) z += std::exp(row[k] - m);
      loss += (m + std::log(z) - row[labels[static_cast<std::size_t>(n)]]) / 2.0;
    }
    CHECK(io.at("loss").as<float>()[0] == doctest::Approx(loss).epsilon(1e-5));

    // A state dict re-written here (reverse order, extra metadata) loads into torchvision strictly and
    // reproduces the reference logits.
    ddp::train::SafetensorsWriter w;
    std::vector<std::string> names = init.order;
    std::reverse(names.begin(), names.end());
    for (const auto& name : names) {
      const auto& e = init.at(name);
      w.add_view(name, e.dtype, e.shape, e.data);
    }
    w.set_metadata("writer", "ddp");
    const std::string rewritten = dir.file("rewritten.safetensors");
    w.write(rewritten);
    const std::string check = "/usr/bin/python3 " + (kReferenceDir / "resnet_state_dict_check.py").string() +
                              " resnet18 10 " + rewritten + " " + dir.file("resnet18_io.safetensors") + " > " +
                              dir.file("check.json");
    CHECK(std::system(check.c_str()) == 0);
    auto result = nlohmann::json::parse(std::ifstream(dir.file("check.json")));
    MESSAGE("torchvision logits from the state dict written here: " << result.dump());
    CHECK(result["missing"].empty());
    CHECK(result["unexpected"].empty());
    CHECK(result["max_rel"].get<double>() <= 1e-5);
  }
}
