// The three op-written user models of ops_models.hpp (a residual CNN, a SwiGLU MLP, a transformer block whose
// input embedding and output projection share one weight) against torch 1.13 on the same float64 parameters and
// inputs (make_ops_model_reference.py, run at test time by /usr/bin/python3; skipped when torch is missing):
// the mean cross-entropy loss and every parameter's gradient, |ours - torch| <= 1e-10 + 1e-8 |torch| (well
// inside the 1e-5), and each parameter's grad-ready hook once per backward.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <ddp/autograd/autograd.hpp>
#include <ddp/nn/ops_module.hpp>
#include <ddp/train/checkpoint.hpp>

#ifndef DDP_TEST_PYTHON
#  define DDP_TEST_PYTHON "/usr/bin/python3"
#endif
#ifndef DDP_REFERENCE_DIR
#  define DDP_REFERENCE_DIR "tests/interop/reference"
#  define DDP_REFERENCE_OUT "."
#endif
#include "interop/reference/reference_file.hpp"
#include "support/skip.hpp"
#include "support/temp_dir.hpp"
#include "unit/autograd/ops_models.hpp"

namespace test_ops_models {
using namespace ddp;
using namespace ddp::test::ops_models;
using V = autograd::Var<double, Cpu>;
using I64 = Tensor<std::int64_t, Cpu>;

std::string text(const test::RefTensor& r) {
  std::string s;
  for (auto c : r.i) s.push_back(static_cast<char>(c));
  return s;
}
template <class E>
Tensor<E, Cpu> tensor_of(const test::RefTensor& r) {
  Tensor<E, Cpu> t(Shape(r.dims));
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.data()[i] = std::is_same_v<E, double> ? E(r.f[static_cast<std::size_t>(i)]) : E(r.i[static_cast<std::size_t>(i)]);
  return t;
}

// Loads model m's torch parameters, runs forward (through an OpsGraph, the loss as an op) and backward, and
// compares; returns the largest |ours - torch| relative to max(1, |torch|) over the loss and all gradients.
template <class Model, class Input>
double check_model(const test::RefFile& ref, const std::string& m, Model& model, const Input& run_forward) {
  auto params = model.parameters();
  std::string names;
  for (auto* p : params) names += (names.empty() ? "" : "\n") + p->name();
  REQUIRE(names == text(ref.at(m + "/names")));  // the same parameters, in torch's order
  for (auto* p : params) {
    const Tensor<double, Cpu> v = tensor_of<double>(ref.at(m + "/p/" + p->name()));
    REQUIRE(v.shape() == p->shape());
    std::copy(v.data(), v.data() + v.numel(), p->value().data());
  }
  std::map<std::string, int> fired;
  model.set_grad_ready_hook([&](nn::Parameter<double, Cpu>& p) { ++fired[p.name()]; });
  model.zero_grad();
  Exec<Cpu> exec;
  nn::OpsGraph<double, Cpu> g(exec, model);
  const I64 targets = tensor_of<std::int64_t>(ref.at(m + "/t"));
  V loss = autograd::cross_entropy(run_forward(g), targets);
  loss.backward();
  double worst = 0;
  auto close = [&](double ours, double want, const std::string& what) {
    INFO(m, " ", what, ": ours ", ours, " torch ", want);
    CHECK(std::abs(ours - want) <= 1e-10 + 1e-8 * std::abs(want));
    worst = std::max(worst, std::abs(ours - want) / std::max(1.0, std::abs(want)));
  };
  close(loss.value().data()[0], ref.at(m + "/loss").f[0], "loss");
  for (auto* p : params) {
    CHECK_MESSAGE(fired[p->name()] == 1, p->name(), " reported ", fired[p->name()], " times");
    const auto& want = ref.at(m + "/g/" + p->name());
    for (std::int64_t i = 0; i < p->numel(); ++i)
      close(p->grad().data()[i], want.f[static_cast<std::size_t>(i)], p->name() + "[" + std::to_string(i) + "]");
  }
  return worst;
}

TEST_CASE("op-written ResCnn, SwiGluMlp and TinyGpt (tied embedding) against torch 1.13: loss and every gradient") {
  test::TempDir dir("ddp_ops_models_");
  const std::string out = dir.file("ref.bin");
  const std::string script = (std::filesystem::path(__FILE__).parent_path() / "make_ops_model_reference.py").string();
  const int rc = std::system((std::string(DDP_TEST_PYTHON) + " " + script + " " + out + " > /dev/null").c_str());
  const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  if (code == 77) return test::note_skipped("make_ops_model_reference.py: torch is not importable by /usr/bin/python3");
  REQUIRE_MESSAGE(code == 0, "make_ops_model_reference.py failed (exit ", code, ")");
  const test::RefFile ref = test::RefFile::read(out);

  ResCnn<double> cnn;
  const auto images = tensor_of<double>(ref.at("rescnn/x"));
  const double e_cnn = check_model(ref, "rescnn", cnn, [&](nn::OpsGraph<double, Cpu>& g) {
    return g(cnn, V::leaf(images.clone(), false, g.exec()));
  });
  SwiGluMlp<double> mlp;
  const auto features = tensor_of<double>(ref.at("swiglu/x"));
  const double e_mlp = check_model(ref, "swiglu", mlp, [&](nn::OpsGraph<double, Cpu>& g) {
    return g(mlp, V::leaf(features.clone(), false, g.exec()));
  });
  TinyGpt<double> gpt;
  const auto ids = tensor_of<std::int64_t>(ref.at("tinygpt/x"));
  const double e_gpt = check_model(ref, "tinygpt", gpt, [&](nn::OpsGraph<double, Cpu>& g) { return g(gpt, ids); });
  std::printf(
      "ops models vs torch 1.13 (float64), max |diff| / max(1, |torch|) over loss and all gradients: "
      "ResCnn %.3g, SwiGluMlp %.3g, TinyGpt %.3g\n",
      e_cnn, e_mlp, e_gpt);
}

// The same models through Module's interface (forward(x) -> logits, backward(dlogits)) give the OpsGraph path's
// gradients: what DDP, Sequential and Residual call.
TEST_CASE("op-written models through forward/backward equal the OpsGraph path") {
  std::mt19937_64 rng(76);
  Exec<Cpu> exec;
  SwiGluMlp<double> a;
  auto ps = a.parameters();
  for (auto* p : ps)
    for (std::int64_t i = 0; i < p->numel(); ++i)
      p->value().data()[i] = std::uniform_real_distribution<double>(-0.5, 0.5)(rng);
  Tensor<double, Cpu> x(Shape{3, 6}), dy(Shape{3, 5});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data()[i] = std::uniform_real_distribution<double>(-1, 1)(rng);
  for (std::int64_t i = 0; i < dy.numel(); ++i) dy.data()[i] = std::uniform_real_distribution<double>(-1, 1)(rng);
  a.zero_grad();
  a.forward(exec, x.cview());
  a.backward(exec, dy.cview());
  std::vector<std::vector<double>> via_module;
  for (auto* p : ps) via_module.emplace_back(p->grad().data(), p->grad().data() + p->numel());
  a.zero_grad();
  nn::OpsGraph<double, Cpu> g(exec, a);
  g(a, V::leaf(x.clone(), false, exec)).backward(dy);
  for (std::size_t k = 0; k < ps.size(); ++k)
    CHECK(via_module[k] == std::vector<double>(ps[k]->grad().data(), ps[k]->grad().data() + ps[k]->numel()));
}

// Checkpoints see ordinary parameters: a state dict saved from op-written models (torch's names, OIHW convs on
// disk) loads into fresh instances with equal values.
TEST_CASE("op-written models: state dict round trip through a checkpoint file") {
  test::TempDir dir("ddp_ops_models_ckpt_");
  auto round_trip = [&](auto& a, auto& b, const std::string& file) {
    float v = 0.0f;
    for (auto* p : a.parameters())
      for (std::int64_t i = 0; i < p->numel(); ++i) p->value().data()[i] = (v += 0.001f);
    train::save_state_dict(dir.file(file), a);
    train::load_state_dict(dir.file(file), b);
    auto pa = a.parameters(), pb = b.parameters();
    REQUIRE(pa.size() == pb.size());
    for (std::size_t k = 0; k < pa.size(); ++k)
      CHECK(std::equal(pa[k]->value().data(), pa[k]->value().data() + pa[k]->numel(), pb[k]->value().data()));
  };
  ResCnn<float> c1, c2;
  round_trip(c1, c2, "cnn.safetensors");
  TinyGpt<float> g1, g2;
  round_trip(g1, g2, "gpt.safetensors");
  CHECK(g1.state_dict_keys().front() == "wte");
}

}  // namespace test_ops_models
