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

// The data helper's reference files (tests/reference/make_resnet_reference.py): same checks on its layout.
// Its BatchNorm init (every weight U(0.5, 1.5)) makes the backward pass ill-conditioned: on these files
// PyTorch's own float32 gradients differ from its float64 ones by 1.4e-2 (resnet18, batch 4, 64x64; ~2e-2
// for resnet50), so no float32 implementation can meet 1e-4 there. Forward quantities (logits, loss,
// running statistics) are held to 1e-4; gradients, stepped parameters and the eval logits that depend on
// them to kIllConditionedTol. The 1e-4 comparison of everything is the two cases above.
TEST_CASE("resnet18 against make_resnet_reference.py's files") {
  constexpr double kIllConditionedTol = 5e-2;
  const std::string dir = std::string(DDP_MODEL_TEST_OUT) + "/make_resnet_reference";
  std::filesystem::create_directories(dir);
  const std::string cmd = std::string(DDP_TEST_PYTHON) + " " + DDP_REFERENCE_DIR + "/make_resnet_reference.py " + dir +
                          " --archs resnet18 --batch 4 --size 64 --num-classes 10";
  const int rc = std::system(cmd.c_str());
  if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0) {
    std::printf("SKIP: %s failed (torch missing?)\n", cmd.c_str());
    return;
  }
  kernels::cpu::ThreadPool pool(2);
  Exec<Cpu> exec{.pool = &pool};
  nn::ResNet<float, Cpu> model({.arch = "resnet18", .num_classes = 10});
  train::load_state_dict(dir + "/resnet18_init.safetensors", model);
  const auto io = train::read_safetensors(dir + "/resnet18_io.safetensors");
  const auto grads = train::read_safetensors(dir + "/resnet18_grads.safetensors");
  const auto after_fwd = train::read_safetensors(dir + "/resnet18_after_forward.safetensors");
  const auto after_step = train::read_safetensors(dir + "/resnet18_after_step.safetensors");
  const auto x = test::nchw_to_nhwc(io.at("input"));
  const auto lv = io.at("labels").as<std::int64_t>();
  const auto labels = Tensor<std::int64_t, Cpu>::from(Shape{static_cast<std::int64_t>(lv.size())},
                                                      std::span<const std::int64_t>(lv));
  double worst = 0;
  model.zero_grad();
  auto logits = model.forward(exec, x.cview());
  const auto rl = io.at("logits").as<float>();
  check_close("logits", logits.data(), rl.data(), rl.size(), &worst);
  nn::CrossEntropyLoss<float, Cpu> ce;
  const double loss = ce.forward(exec, logits.cview(), labels.cview());
  CHECK(std::abs(loss - io.at("loss").as<float>()[0]) <= kTol * std::abs(loss));
  model.backward(exec, ce.backward(exec).cview());
  for (auto* b : model.buffers()) {
    if (b->is_integer()) {
      CHECK(b->count().data()[0] == after_fwd.at(b->name()).as<std::int64_t>()[0]);
    } else {
      const auto r = after_fwd.at(b->name()).as<float>();
      check_close(b->name(), b->real().data(), r.data(), r.size(), &worst);
    }
  }
  optim::SGD<float, Cpu> opt(model, {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-5});
  for (auto* p : model.parameters()) {
    const auto g = grads.at(p->name()).as<float>();
    const auto ours = p->layout() == nn::Layout::Krsc ? train::detail::krsc_to_oihw(p->grad().data(), p->shape())
                                                       : std::vector<float>(p->grad().data(), p->grad().data() + p->numel());
    check_close("grad " + p->name(), ours.data(), g.data(), g.size(), &worst, kIllConditionedTol);
  }
  opt.step(exec);
  for (auto* p : model.parameters()) {
    const auto v = after_step.at(p->name()).as<float>();
    const auto ours = p->layout() == nn::Layout::Krsc ? train::detail::krsc_to_oihw(p->value().data(), p->shape())
                                                       : std::vector<float>(p->value().data(), p->value().data() + p->numel());
    check_close("after step " + p->name(), ours.data(), v.data(), v.size(), &worst, kIllConditionedTol);
  }
  model.eval();
  auto ev = model.forward(exec, x.cview());
  const auto re = io.at("logits_eval_after_step").as<float>();
  check_close("eval logits after step", ev.data(), re.data(), re.size(), &worst, kIllConditionedTol);
  std::printf("resnet18 vs make_resnet_reference.py: worst relative error %.3e\n", worst);
}
