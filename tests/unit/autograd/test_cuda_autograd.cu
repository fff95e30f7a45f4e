// Autograd's ops on the GPU against the same ops on the CPU: every op's value and every input's gradient, on the
// same float32 inputs and the same random seed gradient, and one step of a small model written with ops.
// SPDX-License-Identifier: MIT
//
// The CPU side is the reference that tests/unit/autograd checks against finite differences and torch, so a
// GPU op that matches it to float32 rounding is right. Bounds: |gpu - cpu| <= rtol (|cpu| + max|cpu|) per
// element (support/tolerance.hpp) with rtol = ulps * len * 2^-23, where len is the longest sum behind an element
// (1 for element-wise ops, k for a GEMM of inner size k, the reduced extent for a reduction) and ulps covers the
// roundings per term: 4 where both devices do the same IEEE operations (element-wise arithmetic, sums that
// both accumulate in double), 16 where they differ in order or in library (cuBLAS and cuDNN against the CPU's
// loops, CUDA's expf/erff/tanhf within 2-4 ulps against glibc's 1). The exec computes in exact fp32
// (Precision::Fp32); TF32 would need ~1e-3. GPU cases skip (exit 77) without a device.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ddp/autograd/autograd.hpp>
#include <ddp/autograd/cuda/gemm.cuh>
#include <ddp/kernels/cuda/kernels.cuh>
#include <ddp/tensor/cuda/copy.hpp>
#include <ddp/tensor/cuda/stream.hpp>

#include "support/gpu.hpp"
#include "support/tolerance.hpp"

namespace test_cuda_autograd {
using namespace ddp;
using namespace ddp::autograd;

constexpr double kUlp = 1.0 / 8388608.0;  // 2^-23, float32's epsilon
// The bound for a result built from sums of `len` terms, `ulps` roundings' worth per term (see the top).
constexpr double rtol(double len, double ulps) { return ulps * len * kUlp; }

using Th = Tensor<float, Cpu>;
using Vc = Var<float, Cpu>;
using Vg = Var<float, Cuda>;

struct Env {
  Stream stream;
  Exec<Cuda> gpu = stream.exec(Precision::Fp32);
  std::uint64_t seed = std::random_device{}();
  std::mt19937_64 rng{seed};

  template <class T = float>
  Tensor<T, Cpu> rand(Shape s, double lo = -1.0, double hi = 1.0) {
    std::uniform_real_distribution<double> u(lo, hi);
    Tensor<T, Cpu> t(s);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<T>(u(rng));
    return t;
  }
  template <class T>
  Tensor<T, Cuda> up(const Tensor<T, Cpu>& t) {
    return to<Cuda>(t.cview(), gpu);
  }
  template <class T>
  Tensor<T, Cpu> down(const Tensor<T, Cuda>& t) {
    return to<Cpu>(t.cview(), gpu);
  }
};

// The CPU's or the GPU's object, by the device of the Vars an op function receives.
template <class V, class A, class B>
decltype(auto) on(const std::vector<V>&, A& cpu, B& gpu) {
  if constexpr (std::is_same_v<typename V::device_type, Cpu>)
    return (cpu);
  else
    return (gpu);
}

template <class T>
void expect_close(const std::string& what, const Tensor<T, Cpu>& ref, const Tensor<T, Cpu>& got, double tol,
                  std::uint64_t seed) {
  REQUIRE_MESSAGE(ref.shape() == got.shape(), what, ": shape ", got.shape(), " vs the CPU's ", ref.shape());
  const double excess = test::tolerance_excess(ref, got, tol);
  CHECK_MESSAGE(excess <= 0.0, what, ": |gpu - cpu| exceeds ", tol, " (|cpu| + max|cpu|) by ", excess, " (seed ", seed,
                ")");
}

// The inputs of one case (Tensor is move-only, so no initializer list).
template <class T, class... R>
std::vector<Tensor<T, Cpu>> inputs(Tensor<T, Cpu> first, R... rest) {
  std::vector<Tensor<T, Cpu>> v;
  v.push_back(std::move(first));
  (v.push_back(std::move(rest)), ...);
  return v;
}

// f (a generic lambda over std::vector<Var<T, D>>&) on both devices from the same inputs, backward with the same
// seed gradient; compares the value (tol_value) and every input's gradient (tol_grad).
template <class T = float, class F>
void compare(Env& env, const std::string& name, const std::vector<Tensor<T, Cpu>>& xs, F f, double tol_value,
             double tol_grad) {
  std::vector<Var<T, Cpu>> hc;
  std::vector<Var<T, Cuda>> gc;
  for (const auto& x : xs) {
    hc.push_back(Var<T, Cpu>::leaf(x.clone(), true));
    gc.push_back(Var<T, Cuda>::leaf(env.up(x), true, env.gpu));
  }
  Var<T, Cpu> yc = f(hc);
  Var<T, Cuda> yg = f(gc);
  const Tensor<T, Cpu> seed = env.template rand<T>(yc.shape());
  yc.backward(seed);
  yg.backward(env.up(seed));
  expect_close(name + " value", yc.value(), env.down(yg.value()), tol_value, env.seed);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    REQUIRE_MESSAGE(hc[i].has_grad() == gc[i].has_grad(), name, ": input ", i, " has a gradient on one device only");
    if (hc[i].has_grad())
      expect_close(name + " d(input " + std::to_string(i) + ")", hc[i].grad(), env.down(gc[i].grad()), tol_grad,
                   env.seed);
  }
}

