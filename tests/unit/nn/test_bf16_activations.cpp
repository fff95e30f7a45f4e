// bf16 activation storage on the CPU (Module<float, Cpu, bfloat16>, docs/decisions/0070): the host model of the GPU's
// bf16 step, against the float64 model with the same parameters and input.
// SPDX-License-Identifier: MIT
//
// Per op, every stored bf16 output is the float64 result rounded once: |err| <= u |ref|, u = 2^-8 (plus fp32
// arithmetic slack). For the whole ResNet-50 step the bound comes from the network's own sensitivity: its float32
// run's error against float64 (roundings of 2^-24) times 2^16. Element-wise bounds do not exist at that level: a
// randomly initialised deep BatchNorm network amplifies roundings in its gradients (float32's own gradient error
// is about 5e-3 at this size), and a ReLU whose input is within a rounding of 0 flips its mask, which moves a
// bias gradient by a whole |dy| (one BasicBlock: bn2.bias off by about 7 % in bf16, 0 in float32). So the
// model-level gradient check is that bf16 trains as float32 does.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <ddp/core/dtype.hpp>
#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/sgd.hpp>

#include "model_compare.hpp"
#include "random_tensor.hpp"

namespace test_bf16_activations {

using namespace ddp;
using test::as_doubles;
using test::copy_parameters;
using test::rel_error;
constexpr double kUnit = 1.0 / 256.0;  // bf16's unit roundoff, 2^-8

template <class A, class From>
Tensor<A, Cpu> cast(const Tensor<From, Cpu>& x) {
  Tensor<A, Cpu> out(x.shape());
  for (std::int64_t i = 0; i < x.numel(); ++i) out.data()[i] = A(float(x.data()[i]));
  return out;
}
// What one training step leaves: logits, loss, every parameter gradient (concatenated) and every running statistic.
struct Step {
  std::vector<double> logits, grads, stats;
  double loss = 0.0;
};

template <class T, class A>
Step run_step(nn::ResNet<T, Cpu, A>& m, const Tensor<float, Cpu>& x, const Tensor<std::int64_t, Cpu>& labels) {
  kernels::cpu::ThreadPool pool(2);
  Exec<Cpu> exec{.pool = &pool};
  const Tensor<A, Cpu> xa = cast<A>(x);
  Step s;
  const Tensor<A, Cpu> logits = m.forward(exec, xa.cview());
  nn::CrossEntropyLoss<A, Cpu> ce;
  s.loss = ce.forward(exec, logits.cview(), labels.cview());
  const Tensor<A, Cpu> dlogits = ce.backward(exec);
  m.backward(exec, dlogits.cview());
  s.logits = as_doubles(logits);
  for (auto* p : m.parameters())
    for (double v : as_doubles(p->grad())) s.grads.push_back(v);
  for (auto* b : m.buffers())
    if (!b->is_integer())
      for (double v : as_doubles(b->real())) s.stats.push_back(v);
  return s;
}



// ---- per op: every bf16 output is the float64 result rounded once (|err| <= u |ref|), up to fp32 arithmetic ----
constexpr double kFp32Slack = 1e-5;  // fp32 accumulation over the ops' sums (at most a few hundred terms), of max|ref|

// A bf16-exact random tensor, in both types: the bf16 op's input and the float64 op's.
struct Pair {
  Tensor<bfloat16, Cpu> b;
  Tensor<double, Cpu> d;
};
Pair random_pair(const Shape& s, std::uint64_t seed, double mean = 0.0) {
  const Tensor<float, Cpu> r = test::randn(s, seed, mean);
  Pair p{cast<bfloat16>(r), Tensor<double, Cpu>(s)};
  for (std::int64_t i = 0; i < r.numel(); ++i) p.d.data()[i] = double(float(p.b.data()[i]));
  return p;
}
// A float parameter and its float64 reference as a GEMM operand sees it: rounded to bf16.
struct Weight {
  Tensor<float, Cpu> f;
  Tensor<double, Cpu> d;
};
Weight random_weight(const Shape& s, std::uint64_t seed, bool gemm_operand) {
  Weight w{test::randn(s, seed, 0.0, 0.3), Tensor<double, Cpu>(s)};
  for (std::int64_t i = 0; i < w.f.numel(); ++i)
    w.d.data()[i] = gemm_operand ? double(float(bfloat16(w.f.data()[i]))) : double(w.f.data()[i]);
  return w;
}

double max_abs(const Tensor<double, Cpu>& t) {
  double m = 0.0;
  for (std::int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(t.data()[i]));
  return m;
}
// A stored bf16 output: within u |ref| of the float64 result, plus fp32 slack.
// must_round: the op makes new values (not max pooling's copies and sums of a few bf16 numbers).
void check_store(const Tensor<bfloat16, Cpu>& got, const Tensor<double, Cpu>& ref, const std::string& what,
                 bool must_round = true) {
  CAPTURE(what);
  REQUIRE(got.shape() == ref.shape());
  const double slack = kFp32Slack * max_abs(ref);
  double worst = -1.0, rounded = 0.0;
  for (std::int64_t i = 0; i < ref.numel(); ++i) {
    const double r = ref.data()[i], g = double(float(got.data()[i]));
    worst = std::max(worst, std::fabs(g - r) - kUnit * std::fabs(r) - slack);
    rounded = std::max(rounded, std::fabs(g - r) / (std::fabs(r) + slack));
  }
  CHECK(worst <= 0.0);
  if (must_round) CHECK(rounded > kUnit / 64);  // the store rounded (fp32 would stay near 2^-24)
}
// A float output (a parameter gradient): fp32 arithmetic on the same operands, no storage rounding.
void check_float(const Tensor<float, Cpu>& got, const Tensor<double, Cpu>& ref, const std::string& what) {
  CAPTURE(what);
  REQUIRE(got.shape() == ref.shape());
  const double slack = kFp32Slack * max_abs(ref);
  double worst = 0.0;
  for (std::int64_t i = 0; i < ref.numel(); ++i) worst = std::max(worst, std::fabs(double(got.data()[i]) - ref.data()[i]));
  CHECK(worst <= slack);
}
Tensor<float, Cpu> zeros_f(const Shape& s) {
  Tensor<float, Cpu> t(s);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = 0.0f;
  return t;
}
Tensor<double, Cpu> zeros_d(const Shape& s) {
  Tensor<double, Cpu> t(s);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = 0.0;
  return t;
}

}  // namespace test_bf16_activations

