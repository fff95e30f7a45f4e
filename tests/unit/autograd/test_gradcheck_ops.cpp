// Every autograd op's backward against central finite differences in float64 (gradcheck.hpp), on random shapes
// that include broadcasting, size-1 dims and rank differences.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

#include <ddp/autograd/autograd.hpp>

#include "unit/autograd/gradcheck.hpp"

namespace test_gradcheck_ops {
using namespace ddp;
using namespace ddp::autograd;
using namespace ddp::test::gradcheck_support;

constexpr int kTrials = 4;

// Runs gradcheck on `trials` random (a, broadcast-of-a or a-broadcast-to) pairs for a binary op.
void check_binary(const char* name, const Fn& f, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 rng(7);
  for (int t = 0; t < kTrials; ++t) {
    const Shape s = rand_shape(rng, 1 + t % 4);
    const Shape b = rand_broadcast_of(rng, s);
    // Alternate which side is the broadcast one; trial 0 uses equal shapes.
    std::vector<In> xs;
    if (t % 2 == 0) {
      xs.push_back(rand(rng, s, lo, hi));
      xs.push_back(rand(rng, t == 0 ? s : b, lo, hi));
    } else {
      xs.push_back(rand(rng, b, lo, hi));
      xs.push_back(rand(rng, s, lo, hi));
    }
    gradcheck(name, std::move(xs), f);
  }
}

void check_unary(const char* name, const Fn& f, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 rng(11);
  for (int t = 0; t < kTrials; ++t) gradcheck(name, {rand(rng, rand_shape(rng, t % 4), lo, hi)}, f);
}

TEST_CASE("autograd gradcheck: add, sub, mul, div with broadcasting") {
  check_binary("add", [](std::vector<Vd>& v) { return v[0] + v[1]; });
  check_binary("sub", [](std::vector<Vd>& v) { return v[0] - v[1]; });
  check_binary("mul", [](std::vector<Vd>& v) { return v[0] * v[1]; });
  check_binary("div", [](std::vector<Vd>& v) { return v[0] / v[1]; }, 0.5, 2.0);
  // Both operands broadcast: (3, 1) and (1, 4) -> (3, 4); a scalar operand.
  std::mt19937_64 rng(3);
  gradcheck("mul (3,1)x(1,4)", {rand(rng, {3, 1}), rand(rng, {1, 4})}, [](std::vector<Vd>& v) { return v[0] * v[1]; });
  gradcheck("div (2,3,1)/(4,)", {rand(rng, {2, 3, 1}), rand(rng, {4}, 0.5, 2.0)},
            [](std::vector<Vd>& v) { return v[0] / v[1]; });
  gradcheck("scalar ops", {rand(rng, {2, 3})},
            [](std::vector<Vd>& v) { return (2.0 * v[0] + 1.0) / 3.0 - (1.0 - v[0]) * 0.5 + 1.0 / (v[0] + 3.0); });
  // One value as both operands (its gradient arrives twice from one node), and chains of same-shape add/sub.
  gradcheck("x + x, x - x * 3 - x", {rand(rng, {2, 3})},
            [](std::vector<Vd>& v) { return (v[0] + v[0]) * (v[0] - v[0] * 3.0 - v[0]); });
}

TEST_CASE("autograd gradcheck: neg, exp, log, pow, sqrt, rsqrt, abs, clamp") {
  check_unary("neg", [](std::vector<Vd>& v) { return -v[0]; });
  check_unary("exp", [](std::vector<Vd>& v) { return autograd::exp(v[0]); });
  check_unary("log", [](std::vector<Vd>& v) { return autograd::log(v[0]); }, 0.2, 3.0);
  check_unary("pow 3", [](std::vector<Vd>& v) { return autograd::pow(v[0], 3.0); });
  check_unary("pow -1.5", [](std::vector<Vd>& v) { return autograd::pow(v[0], -1.5); }, 0.3, 2.0);
  check_unary("sqrt", [](std::vector<Vd>& v) { return autograd::sqrt(v[0]); }, 0.2, 3.0);
  check_unary("rsqrt", [](std::vector<Vd>& v) { return autograd::rsqrt(v[0]); }, 0.2, 3.0);
  check_unary("abs", [](std::vector<Vd>& v) { return autograd::abs(v[0]); });
  check_unary("clamp", [](std::vector<Vd>& v) { return autograd::clamp(v[0], -0.5, 0.3); });
}

TEST_CASE("autograd gradcheck: relu, gelu (both forms), silu, tanh, sigmoid, mish") {
  check_unary("relu", [](std::vector<Vd>& v) { return autograd::relu(v[0]); });
  check_unary("gelu", [](std::vector<Vd>& v) { return autograd::gelu(v[0]); }, -3.0, 3.0);
  check_unary("gelu tanh", [](std::vector<Vd>& v) { return autograd::gelu(v[0], true); }, -3.0, 3.0);
  check_unary("silu", [](std::vector<Vd>& v) { return autograd::silu(v[0]); }, -3.0, 3.0);
  check_unary("tanh", [](std::vector<Vd>& v) { return autograd::tanh(v[0]); }, -2.0, 2.0);
  check_unary("sigmoid", [](std::vector<Vd>& v) { return autograd::sigmoid(v[0]); }, -3.0, 3.0);
  check_unary("mish", [](std::vector<Vd>& v) { return autograd::mish(v[0]); }, -3.0, 3.0);
}

TEST_CASE("autograd gradcheck: sum, mean (all, dims, keepdim), max over a dim") {
  std::mt19937_64 rng(5);
  for (int t = 0; t < kTrials; ++t) {
    const Shape s = rand_shape(rng, 2 + t % 3);
    gradcheck("sum", {rand(rng, s)}, [](std::vector<Vd>& v) { return autograd::sum(v[0]); });
    gradcheck("mean", {rand(rng, s)}, [](std::vector<Vd>& v) { return autograd::mean(v[0]); });
    gradcheck("sum dims 0,-1", {rand(rng, s)}, [](std::vector<Vd>& v) { return autograd::sum(v[0], {0, -1}); });
    gradcheck("mean dim 1 keepdim", {rand(rng, s)}, [](std::vector<Vd>& v) { return autograd::mean(v[0], {1}, true); });
    gradcheck("max dim -1", {rand(rng, s)}, [](std::vector<Vd>& v) { return autograd::max(v[0], -1); });
    gradcheck("max dim 0 keepdim", {rand(rng, s)}, [](std::vector<Vd>& v) { return autograd::max(v[0], 0, true); });
  }
}

TEST_CASE("autograd gradcheck: matmul (2-D, batched, broadcast batch dims) and linear") {
  std::mt19937_64 rng(9);
  const auto mm = [](std::vector<Vd>& v) { return matmul(v[0], v[1]); };
  gradcheck("matmul 2-D", {rand(rng, {3, 4}), rand(rng, {4, 2})}, mm);
  gradcheck("matmul batched", {rand(rng, {2, 3, 4}), rand(rng, {2, 4, 5})}, mm);
  gradcheck("matmul broadcast b", {rand(rng, {2, 3, 4}), rand(rng, {4, 2})}, mm);
  gradcheck("matmul broadcast both", {rand(rng, {2, 1, 3, 2}), rand(rng, {3, 2, 4})}, mm);
  gradcheck("matmul size-1", {rand(rng, {1, 1}), rand(rng, {1, 3})}, mm);
  gradcheck("linear", {rand(rng, {5, 3}), rand(rng, {4, 3}), rand(rng, {4})},
            [](std::vector<Vd>& v) { return linear(v[0], v[1], v[2]); });
  gradcheck("linear 3-D no bias", {rand(rng, {2, 3, 3}), rand(rng, {2, 3})},
            [](std::vector<Vd>& v) { return linear(v[0], v[1]); });
}

TEST_CASE("autograd gradcheck: reshape, transpose, permute, narrow, concat, split, index_select") {
  std::mt19937_64 rng(13);
  gradcheck("reshape", {rand(rng, {2, 3, 2})}, [](std::vector<Vd>& v) { return reshape(v[0], Shape{3, 4}); });
  gradcheck("transpose", {rand(rng, {2, 3, 4})}, [](std::vector<Vd>& v) { return transpose(v[0], 0, -1); });
  gradcheck("permute", {rand(rng, {2, 3, 4, 1})}, [](std::vector<Vd>& v) { return permute(v[0], {2, 0, 3, 1}); });
  gradcheck("narrow", {rand(rng, {3, 5, 2})}, [](std::vector<Vd>& v) { return narrow(v[0], 1, 1, 3); });
  gradcheck("concat", {rand(rng, {2, 1, 3}), rand(rng, {2, 4, 3}), rand(rng, {2, 2, 3})},
            [](std::vector<Vd>& v) { return concat<double, Cpu>({v[0], v[1], v[2]}, 1); });
  gradcheck("split", {rand(rng, {5, 2})}, [](std::vector<Vd>& v) {
    auto parts = split(v[0], {2, 3}, 0);
    return concat<double, Cpu>({parts[1] * 2.0, parts[0]}, 0);  // both pieces reach the output
  });
  const auto idx = Tensor<std::int64_t, Cpu>::from({5}, {2, 0, 2, 3, 2});  // repeats: gradients add
  gradcheck("index_select", {rand(rng, {3, 4, 2})}, [&idx](std::vector<Vd>& v) { return index_select(v[0], 1, idx); });
}

TEST_CASE("autograd gradcheck: softmax, log_softmax, cross_entropy, mse_loss") {
  std::mt19937_64 rng(17);
  gradcheck("softmax last", {rand(rng, {3, 4}, -2, 2)}, [](std::vector<Vd>& v) { return softmax(v[0]); });
  gradcheck("softmax dim 0", {rand(rng, {3, 2, 4}, -2, 2)}, [](std::vector<Vd>& v) { return softmax(v[0], 0); });
  gradcheck("log_softmax", {rand(rng, {2, 3, 5}, -2, 2)}, [](std::vector<Vd>& v) { return log_softmax(v[0], 1); });
  const auto y = Tensor<std::int64_t, Cpu>::from({4}, {2, 0, 4, 2});
  gradcheck("cross_entropy", {rand(rng, {4, 5}, -2, 2)}, [&y](std::vector<Vd>& v) { return cross_entropy(v[0], y); });
  gradcheck("cross_entropy smoothing", {rand(rng, {4, 5}, -2, 2)},
            [&y](std::vector<Vd>& v) { return cross_entropy(v[0], y, 0.1); });
  gradcheck("mse_loss", {rand(rng, {3, 4}), rand(rng, {3, 4})}, [](std::vector<Vd>& v) { return mse_loss(v[0], v[1]); });
}

TEST_CASE("autograd gradcheck: embedding, layer_norm, dropout") {
  std::mt19937_64 rng(19);
  const auto ids = Tensor<std::int64_t, Cpu>::from({2, 3}, {1, 4, 1, 0, 1, 2});  // repeats: rows add
  gradcheck("embedding", {rand(rng, {5, 3})}, [&ids](std::vector<Vd>& v) { return embedding(ids, v[0]); });
  gradcheck("layer_norm", {rand(rng, {2, 3, 4}, -2, 2), rand(rng, {4}), rand(rng, {4})},
            [](std::vector<Vd>& v) { return layer_norm(v[0], v[1], v[2]); });
  gradcheck("layer_norm no affine", {rand(rng, {3, 5}, -2, 2)}, [](std::vector<Vd>& v) { return layer_norm(v[0]); });
  const DropoutOptions o{.p = 0.3, .seed = 42, .step = 3};
  gradcheck("dropout", {rand(rng, {4, 6})}, [&o](std::vector<Vd>& v) { return dropout(v[0], o); });
  // Each element is dropped (0) or scaled by 1 / (1 - p); with p = 0.3 over 4000 elements both occur.
  auto x = Vd::leaf(rand(rng, {40, 100}, 0.5, 1.5), true);
  auto y = dropout(x, o);
  std::int64_t dropped = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    const double yi = y.value().data()[i], xi = x.value().data()[i];
    if (yi == 0.0) ++dropped;
    else CHECK(yi == doctest::Approx(xi / 0.7));
  }
  CHECK(dropped > 1000);
  CHECK(dropped < 1400);
  CHECK(dropout(x, DropoutOptions{.p = 0.3, .training = false}).value().data()[7] == x.value().data()[7]);
}