TEST_CASE("autograd on CUDA: element-wise binary ops with broadcasting, unary ops, activations") {
  if (test::skip_without_gpu()) return;
  Env env;
  const double exact = rtol(1, 4), lib = rtol(1, 16);
  // Gradients of broadcast operands are sums (in double on both devices) over the expanded dims.
  compare(
      env, "add", inputs(env.rand({3, 1, 4}), env.rand({5, 1})), [](auto& v) { return v[0] + v[1]; }, exact, exact);
  compare(
      env, "sub", inputs(env.rand({2, 3}), env.rand({3})), [](auto& v) { return v[0] - v[1]; }, exact, exact);
  compare(
      env, "mul", inputs(env.rand({4, 1}), env.rand({1, 6})), [](auto& v) { return v[0] * v[1]; }, exact, exact);
  compare(
      env, "div", inputs(env.rand({2, 3, 4}), env.rand({4}, 0.5, 2.0)), [](auto& v) { return v[0] / v[1]; }, exact,
      exact);
  compare(
      env, "scalars", inputs(env.rand({3, 5})),
      [](auto& v) { return (2.0f * v[0] + 1.0f) / 3.0f - (1.0f - v[0]) * 0.5f; }, exact, exact);
  compare(
      env, "neg", inputs(env.rand({7})), [](auto& v) { return -v[0]; }, exact, exact);
  compare(
      env, "exp", inputs(env.rand({7, 3})), [](auto& v) { return autograd::exp(v[0]); }, lib, lib);
  compare(
      env, "log", inputs(env.rand({7, 3}, 0.2, 3.0)), [](auto& v) { return autograd::log(v[0]); }, lib, lib);
  compare(
      env, "pow", inputs(env.rand({7, 3}, 0.3, 2.0)), [](auto& v) { return autograd::pow(v[0], -1.5f); }, lib, lib);
  compare(
      env, "sqrt", inputs(env.rand({7, 3}, 0.2, 3.0)), [](auto& v) { return autograd::sqrt(v[0]); }, lib, lib);
  compare(
      env, "rsqrt", inputs(env.rand({7, 3}, 0.2, 3.0)), [](auto& v) { return autograd::rsqrt(v[0]); }, lib, lib);
  compare(
      env, "abs", inputs(env.rand({7, 3})), [](auto& v) { return autograd::abs(v[0]); }, exact, exact);
  compare(
      env, "clamp", inputs(env.rand({7, 3})), [](auto& v) { return autograd::clamp(v[0], -0.5f, 0.3f); }, exact, exact);
  compare(
      env, "relu", inputs(env.rand({5, 9})), [](auto& v) { return autograd::relu(v[0]); }, exact, exact);
  compare(
      env, "gelu", inputs(env.rand({5, 9}, -3, 3)), [](auto& v) { return autograd::gelu(v[0]); }, lib, lib);
  compare(
      env, "gelu tanh", inputs(env.rand({5, 9}, -3, 3)), [](auto& v) { return autograd::gelu(v[0], true); }, lib, lib);
  compare(
      env, "silu", inputs(env.rand({5, 9}, -3, 3)), [](auto& v) { return autograd::silu(v[0]); }, lib, lib);
  compare(
      env, "tanh", inputs(env.rand({5, 9}, -2, 2)), [](auto& v) { return autograd::tanh(v[0]); }, lib, lib);
  compare(
      env, "sigmoid", inputs(env.rand({5, 9}, -3, 3)), [](auto& v) { return autograd::sigmoid(v[0]); }, lib, lib);
  compare(
      env, "mish", inputs(env.rand({5, 9}, -3, 3)), [](auto& v) { return autograd::mish(v[0]); }, lib, lib);
}

