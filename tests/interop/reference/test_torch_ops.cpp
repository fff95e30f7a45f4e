// kernels: every CPU op against PyTorch (make_op_reference.py), float32, with 1 and 2 threads.
// SPDX-License-Identifier: MIT
//
// Tolerance: |ddp - torch| <= 1e-4 * (|torch| + rms(torch)) per element: relative error 1e-4, with the
// tensor's RMS as the floor for elements that are near zero through cancellation (BN's dx, conv sums).
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>

#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/tensor/tensor.hpp>

#include "reference_file.hpp"

using ddp::Cpu;
using ddp::Exec;
using ddp::Shape;
using ddp::Tensor;
using ddp::TensorView;
using ddp::test::RefFile;
using ddp::test::to_ddp_layout;
using K = ddp::Kernels<Cpu>;
namespace kn = ddp::kernels;

namespace {

const RefFile& ref() {
  static const RefFile r = RefFile::generate("make_op_reference.py");
  return r;
}

// Runs the body with a 1-thread and a 2-thread Exec.
template <class F>
void with_threads(F&& f) {
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    auto pool = std::make_unique<kn::cpu::ThreadPool>(threads);
    Exec<Cpu> exec{.pool = pool.get()};
    f(exec);
  }
}

void check_close(TensorView<const float, Cpu> got, const Tensor<float, Cpu>& want, const std::string& what) {
  CAPTURE(what);
  REQUIRE(got.shape() == want.shape());
  double ss = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) ss += double(want.data()[i]) * want.data()[i];
  const double rms = std::sqrt(ss / double(std::max<std::int64_t>(want.numel(), 1)));
  double worst = 0;
  std::int64_t worst_i = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const double w = want.data()[i], g = got.data()[i];
    const double e = std::abs(g - w) / (std::abs(w) + rms + 1e-30);
    if (!(e <= worst)) {
      worst = e;
      worst_i = i;
    }
  }
  CAPTURE(worst_i);
  CAPTURE(got.data()[worst_i]);
  CAPTURE(want.data()[worst_i]);
  CHECK(worst <= 1e-4);
}

kn::Size2 size2(const std::string& name) { return {.h = ref().int_at(name, 0), .w = ref().int_at(name, 1)}; }
Tensor<float, Cpu> get(const std::string& name) { return to_ddp_layout(ref().at(name)); }

}  // namespace