TEST_CASE("autograd gradcheck: causal_attention on packed qkv") {
  std::mt19937_64 rng(29);
  // (B, T, 3C) = (2, 4, 3 * 6) with 2 heads of 3, and one head of a single position.
  gradcheck("causal_attention", {rand(rng, {2, 4, 18}, -2, 2)},
            [](std::vector<Vd>& v) { return causal_attention(v[0], 2); });
  gradcheck("causal_attention T=1", {rand(rng, {1, 1, 6}, -2, 2)},
            [](std::vector<Vd>& v) { return causal_attention(v[0], 1); });
  CHECK_THROWS_AS(causal_attention(Vd::leaf(rand(rng, {2, 4, 18}), true), 4), ValueError);  // C = 6, 4 heads
}

TEST_CASE("autograd gradcheck: conv2d, max_pool2d, adaptive_avg_pool2d, batch_norm (NHWC)") {
  std::mt19937_64 rng(23);
  gradcheck("conv2d", {rand(rng, {2, 5, 4, 3}), rand(rng, {2, 3, 2, 3}), rand(rng, {2})},
            [](std::vector<Vd>& v) { return conv2d(v[0], v[1], v[2], {.stride = {2, 1}, .padding = {1, 1}}); });
  gradcheck("max_pool2d", {rand(rng, {2, 4, 5, 2})},
            [](std::vector<Vd>& v) { return max_pool2d(v[0], {2, 2}, {2, 1}); });
  gradcheck("adaptive_avg_pool2d", {rand(rng, {2, 5, 3, 2})},
            [](std::vector<Vd>& v) { return adaptive_avg_pool2d(v[0], {2, 2}); });
  gradcheck("batch_norm train", {rand(rng, {3, 2, 2, 4}, -2, 2), rand(rng, {4}), rand(rng, {4})},
            [](std::vector<Vd>& v) {
              auto rm = Td::zeros({4}), rv = Td::full({4}, 1.0);
              return batch_norm(v[0], v[1], v[2], rm, rv);
            });
  gradcheck("batch_norm eval (N, C)", {rand(rng, {5, 3}, -2, 2), rand(rng, {3}), rand(rng, {3})},
            [](std::vector<Vd>& v) {
              auto rm = Td::from({3}, {0.1, -0.2, 0.3}), rv = Td::from({3}, {0.5, 1.5, 2.0});
              return batch_norm(v[0], v[1], v[2], rm, rv, {.training = false});
            });
}

}  // namespace test_gradcheck_ops