TEST_CASE("autograd on CUDA: sum, mean, max; matmul (float and double) and linear") {
  if (test::skip_without_gpu()) return;
  Env env;
  const double exact = rtol(1, 4);
  compare(
      env, "sum", inputs(env.rand({4, 5, 3})), [](auto& v) { return autograd::sum(v[0]); }, exact, exact);
  compare(
      env, "mean dims", inputs(env.rand({4, 5, 3})),
      [](auto& v) {
        return autograd::mean(v[0], {0, -1}, true);
      },
      exact, exact);
  compare(
      env, "max", inputs(env.rand({4, 5, 3})), [](auto& v) { return autograd::max(v[0], 1); }, exact, exact);
  // matmul a (2, 1, 3, 7) @ b (4, 7, 5): values sum k = 7 terms; da sums n = 5 (and b's batch of 4 is not
  // broadcast for a... a's batch dim of 1 sums 4 products: 4 * 5 terms); db sums m * 2 = 3 * 2 terms.
  const auto mm = [](auto& v) { return matmul(v[0], v[1]); };
  compare(env, "matmul 2-D", inputs(env.rand({9, 7}), env.rand({7, 11})), mm, rtol(7, 16), rtol(11, 16));
  compare(env, "matmul broadcast", inputs(env.rand({2, 1, 3, 7}), env.rand({4, 7, 5})), mm, rtol(7, 16), rtol(20, 16));
  constexpr double kUlp64 = 1.0 / 4503599627370496.0;  // 2^-52: the fp64 GEMM (CUBLAS_COMPUTE_64F)
  compare<double>(env, "matmul double", inputs(env.rand<double>({2, 6, 9}), env.rand<double>({2, 9, 4})), mm,
                  16 * 9 * kUlp64, 16 * 9 * kUlp64);
  compare(
      env, "linear", inputs(env.rand({6, 10}), env.rand({5, 10}), env.rand({5})),
      [](auto& v) { return linear(v[0], v[1], v[2]); }, rtol(10, 16), rtol(6, 16));
  compare(
      env, "linear 3-D no bias", inputs(env.rand({2, 3, 8}), env.rand({4, 8})),
      [](auto& v) { return linear(v[0], v[1]); }, rtol(8, 16), rtol(6, 16));
}

TEST_CASE("autograd on CUDA: reshape, permute, transpose, narrow, concat, split, index_select") {
  if (test::skip_without_gpu()) return;
  Env env;
  const double exact = rtol(1, 4);
  compare(
      env, "reshape", inputs(env.rand({2, 3, 4})),
      [](auto& v) {
        return reshape(v[0], Shape{4, 6});
      },
      exact, exact);
  compare(
      env, "permute", inputs(env.rand({2, 3, 4, 5})),
      [](auto& v) {
        return permute(v[0], {3, 0, 2, 1});
      },
      exact, exact);
  compare(
      env, "transpose", inputs(env.rand({3, 4, 2})), [](auto& v) { return transpose(v[0], 0, -1); }, exact, exact);
  compare(
      env, "narrow", inputs(env.rand({3, 6, 2})), [](auto& v) { return narrow(v[0], 1, 2, 3); }, exact, exact);
  compare(
      env, "concat", inputs(env.rand({2, 1, 3}), env.rand({2, 4, 3})),
      [](auto& v) {
        return concat(std::vector{v[0], v[1]}, 1);
      },
      exact, exact);
  compare(
      env, "split", inputs(env.rand({5, 2})),
      [](auto& v) {
        auto parts = split(v[0], {2, 3}, 0);
        return concat(std::vector{parts[1] * 2.0f, parts[0]}, 0);
      },
      exact, exact);
  const auto idx = Tensor<std::int64_t, Cpu>::from({5}, {2, 0, 2, 3, 2});  // 2 three times: its gradient sums 3
  const auto idx_gpu = env.up(idx);
  compare(
      env, "index_select", inputs(env.rand({3, 4, 2})),
      [&](auto& v) { return index_select(v[0], 1, on(v, idx, idx_gpu)); }, exact, rtol(3, 4));
  // Out-of-range indices are refused on the host with the CPU's words.
  const auto bad = env.up(Tensor<std::int64_t, Cpu>::from({2}, {1, 4}));
  auto x = Vg::leaf(env.up(env.rand({3, 4})), true, env.gpu);
  CHECK_THROWS_WITH_AS(index_select(x, 1, bad), doctest::Contains("index 4 at position 1 is out of range"), ValueError);
}

