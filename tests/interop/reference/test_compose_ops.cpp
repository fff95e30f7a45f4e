// nn: the modules that compose without backward code (issue 39) against PyTorch (make_compose_reference.py):
// SiLU, Tanh, Sigmoid and Identity in float32; Flatten on NHWC images and plain tensors (exact: a permuted copy);
// and a residual CNN of Sequential, Residual, Conv2d, BatchNorm2d, ReLU, SiLU, Tanh, Dropout, Flatten, Linear,
// Sigmoid and a nested Sequential in float64, whose state_dict keys, output, input gradient, every parameter
// gradient and running statistics equal its torch twin's, in training and in evaluation mode.
// SPDX-License-Identifier: MIT
//
// Tolerances: float32 activations |ddp - torch| <= 1e-5 (|torch| + rms(torch)) per element (libm and torch's
// vectorised exp/tanh differ by a few ulps; seen: 8e-7); the float64 model 1e-12 on the same scale (seen: 8e-15;
// summation orders differ), plus 1e-14 absolute for its training-mode gradients (size about 0.1): 5.body.0.bias's is
// 0 up to rounding on both sides, a conv bias before a training-mode BatchNorm being cancelled by its mean.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/tensor/tensor.hpp>

#include "reference_file.hpp"
#include "unit/nn/compose_model.hpp"

// Named, not anonymous: reference_torch may be compiled as one translation unit with the other reference tests.
namespace compose_ref {

using ddp::Cpu;
using ddp::Exec;
using ddp::Tensor;
using ddp::TensorView;

inline const ddp::test::RefFile& ref() {
  static const ddp::test::RefFile r = ddp::test::RefFile::generate("make_compose_reference.py");
  return r;
}
template <class T>
Tensor<T, Cpu> get(const std::string& name) {
  return ddp::test::to_ddp_layout<T>(ref().at(name));
}

// |got - want| <= rtol (|want| + rms(want)) + atol for every element. atol is for gradients that are 0 up to
// rounding on both sides (a conv bias before a training-mode BatchNorm, whose mean subtraction cancels it).
template <class T>
void check_close(TensorView<const T, Cpu> got, const Tensor<T, Cpu>& want, double rtol, const std::string& what,
                 double atol = 0.0) {
  CAPTURE(what);
  REQUIRE(got.shape() == want.shape());
  double ss = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) ss += double(want.data()[i]) * double(want.data()[i]);
  const double rms = std::sqrt(ss / double(std::max<std::int64_t>(want.numel(), 1)));
  double worst = -1;  // largest |got - want| - tolerance
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const double w = want.data()[i], g = got.data()[i];
    const double e = std::abs(g - w) - (rtol * (std::abs(w) + rms) + atol);
    if (!(e <= worst)) worst = e;
  }
  CHECK(worst <= 0.0);
}
template <class T>
void check_equal(TensorView<const T, Cpu> got, const Tensor<T, Cpu>& want, const std::string& what) {
  CAPTURE(what);
  REQUIRE(got.shape() == want.shape());
  CHECK(std::equal(got.data(), got.data() + got.numel(), want.data()));
}

template <class F>
void with_threads(F&& f) {
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    auto pool = std::make_unique<ddp::kernels::cpu::ThreadPool>(threads);
    Exec<Cpu> exec{.pool = pool.get()};
    f(exec);
  }
}

// Forward and backward of `m` on act/x and act/dy against "<name>/y" and "<name>/dx".
inline void check_activation(ddp::nn::Module<float, Cpu>& m, const std::string& name, Exec<Cpu>& exec) {
  const auto x = get<float>("act/x"), dy = get<float>("act/dy");
  auto y = m.forward(exec, x.cview());
  check_close(y.cview(), get<float>(name + "/y"), 1e-5, name + " y");
  auto dx = m.backward(exec, dy.cview());
  check_close(dx.cview(), get<float>(name + "/dx"), 1e-5, name + " dx");
}

// Sets every parameter of `m` from "model/init/<name>", every buffer from `buffers` + "<name>".
inline void load(ddp::nn::Module<double, Cpu>& m, const std::string& buffers) {
  for (auto* p : m.parameters()) {
    const auto v = get<double>("model/init/" + p->name());
    REQUIRE(v.shape() == p->shape());
    std::copy(v.data(), v.data() + v.numel(), p->value().data());
  }
  for (auto* b : m.buffers()) {
    if (b->is_integer()) {
      b->count().data()[0] = ref().int_at(buffers + b->name());
    } else {
      const auto v = get<double>(buffers + b->name());
      std::copy(v.data(), v.data() + v.numel(), b->real().data());
    }
  }
}

}  // namespace compose_ref