TEST_SUITE("kernels") {
  TEST_CASE("conv2d forward, backward-data, backward-weight equal PyTorch's") {
    for (std::int64_t i = 0; i < ref().int_at("conv/count"); ++i) {
      const std::string c = "conv" + std::to_string(i);
      CAPTURE(c);
      auto x = get(c + "/x"), w = get(c + "/w"), y_ref = get(c + "/y"), dy = get(c + "/dy");
      const bool bias = ref().has(c + "/bias");
      Tensor<float, Cpu> b, db;
      if (bias) {
        b = get(c + "/bias");
        db = Tensor<float, Cpu>::empty(b.shape());
      }
      with_threads([&](Exec<Cpu>& exec) {
        auto y = Tensor<float, Cpu>::empty(y_ref.shape());
        K::conv2d_forward(exec, kn::Conv2dForwardArgs<float, Cpu>{.x = x.view(),
                                                                  .w = w.view(),
                                                                  .bias = b.view(),
                                                                  .y = y.view(),
                                                                  .stride = size2(c + "/stride"),
                                                                  .padding = size2(c + "/padding"),
                                                                  .dilation = size2(c + "/dilation")});
        check_close(y.view(), y_ref, "y");
        auto dx = Tensor<float, Cpu>::full(x.shape(), 7.f), dw = Tensor<float, Cpu>::full(w.shape(), 7.f);
        K::conv2d_backward(exec, kn::Conv2dBackwardArgs<float, Cpu>{.x = x.view(),
                                                                    .w = w.view(),
                                                                    .dy = dy.view(),
                                                                    .dx = dx.view(),
                                                                    .dw = dw.view(),
                                                                    .dbias = db.view(),
                                                                    .stride = size2(c + "/stride"),
                                                                    .padding = size2(c + "/padding"),
                                                                    .dilation = size2(c + "/dilation")});
        check_close(dx.view(), get(c + "/dx"), "dx");
        check_close(dw.view(), get(c + "/dw"), "dw");
        if (bias) check_close(db.view(), get(c + "/dbias"), "dbias");
      });
    }
  }

  TEST_CASE("batchnorm training and eval, forward and backward, equal PyTorch's") {
    for (std::int64_t i = 0; i < ref().int_at("bn/count"); ++i) {
      const std::string c = "bn" + std::to_string(i);
      CAPTURE(c);
      const bool training = ref().int_at(c + "/training") != 0;
      auto x = get(c + "/x"), g = get(c + "/gamma"), b = get(c + "/beta");
      with_threads([&](Exec<Cpu>& exec) {
        auto rm = get(c + "/running_mean_in"), rv = get(c + "/running_var_in");
        const Shape cs{g.numel()};
        auto y = Tensor<float, Cpu>::empty(x.shape()), sm = Tensor<float, Cpu>::empty(cs),
             si = Tensor<float, Cpu>::empty(cs);
        K::batchnorm_forward(exec, kn::BatchNormForwardArgs<float, Cpu>{.x = x.view(),
                                                                        .gamma = g.view(),
                                                                        .beta = b.view(),
                                                                        .running_mean = rm.view(),
                                                                        .running_var = rv.view(),
                                                                        .y = y.view(),
                                                                        .save_mean = sm.view(),
                                                                        .save_invstd = si.view(),
                                                                        .training = training});
        check_close(y.view(), get(c + "/y"), "y");
        check_close(rm.view(), get(c + "/running_mean"), "running_mean");
        check_close(rv.view(), get(c + "/running_var"), "running_var");
        auto dy = get(c + "/dy");
        auto dx = Tensor<float, Cpu>::empty(x.shape()), dg = Tensor<float, Cpu>::empty(cs),
             db = Tensor<float, Cpu>::empty(cs);
        K::batchnorm_backward(exec, kn::BatchNormBackwardArgs<float, Cpu>{.x = x.view(),
                                                                          .dy = dy.view(),
                                                                          .gamma = g.view(),
                                                                          .save_mean = sm.view(),
                                                                          .save_invstd = si.view(),
                                                                          .dx = dx.view(),
                                                                          .dgamma = dg.view(),
                                                                          .dbeta = db.view(),
                                                                          .training = training});
        check_close(dx.view(), get(c + "/dx"), "dx");
        check_close(dg.view(), get(c + "/dgamma"), "dgamma");
        check_close(db.view(), get(c + "/dbeta"), "dbeta");
      });
    }
  }

  TEST_CASE("max-pool forward and backward equal PyTorch's") {
    for (std::int64_t i = 0; i < ref().int_at("maxpool/count"); ++i) {
      const std::string c = "maxpool" + std::to_string(i);
      CAPTURE(c);
      auto x = get(c + "/x"), y_ref = get(c + "/y"), dy = get(c + "/dy");
      with_threads([&](Exec<Cpu>& exec) {
        auto y = Tensor<float, Cpu>::empty(y_ref.shape());
        auto am = Tensor<std::int32_t, Cpu>::empty(y_ref.shape());
        K::max_pool2d_forward(exec, kn::MaxPool2dForwardArgs<float, Cpu>{.x = x.view(),
                                                                         .y = y.view(),
                                                                         .argmax = am.view(),
                                                                         .kernel = size2(c + "/kernel"),
                                                                         .stride = size2(c + "/stride"),
                                                                         .padding = size2(c + "/padding")});
        check_close(y.view(), y_ref, "y");
        auto dx = Tensor<float, Cpu>::empty(x.shape());
        K::max_pool2d_backward(
            exec, kn::MaxPool2dBackwardArgs<float, Cpu>{.dy = dy.view(), .argmax = am.view(), .dx = dx.view()});
        check_close(dx.view(), get(c + "/dx"), "dx");
      });
    }
  }

  TEST_CASE("adaptive average pool forward and backward equal PyTorch's") {
    for (std::int64_t i = 0; i < ref().int_at("avgpool/count"); ++i) {
      const std::string c = "avgpool" + std::to_string(i);
      CAPTURE(c);
      auto x = get(c + "/x"), y_ref = get(c + "/y"), dy = get(c + "/dy");
      with_threads([&](Exec<Cpu>& exec) {
        auto y = Tensor<float, Cpu>::empty(y_ref.shape());
        K::adaptive_avg_pool2d_forward(exec,
                                       kn::AdaptiveAvgPool2dForwardArgs<float, Cpu>{.x = x.view(), .y = y.view()});
        check_close(y.view(), y_ref, "y");
        auto dx = Tensor<float, Cpu>::empty(x.shape());
        K::adaptive_avg_pool2d_backward(
            exec, kn::AdaptiveAvgPool2dBackwardArgs<float, Cpu>{.dy = dy.view(), .dx = dx.view()});
        check_close(dx.view(), get(c + "/dx"), "dx");
      });
    }
  }

  TEST_CASE("linear forward and backward equal PyTorch's") {
    for (std::int64_t i = 0; i < ref().int_at("linear/count"); ++i) {
      const std::string c = "linear" + std::to_string(i);
      CAPTURE(c);
      auto x = get(c + "/x"), w = get(c + "/w"), y_ref = get(c + "/y"), dy = get(c + "/dy");
      const bool bias = ref().has(c + "/bias");
      Tensor<float, Cpu> b, db;
      if (bias) {
        b = get(c + "/bias");
        db = Tensor<float, Cpu>::empty(b.shape());
      }
      with_threads([&](Exec<Cpu>& exec) {
        auto y = Tensor<float, Cpu>::empty(y_ref.shape());
        K::linear_forward(
            exec, kn::LinearForwardArgs<float, Cpu>{.x = x.view(), .w = w.view(), .bias = b.view(), .y = y.view()});
        check_close(y.view(), y_ref, "y");
        auto dx = Tensor<float, Cpu>::empty(x.shape()), dw = Tensor<float, Cpu>::empty(w.shape());
        K::linear_backward(
            exec,
            kn::LinearBackwardArgs<float, Cpu>{
                .x = x.view(), .w = w.view(), .dy = dy.view(), .dx = dx.view(), .dw = dw.view(), .dbias = db.view()});
        check_close(dx.view(), get(c + "/dx"), "dx");
        check_close(dw.view(), get(c + "/dw"), "dw");
        if (bias) check_close(db.view(), get(c + "/dbias"), "dbias");
      });
    }
  }

  TEST_CASE("relu forward and backward equal PyTorch's") {
    auto x = get("relu0/x"), dy = get("relu0/dy");
    with_threads([&](Exec<Cpu>& exec) {
      auto y = Tensor<float, Cpu>::empty(x.shape()), dx = Tensor<float, Cpu>::empty(x.shape());
      K::relu_forward<float>(exec, x.view(), y.view());
      check_close(y.view(), get("relu0/y"), "y");
      K::relu_backward<float>(exec, y.view(), dy.view(), dx.view());
      check_close(dx.view(), get("relu0/dx"), "dx");
    });
  }

  TEST_CASE("cross-entropy with label smoothing and MSE equal PyTorch's, value and gradient") {
    for (std::int64_t i = 0; i < ref().int_at("ce/count"); ++i) {
      const std::string c = "ce" + std::to_string(i);
      CAPTURE(c);
      auto z = get(c + "/logits");
      const auto& lr = ref().at(c + "/labels");
      auto labels = Tensor<std::int64_t, Cpu>::empty({z.dim(0)});
      for (std::int64_t k = 0; k < z.dim(0); ++k) labels.data()[k] = lr.i[static_cast<std::size_t>(k)];
      with_threads([&](Exec<Cpu>& exec) {
        auto dz = Tensor<float, Cpu>::empty(z.shape());
        const double loss = K::cross_entropy(
            exec, kn::CrossEntropyArgs<float, Cpu>{.logits = z.view(),
                                                   .labels = labels.view(),
                                                   .dlogits = dz.view(),
                                                   .label_smoothing = ref().float_at(c + "/smoothing")});
        CHECK(loss == doctest::Approx(ref().float_at(c + "/loss")).epsilon(1e-5));
        check_close(dz.view(), get(c + "/dlogits"), "dlogits");
      });
    }
    auto x = get("mse0/x"), t = get("mse0/target");
    with_threads([&](Exec<Cpu>& exec) {
      auto dx = Tensor<float, Cpu>::empty(x.shape());
      const double loss = K::mse(exec, kn::MseArgs<float, Cpu>{.x = x.view(), .target = t.view(), .dx = dx.view()});
      CHECK(loss == doctest::Approx(ref().float_at("mse0/loss")).epsilon(1e-5));
      check_close(dx.view(), get("mse0/dx"), "dx");
    });
  }

  TEST_CASE("SGD steps equal torch.optim.SGD (momentum, dampening, nesterov, weight decay)") {
    for (std::int64_t i = 0; i < ref().int_at("sgd/count"); ++i) {
      const std::string c = "sgd" + std::to_string(i);
      CAPTURE(c);
      with_threads([&](Exec<Cpu>& exec) {
        auto p = get(c + "/param0");
        auto buf = Tensor<float, Cpu>::zeros(p.shape());
        for (std::int64_t s = 0; s < ref().int_at(c + "/steps"); ++s) {
          CAPTURE(s);
          auto g = get(c + "/grad" + std::to_string(s));
          K::sgd_step(exec, kn::SgdArgs<float, Cpu>{.param = p.view(),
                                                    .grad = g.view(),
                                                    .momentum_buffer = buf.view(),
                                                    .first_step = s == 0,
                                                    .lr = ref().float_at(c + "/lr"),
                                                    .momentum = ref().float_at(c + "/momentum"),
                                                    .dampening = ref().float_at(c + "/dampening"),
                                                    .weight_decay = ref().float_at(c + "/weight_decay"),
                                                    .nesterov = ref().int_at(c + "/nesterov") != 0});
          check_close(p.view(), get(c + "/param" + std::to_string(s + 1)), "param");
        }
      });
    }
  }
}