TEST_CASE("autograd on CUDA: softmax, log_softmax, cross_entropy, mse_loss, embedding, layer_norm, causal_attention, dropout") {
  if (test::skip_without_gpu()) return;
  Env env;
  compare(
      env, "softmax", inputs(env.rand({3, 2, 9}, -2, 2)), [](auto& v) { return softmax(v[0]); }, rtol(9, 16),
      rtol(9, 16));
  compare(
      env, "log_softmax dim 0", inputs(env.rand({6, 4}, -2, 2)), [](auto& v) { return log_softmax(v[0], 0); },
      rtol(6, 16), rtol(6, 16));
  const auto y = Tensor<std::int64_t, Cpu>::from({4}, {2, 0, 6, 2});
  const auto y_gpu = env.up(y);
  // The loss is a mean over N = 4 rows of C = 7 classes.
  compare(
      env, "cross_entropy", inputs(env.rand({4, 7}, -2, 2)),
      [&](auto& v) { return cross_entropy(v[0], on(v, y, y_gpu), 0.1); }, rtol(28, 16), rtol(7, 16));
  compare(
      env, "mse_loss", inputs(env.rand({3, 5}), env.rand({3, 5})), [](auto& v) { return mse_loss(v[0], v[1]); },
      rtol(15, 4), rtol(15, 4));
  const auto ids = Tensor<std::int64_t, Cpu>::from({2, 3}, {1, 4, 1, 0, 1, 2});  // 1 three times
  const auto ids_gpu = env.up(ids);
  compare(
      env, "embedding", inputs(env.rand({5, 3})), [&](auto& v) { return embedding(on(v, ids, ids_gpu), v[0]); },
      rtol(1, 4), rtol(3, 4));
  compare(
      env, "layer_norm", inputs(env.rand({2, 3, 8}, -2, 2), env.rand({8}), env.rand({8})),
      [](auto& v) { return layer_norm(v[0], v[1], v[2]); }, rtol(8, 16), rtol(8, 16));
  compare(
      env, "layer_norm no affine", inputs(env.rand({5, 6}, -2, 2)), [](auto& v) { return layer_norm(v[0]); },
      rtol(6, 16), rtol(6, 16));
  // Packed qkv (B 2, T 5, 3C 24), 2 heads of 4: each output sums T softmax-weighted values of hs products.
  compare(
      env, "causal_attention", inputs(env.rand({2, 5, 24}, -1, 1)),
      [](auto& v) { return causal_attention(v[0], 2); }, rtol(20, 16), rtol(20, 16));
  // The mask is a function of (seed, rank, stream, step) and the index on both devices: the same elements drop.
  const DropoutOptions o{.p = 0.3, .seed = 42, .step = 3};
  compare(
      env, "dropout", inputs(env.rand({16, 33})), [&o](auto& v) { return dropout(v[0], o); }, rtol(1, 4), rtol(1, 4));
}