TEST_SUITE("nn") {
  TEST_CASE("SiLU, Tanh, Sigmoid, Mish and Identity forward and backward equal PyTorch's") {
    compose_ref::with_threads([](ddp::Exec<ddp::Cpu>& exec) {
      ddp::nn::SiLU<float, ddp::Cpu> silu;
      ddp::nn::Tanh<float, ddp::Cpu> tanh;
      ddp::nn::Sigmoid<float, ddp::Cpu> sigmoid;
      ddp::nn::Mish<float, ddp::Cpu> mish;
      ddp::nn::Identity<float, ddp::Cpu> identity;
      compose_ref::check_activation(silu, "silu", exec);
      compose_ref::check_activation(tanh, "tanh", exec);
      compose_ref::check_activation(sigmoid, "sigmoid", exec);
      compose_ref::check_activation(mish, "mish", exec);
      compose_ref::check_activation(identity, "identity", exec);
    });
  }

  TEST_CASE("Flatten equals PyTorch's on NCHW images (NHWC here) and plain tensors, forward and backward") {
    using compose_ref::get;
    for (std::int64_t i = 0; i < compose_ref::ref().int_at("flatten/count"); ++i) {
      const std::string c = "flatten" + std::to_string(i);
      CAPTURE(c);
      const auto x = get<float>(c + "/x"), dy = get<float>(c + "/dy");
      ddp::nn::Flatten<float, ddp::Cpu> flatten(static_cast<int>(compose_ref::ref().int_at(c + "/dims", 0)),
                                                static_cast<int>(compose_ref::ref().int_at(c + "/dims", 1)));
      compose_ref::with_threads([&](ddp::Exec<ddp::Cpu>& exec) {
        auto y = flatten.forward(exec, x.cview());
        compose_ref::check_equal(y.cview(), get<float>(c + "/y"), "y");
        auto dx = flatten.backward(exec, dy.cview());
        compose_ref::check_equal(dx.cview(), get<float>(c + "/dx"), "dx");
      });
    }
  }

  TEST_CASE("a residual CNN of composed modules equals its torch twin: state_dict keys, train and eval passes") {
    using compose_ref::get;
    const auto& r = compose_ref::ref();
    auto model = ddp::test::make_compose_model<double, ddp::Cpu>(0.0);
    const auto keys = model->state_dict_keys();
    REQUIRE(static_cast<std::int64_t>(keys.size()) == r.int_at("model/key_count"));
    for (std::size_t i = 0; i < keys.size(); ++i) {
      CAPTURE(keys[i]);
      CHECK(r.has("model/key/" + std::to_string(i) + "/" + keys[i]));
    }
    const auto x = get<double>("model/x");
    compose_ref::with_threads([&](ddp::Exec<ddp::Cpu>& exec) {
      // Training: batch statistics; Dropout with p = 0 as on the torch side.
      compose_ref::load(*model, "model/init/");
      model->train();
      model->zero_grad();
      auto y = model->forward(exec, x.cview());
      compose_ref::check_close(y.cview(), get<double>("model/y"), 1e-12, "y");
      auto dx = model->backward(exec, get<double>("model/dy").cview());
      compose_ref::check_close(dx.cview(), get<double>("model/dx"), 1e-12, "dx");
      for (auto* p : model->parameters())
        compose_ref::check_close(p->grad().cview(), get<double>("model/grad/" + p->name()), 1e-12, p->name(), 1e-14);
      for (auto* b : model->buffers()) {
        CAPTURE(b->name());
        if (b->is_integer())
          CHECK(b->count().data()[0] == r.int_at("model/after/" + b->name()));
        else
          compose_ref::check_close(b->real().cview(), get<double>("model/after/" + b->name()), 1e-12, b->name());
      }
      // Evaluation with Dropout(p = 0.5): the identity; BatchNorm normalises with the running statistics.
      auto eval_model = ddp::test::make_compose_model<double, ddp::Cpu>(0.5);
      compose_ref::load(*eval_model, "model/after/");
      eval_model->eval();
      eval_model->zero_grad();
      auto ye = eval_model->forward(exec, x.cview());
      compose_ref::check_close(ye.cview(), get<double>("eval/y"), 1e-12, "eval y");
      auto dxe = eval_model->backward(exec, get<double>("eval/dy").cview());
      compose_ref::check_close(dxe.cview(), get<double>("eval/dx"), 1e-12, "eval dx");
      for (auto* p : eval_model->parameters())
        compose_ref::check_close(p->grad().cview(), get<double>("eval/grad/" + p->name()), 1e-12, p->name());
    });
  }
}
