// resnet18 / resnet50: forward, loss, backward, one SGD step and eval against torchvision (PyTorch 1.13, float32),
// plus the checkpoint round trip in both directions (torchvision -> ddp at load, ddp -> torchvision at the end).
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include <ddp/nn/loss.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/train/checkpoint.hpp>

#include "model_test_util.hpp"

using namespace ddp;

namespace {

constexpr double kTol = 1e-4;  // relative error ||ours - torch|| / ||torch|| per tensor

void check_close(const std::string& what, const float* ours, const float* ref, std::size_t n, double* worst,
                 double tol = kTol) {
  const double e = test::rel_error(ours, ref, n);
  *worst = std::max(*worst, e);
  INFO(what << ": relative error " << e << " (tolerance " << tol << ")");
  CHECK(e <= tol);
}

void run_arch(const std::string& arch, std::int64_t n, std::int64_t hw) {
  const std::string dir = DDP_MODEL_TEST_OUT;
  test::run_reference_or_skip("make " + arch + " " + dir + " " + std::to_string(n) + " " + std::to_string(hw) + " 10");
  const std::string init_path = dir + "/" + arch + "_init.safetensors";
  const auto ref = train::read_safetensors(dir + "/" + arch + "_ref.safetensors");

  kernels::cpu::ThreadPool pool(2);
  Exec<Cpu> exec{.pool = &pool};
  nn::ResNet<float, Cpu> model({.arch = arch, .num_classes = 10, .seed = 7});
  train::load_state_dict(init_path, model);  // torchvision -> ddp (strict: every name and shape must match)

  const auto x = test::nchw_to_nhwc(ref.at("x"));
  const auto labels_v = ref.at("labels").as<std::int64_t>();
  const auto labels = Tensor<std::int64_t, Cpu>::from(Shape{n}, std::span<const std::int64_t>(labels_v));

  double worst = 0;
  model.train();
  model.zero_grad();
  auto logits = model.forward(exec, x.cview());
  const auto ref_logits = ref.at("logits").as<float>();
  check_close("logits", logits.data(), ref_logits.data(), ref_logits.size(), &worst);
  nn::CrossEntropyLoss<float, Cpu> ce;
  const double loss = ce.forward(exec, logits.cview(), labels.cview());
  const double ref_loss = ref.at("loss").as<float>()[0];
  CHECK(std::abs(loss - ref_loss) / std::abs(ref_loss) <= kTol);
  auto dlogits = ce.backward(exec);
  model.backward(exec, dlogits.cview());

  int n_grads = 0;
  for (auto* p : model.parameters()) {
    const auto g = ref.at("grad." + p->name()).as<float>();
    std::vector<float> ours(g.size());
    if (p->layout() == nn::Layout::Krsc)
      ours = train::detail::krsc_to_oihw(p->grad().data(), p->shape());
    else
      std::copy(p->grad().data(), p->grad().data() + p->numel(), ours.begin());
    check_close("grad " + p->name(), ours.data(), g.data(), g.size(), &worst);
    CHECK(p->grad_ready_count() == 1);  // every gradient reported exactly once
    ++n_grads;
  }
  optim::SGD<float, Cpu> opt(model, {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
  opt.step(exec);

  // After the step: every state_dict entry (parameters, running stats, num_batches_tracked).
  const std::string ours_path = dir + "/" + arch + "_ours.safetensors";
  train::save_state_dict(ours_path, model);
  const auto after = train::read_safetensors(ours_path);
  int n_after = 0;
  for (const auto& key : model.state_dict_keys()) {
    const auto& mine = after.at(key);
    const auto& theirs = ref.at("after." + key);
    REQUIRE(mine.shape == theirs.shape);
    if (mine.dtype == DType::I64) {
      CHECK_MESSAGE(mine.as<std::int64_t>() == theirs.as<std::int64_t>(), key);
    } else {
      const auto a = mine.as<float>(), b = theirs.as<float>();
      check_close("after step " + key, a.data(), b.data(), a.size(), &worst);
    }
    ++n_after;
  }

  model.eval();
  auto eval_logits = model.forward(exec, x.cview());
  const auto ref_eval = ref.at("eval_logits").as<float>();
  check_close("eval logits", eval_logits.data(), ref_eval.data(), ref_eval.size(), &worst);

  // ddp -> torchvision: PyTorch loads our file (strict) and must reproduce our eval logits.
  train::SafetensorsWriter io;
  io.add<float>("x", {n, 3, hw, hw}, ref.at("x").as<float>());
  io.add<float>("logits", {n, 10}, std::span<const float>(eval_logits.data(), static_cast<std::size_t>(eval_logits.numel())));
  const std::string io_path = dir + "/" + arch + "_io.safetensors";
  io.write(io_path);
  CHECK(test::run_reference("check " + arch + " " + ours_path + " " + io_path) == 0);

  std::printf("%s N=%lld %lldx%lld: %d gradients, %d state_dict entries, worst relative error %.3e (tolerance %.0e)\n",
              arch.c_str(), static_cast<long long>(n), static_cast<long long>(hw), static_cast<long long>(hw), n_grads,
              n_after, worst, kTol);
}

}  // namespace

TEST_SUITE("model") {
  TEST_CASE("resnet18 forward, backward and one SGD step match torchvision") { run_arch("resnet18", 4, 64); }
  TEST_CASE("resnet50 forward, backward and one SGD step match torchvision") { run_arch("resnet50", 2, 64); }
}