TEST_CASE("autograd on CUDA: conv2d, max_pool2d, adaptive_avg_pool2d, batch_norm (NHWC)") {
  if (test::skip_without_gpu()) return;
  Env env;
  // x (2, 5, 4, 3), w (4, 3, 3, 3), stride (2, 1), padding 1 -> y (2, 3, 4, 4): y sums 27 products, dx 36, dw 24.
  compare(
      env, "conv2d", inputs(env.rand({2, 5, 4, 3}), env.rand({4, 3, 3, 3}), env.rand({4})),
      [](auto& v) {
        return conv2d(v[0], v[1], v[2], {.stride = {2, 1}, .padding = {1, 1}});
      },
      rtol(27, 16), rtol(36, 16));
  compare(
      env, "max_pool2d", inputs(env.rand({2, 4, 5, 3})),
      [](auto& v) {
        return max_pool2d(v[0], {2, 2}, {2, 1});
      },
      rtol(1, 4), rtol(1, 4));
  compare(
      env, "adaptive_avg_pool2d", inputs(env.rand({2, 5, 3, 2})),
      [](auto& v) {
        return adaptive_avg_pool2d(v[0], {2, 2});
      },
      rtol(6, 4), rtol(1, 4));
  // Training batch norm over N*H*W = 12 positions; the running statistics are compared too.
  Th rm_c(Shape{4}), rv_c(Shape{4});
  for (std::int64_t i = 0; i < 4; ++i) rm_c.data()[i] = 0.1f * static_cast<float>(i), rv_c.data()[i] = 1.0f;
  auto rm_g = env.up(rm_c), rv_g = env.up(rv_c);
  compare(
      env, "batch_norm train", inputs(env.rand({3, 2, 2, 4}, -2, 2), env.rand({4}), env.rand({4})),
      [&](auto& v) { return batch_norm(v[0], v[1], v[2], on(v, rm_c, rm_g), on(v, rv_c, rv_g)); }, rtol(12, 16),
      rtol(12, 16));
  expect_close("batch_norm running_mean", rm_c, env.down(rm_g), rtol(12, 4), env.seed);
  expect_close("batch_norm running_var", rv_c, env.down(rv_g), rtol(12, 4), env.seed);
  compare(
      env, "batch_norm eval", inputs(env.rand({5, 4}, -2, 2), env.rand({4}), env.rand({4})),
      [&](auto& v) { return batch_norm(v[0], v[1], v[2], on(v, rm_c, rm_g), on(v, rv_c, rv_g), {.training = false}); },
      rtol(1, 16), rtol(5, 16));
}

TEST_CASE("autograd on CUDA: one SGD step of a small op-written classifier matches the CPU's") {
  if (test::skip_without_gpu()) return;
  Env env;
  // logits = gelu(x W1^T + b1) @ W2 + b2; loss = cross_entropy(logits, y); W -= 0.5 dW; then the loss again.
  // x (8, 6), W1 (16, 6), b1 (16), W2 (16, 4), b2 (4). The longest chain of sums: 6 + 16 + 8 terms.
  const std::vector<Th> params = [&] {
    std::vector<Th> p;
    p.push_back(env.rand({16, 6}, -0.5, 0.5));
    p.push_back(env.rand({16}, -0.1, 0.1));
    p.push_back(env.rand({16, 4}, -0.5, 0.5));
    p.push_back(env.rand({4}, -0.1, 0.1));
    return p;
  }();
  const Th x = env.rand({8, 6});
  const auto y = Tensor<std::int64_t, Cpu>::from({8}, {0, 3, 1, 2, 2, 0, 3, 1});
  const double tol = rtol(6 + 16 + 8, 16);

  auto step = [&]<class D>(std::vector<Var<float, D>>& w, const Tensor<float, D>& xd, const Tensor<std::int64_t, D>& yd,
                           const Exec<D>& e) {
    auto xv = Var<float, D>::leaf(autograd::detail::clone(e, xd.cview()), false, e);
    auto forward = [&] { return cross_entropy(matmul(gelu(linear(xv, w[0], w[1])), w[2]) + w[3], yd); };
    forward().backward();
    for (auto& p : w) Kernels<D>::axpy(e, -0.5f, p.grad().cview(), p.node().value.view());
    NoGradGuard no_grad;
    return forward();
  };
  std::vector<Vc> wc;
  std::vector<Vg> wg;
  for (const auto& p : params) {
    wc.push_back(Vc::leaf(p.clone(), true));
    wg.push_back(Vg::leaf(env.up(p), true, env.gpu));
  }
  const Exec<Cpu> cpu{};
  const auto x_gpu = env.up(x);
  const auto y_gpu = env.up(y);
  const Vc after_c = step(wc, x, y, cpu);
  const Vg after_g = step(wg, x_gpu, y_gpu, env.gpu);
  for (std::size_t i = 0; i < params.size(); ++i)
    expect_close("parameter " + std::to_string(i) + " after the step", wc[i].value(), env.down(wg[i].value()), tol,
                 env.seed);
  expect_close("loss after the step", after_c.value(), env.down(after_g.value()), tol, env.seed);
}

}  // namespace test_cuda_autograd