TEST_SUITE("nn_bf16_activations") {
  TEST_CASE("bf16 activations: conv2d and linear store once-rounded outputs and input gradients, float weight gradients") {
    using namespace test_bf16_activations;
    namespace kn = ddp::kernels;
    using K = kn::Kernels<Cpu>;
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> e{.pool = &pool};
    const kn::Size2 st{2, 2}, pad{1, 1};
    const Pair x = random_pair(Shape{2, 9, 8, 5}, 1), dy = random_pair(Shape{2, 5, 4, 6}, 2);
    const Weight w = random_weight(Shape{6, 3, 3, 5}, 3, true), bias = random_weight(Shape{6}, 4, false);
    Tensor<bfloat16, Cpu> y(dy.b.shape());
    Tensor<double, Cpu> y_ref(dy.b.shape());
    K::conv2d_forward(e, kn::Conv2dForwardArgs<float, Cpu, bfloat16>{.x = x.b.cview(), .w = w.f.cview(),
                                                                      .bias = bias.f.cview(), .y = y.view(),
                                                                      .stride = st, .padding = pad});
    K::conv2d_forward(e, kn::Conv2dForwardArgs<double, Cpu>{.x = x.d.cview(), .w = w.d.cview(),
                                                            .bias = bias.d.cview(), .y = y_ref.view(),
                                                            .stride = st, .padding = pad});
    check_store(y, y_ref, "conv2d y");
    // backward, dx accumulated into a skip gradient already there (the residual block's conv_1)
    const Pair skip = random_pair(x.b.shape(), 5);
    Tensor<bfloat16, Cpu> dx = cast<bfloat16>(skip.b);
    Tensor<double, Cpu> dx_ref = zeros_d(x.b.shape());
    std::copy(skip.d.data(), skip.d.data() + skip.d.numel(), dx_ref.data());
    Tensor<float, Cpu> dw = zeros_f(w.f.shape()), db = zeros_f(Shape{6});
    Tensor<double, Cpu> dw_ref = zeros_d(w.f.shape()), db_ref = zeros_d(Shape{6});
    K::conv2d_backward(e, kn::Conv2dBackwardArgs<float, Cpu, bfloat16>{
                              .x = x.b.cview(), .w = w.f.cview(), .dy = dy.b.cview(), .dx = dx.view(), .dw = dw.view(),
                              .dbias = db.view(), .stride = st, .padding = pad, .accumulate_dx = true});
    K::conv2d_backward(e, kn::Conv2dBackwardArgs<double, Cpu>{
                              .x = x.d.cview(), .w = w.d.cview(), .dy = dy.d.cview(), .dx = dx_ref.view(),
                              .dw = dw_ref.view(), .dbias = db_ref.view(), .stride = st, .padding = pad,
                              .accumulate_dx = true});
    check_store(dx, dx_ref, "conv2d dx (accumulated)");
    check_float(dw, dw_ref, "conv2d dw");
    check_float(db, db_ref, "conv2d dbias");

    const Pair lx = random_pair(Shape{4, 12}, 6), ldy = random_pair(Shape{4, 7}, 7);
    const Weight lw = random_weight(Shape{7, 12}, 8, true), lb = random_weight(Shape{7}, 9, false);
    Tensor<bfloat16, Cpu> ly(Shape{4, 7}), ldx(Shape{4, 12});
    Tensor<double, Cpu> ly_ref(Shape{4, 7}), ldx_ref(Shape{4, 12});
    K::linear_forward(e, kn::LinearForwardArgs<float, Cpu, bfloat16>{.x = lx.b.cview(), .w = lw.f.cview(),
                                                                      .bias = lb.f.cview(), .y = ly.view()});
    K::linear_forward(e, kn::LinearForwardArgs<double, Cpu>{.x = lx.d.cview(), .w = lw.d.cview(),
                                                            .bias = lb.d.cview(), .y = ly_ref.view()});
    check_store(ly, ly_ref, "linear y");
    Tensor<float, Cpu> ldw(lw.f.shape()), ldb(Shape{7});
    Tensor<double, Cpu> ldw_ref(lw.f.shape()), ldb_ref(Shape{7});
    K::linear_backward(e, kn::LinearBackwardArgs<float, Cpu, bfloat16>{.x = lx.b.cview(), .w = lw.f.cview(),
                                                                        .dy = ldy.b.cview(), .dx = ldx.view(),
                                                                        .dw = ldw.view(), .dbias = ldb.view()});
    K::linear_backward(e, kn::LinearBackwardArgs<double, Cpu>{.x = lx.d.cview(), .w = lw.d.cview(),
                                                              .dy = ldy.d.cview(), .dx = ldx_ref.view(),
                                                              .dw = ldw_ref.view(), .dbias = ldb_ref.view()});
    check_store(ldx, ldx_ref, "linear dx");
    check_float(ldw, ldw_ref, "linear dw");
    check_float(ldb, ldb_ref, "linear dbias");
  }

  TEST_CASE("bf16 activations: BatchNorm + residual + ReLU, pooling and cross-entropy round once at each store") {
    using namespace test_bf16_activations;
    namespace kn = ddp::kernels;
    using K = kn::Kernels<Cpu>;
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> e{.pool = &pool};
    const Shape xs{3, 5, 4, 6}, cs{6};
    const Pair x = random_pair(xs, 11, 2.0), res = random_pair(xs, 12), dy = random_pair(xs, 13);
    const Weight gamma = random_weight(cs, 14, false), beta = random_weight(cs, 15, false);
    // float statistics for the bf16 call, double for the reference; the same starting running statistics
    Tensor<float, Cpu> rm = zeros_f(cs), rv = zeros_f(cs), sm(cs), si(cs);
    Tensor<double, Cpu> rm_ref = zeros_d(cs), rv_ref = zeros_d(cs), sm_ref(cs), si_ref(cs);
    Tensor<bfloat16, Cpu> y(xs);
    Tensor<double, Cpu> y_ref(xs);
    K::batchnorm_act_forward(e, kn::BatchNormActForwardArgs<float, Cpu, bfloat16>{
                                    .bn = {.x = x.b.cview(), .gamma = gamma.f.cview(), .beta = beta.f.cview(),
                                           .running_mean = rm.view(), .running_var = rv.view(), .y = y.view(),
                                           .save_mean = sm.view(), .save_invstd = si.view()},
                                    .residual = res.b.cview()});
    K::batchnorm_act_forward(e, kn::BatchNormActForwardArgs<double, Cpu>{
                                    .bn = {.x = x.d.cview(), .gamma = gamma.d.cview(), .beta = beta.d.cview(),
                                           .running_mean = rm_ref.view(), .running_var = rv_ref.view(),
                                           .y = y_ref.view(), .save_mean = sm_ref.view(), .save_invstd = si_ref.view()},
                                    .residual = res.d.cview()});
    check_store(y, y_ref, "batchnorm_act y");
    check_float(rm, rm_ref, "running_mean");
    check_float(rv, rv_ref, "running_var");
    // backward: the mask from the stored bf16 y, which has the float64 y's signs (rounding keeps a sign)
    Tensor<double, Cpu> y_mask = zeros_d(xs);
    for (std::int64_t i = 0; i < y.numel(); ++i) y_mask.data()[i] = double(float(y.data()[i]));
    Tensor<bfloat16, Cpu> dx(xs), dres(xs);
    Tensor<double, Cpu> dx_ref(xs), dres_ref(xs);
    Tensor<float, Cpu> dg(cs), dbt(cs);
    Tensor<double, Cpu> dg_ref(cs), dbt_ref(cs);
    K::batchnorm_act_backward(e, kn::BatchNormActBackwardArgs<float, Cpu, bfloat16>{
                                     .bn = {.x = x.b.cview(), .dy = dy.b.cview(), .gamma = gamma.f.cview(),
                                            .save_mean = sm.cview(), .save_invstd = si.cview(), .dx = dx.view(),
                                            .dgamma = dg.view(), .dbeta = dbt.view()},
                                     .y = y.cview(), .dresidual = dres.view()});
    K::batchnorm_act_backward(e, kn::BatchNormActBackwardArgs<double, Cpu>{
                                     .bn = {.x = x.d.cview(), .dy = dy.d.cview(), .gamma = gamma.d.cview(),
                                            .save_mean = sm_ref.cview(), .save_invstd = si_ref.cview(),
                                            .dx = dx_ref.view(), .dgamma = dg_ref.view(), .dbeta = dbt_ref.view()},
                                     .y = y_mask.cview(), .dresidual = dres_ref.view()});
    check_store(dx, dx_ref, "batchnorm_act dx");
    check_store(dres, dres_ref, "batchnorm_act dresidual", false);  // dy * mask: a copy
    check_float(dg, dg_ref, "dgamma");
    check_float(dbt, dbt_ref, "dbeta");

    // max pool 3x3/2 pad 1 (overlapping windows: the backward adds, then rounds) and global average pool
    const Pair px = random_pair(Shape{2, 7, 6, 3}, 16), pdy = random_pair(Shape{2, 4, 3, 3}, 17);
    Tensor<bfloat16, Cpu> py(pdy.b.shape()), pdx(px.b.shape());
    Tensor<double, Cpu> py_ref(pdy.b.shape()), pdx_ref(px.b.shape());
    Tensor<std::int32_t, Cpu> am(pdy.b.shape()), am_ref(pdy.b.shape());
    K::max_pool2d_forward(e, kn::MaxPool2dForwardArgs<bfloat16, Cpu>{.x = px.b.cview(), .y = py.view(),
                                                                      .argmax = am.view()});
    K::max_pool2d_forward(e, kn::MaxPool2dForwardArgs<double, Cpu>{.x = px.d.cview(), .y = py_ref.view(),
                                                                    .argmax = am_ref.view()});
    for (std::int64_t i = 0; i < py.numel(); ++i) CHECK(double(float(py.data()[i])) == py_ref.data()[i]);  // exact
    K::max_pool2d_backward(e, kn::MaxPool2dBackwardArgs<bfloat16, Cpu>{.dy = pdy.b.cview(), .argmax = am.cview(),
                                                                        .dx = pdx.view()});
    K::max_pool2d_backward(e, kn::MaxPool2dBackwardArgs<double, Cpu>{.dy = pdy.d.cview(),
                                                                      .argmax = am_ref.cview(), .dx = pdx_ref.view()});
    check_store(pdx, pdx_ref, "max_pool2d dx");
    Tensor<bfloat16, Cpu> ay(Shape{2, 1, 1, 3}), adx(px.b.shape());
    Tensor<double, Cpu> ay_ref(Shape{2, 1, 1, 3}), adx_ref(px.b.shape());
    K::adaptive_avg_pool2d_forward(e, kn::AdaptiveAvgPool2dForwardArgs<bfloat16, Cpu>{.x = px.b.cview(), .y = ay.view()});
    K::adaptive_avg_pool2d_forward(e, kn::AdaptiveAvgPool2dForwardArgs<double, Cpu>{.x = px.d.cview(),
                                                                                     .y = ay_ref.view()});
    check_store(ay, ay_ref, "adaptive_avg_pool2d y");
    const Pair ady = random_pair(Shape{2, 1, 1, 3}, 18);
    K::adaptive_avg_pool2d_backward(e, kn::AdaptiveAvgPool2dBackwardArgs<bfloat16, Cpu>{.dy = ady.b.cview(),
                                                                                          .dx = adx.view()});
    K::adaptive_avg_pool2d_backward(e, kn::AdaptiveAvgPool2dBackwardArgs<double, Cpu>{.dy = ady.d.cview(),
                                                                                        .dx = adx_ref.view()});
    check_store(adx, adx_ref, "adaptive_avg_pool2d dx");

    const Pair logits = random_pair(Shape{4, 5}, 19);
    Tensor<std::int64_t, Cpu> labels(Shape{4});
    for (std::int64_t i = 0; i < 4; ++i) labels.data()[i] = (2 * i + 1) % 5;
    Tensor<bfloat16, Cpu> dl(Shape{4, 5});
    Tensor<double, Cpu> dl_ref(Shape{4, 5});
    const double loss = K::cross_entropy(e, kn::CrossEntropyArgs<bfloat16, Cpu>{.logits = logits.b.cview(),
                                                                                 .labels = labels.cview(),
                                                                                 .dlogits = dl.view()});
    const double loss_ref = K::cross_entropy(e, kn::CrossEntropyArgs<double, Cpu>{.logits = logits.d.cview(),
                                                                                   .labels = labels.cview(),
                                                                                   .dlogits = dl_ref.view()});
    CHECK(std::fabs(loss - loss_ref) <= kFp32Slack * loss_ref);  // the loss itself is a float, not stored
    check_store(dl, dl_ref, "cross_entropy dlogits");
  }

  TEST_CASE("bf16 activations: a CPU ResNet-50 step against float64, within the bound of its own rounding") {
    using namespace test_bf16_activations;
    const nn::ResNetOptions o{.arch = "resnet50", .num_classes = 10, .seed = 5, .width = 8};
    nn::ResNet<float, Cpu, bfloat16> bf(o);
    nn::ResNet<float, Cpu> f32(o);
    nn::ResNet<double, Cpu> f64(o);
    copy_parameters(bf, f32);
    copy_parameters(bf, f64);
    // The input is bf16-exact, so the three models see the same numbers.
    const Tensor<float, Cpu> x = cast<float>(cast<bfloat16>(test::randn(Shape{8, 64, 64, 3}, 21)));
    Tensor<std::int64_t, Cpu> labels(Shape{8});
    for (std::int64_t i = 0; i < 8; ++i) labels.data()[i] = (3 * i + 1) % 10;

    const Step ref = run_step(f64, x, labels), s32 = run_step(f32, x, labels), s16 = run_step(bf, x, labels);
    const double r_logits = rel_error(s32.logits, ref.logits), r_stats = rel_error(s32.stats, ref.stats);
    const double r_loss = std::fabs(s32.loss - ref.loss) / ref.loss, r_grads = rel_error(s32.grads, ref.grads);
    const double e_logits = rel_error(s16.logits, ref.logits), e_stats = rel_error(s16.stats, ref.stats);
    const double e_loss = std::fabs(s16.loss - ref.loss) / ref.loss, e_grads = rel_error(s16.grads, ref.grads);
    MESSAGE("relative error against float64, bf16 activations (float32): logits ", e_logits, " (", r_logits,
            "), loss ", e_loss, " (", r_loss, "), running statistics ", e_stats, " (", r_stats,
            "), all parameter gradients ", e_grads, " (", r_grads, ")");
    // The float32 model's error measures how much this network amplifies a rounding of relative size 2^-24 (every
    // op output and partial sum is one); bf16 stores round at 2^-8 at fewer points, so its error is at most
    // 2^16 times float32's (kStoreToFp32). And it is far above float32's: the stores really round.
    constexpr double kStoreToFp32 = 65536.0;
    CHECK(e_logits <= kStoreToFp32 * r_logits);
    CHECK(e_stats <= kStoreToFp32 * r_stats);
    CHECK(e_loss <= kStoreToFp32 * std::max(r_loss, 1e-7));
    CHECK(e_grads <= kStoreToFp32 * r_grads);
    CHECK(e_logits > 100 * r_logits);
    CHECK(e_stats > 100 * r_stats);
  }

  TEST_CASE("bf16 activations: a small ResNet trains as the float32 one does") {
    using namespace test_bf16_activations;
    // 4 classes, each a fixed random 16x16x3 pattern plus noise; both models from the same parameters.
    const nn::ResNetOptions o{.arch = "resnet18", .num_classes = 4, .seed = 3, .width = 8};
    nn::ResNet<float, Cpu, bfloat16> bf(o);
    nn::ResNet<float, Cpu> f32(o);
    copy_parameters(bf, f32);
    const Tensor<float, Cpu> patterns = test::randn(Shape{4, 16, 16, 3}, 31);
    const std::int64_t n = 16, pixels = 16 * 16 * 3;
    const auto train = [&](auto& model, auto tag) {
      using A = decltype(tag);
      kernels::cpu::ThreadPool pool(2);
      Exec<Cpu> exec{.pool = &pool};
      optim::SGD<float, Cpu> sgd(model.parameters(), {.lr = 0.05, .momentum = 0.9});
      nn::CrossEntropyLoss<A, Cpu> ce;
      std::vector<double> losses;
      for (int step = 0; step < 30; ++step) {
        const Tensor<float, Cpu> noise = test::randn(Shape{n, 16, 16, 3}, 100 + static_cast<std::uint64_t>(step), 0.0, 1.2);
        Tensor<float, Cpu> xf(Shape{n, 16, 16, 3});
        Tensor<std::int64_t, Cpu> labels(Shape{n});
        for (std::int64_t i = 0; i < n; ++i) {
          labels.data()[i] = (i + step) % 4;
          for (std::int64_t j = 0; j < pixels; ++j)
            xf.data()[i * pixels + j] = patterns.data()[labels.data()[i] * pixels + j] + noise.data()[i * pixels + j];
        }
        const Tensor<A, Cpu> x = cast<A>(xf);
        sgd.zero_grad();
        const Tensor<A, Cpu> logits = model.forward(exec, x.cview());
        losses.push_back(ce.forward(exec, logits.cview(), labels.cview()));
        const Tensor<A, Cpu> dlogits = ce.backward(exec);
        model.backward(exec, dlogits.cview());
        sgd.step(exec);
      }
      return losses;
    };
    const std::vector<double> l32 = train(f32, float{}), l16 = train(bf, bfloat16{});
    const auto last5 = [](const std::vector<double>& l) { return (l[25] + l[26] + l[27] + l[28] + l[29]) / 5; };
    MESSAGE("loss, first and mean of the last 5 steps: float32 ", l32.front(), " -> ", last5(l32), ", bf16 ",
            l16.front(), " -> ", last5(l16));
    CHECK(last5(l32) < 0.25 * l32.front());
    CHECK(last5(l16) < 0.25 * l16.front());
    CHECK(last5(l16) <= 1.5 * last5(l32) + 0.1);
  }
}
