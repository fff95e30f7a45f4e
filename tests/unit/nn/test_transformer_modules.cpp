// Transformer modules (issue 19): Embedding, LayerNorm, GELU and Dropout. Finite differences in double for every
// input and parameter gradient, Dropout's mask statistics and reproducibility (docs/decisions/0043), and
// the errors for bad inputs (messages pinned). Equality with PyTorch: tests/interop/reference/test_transformer_ops.cpp.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ddp/nn/dropout.hpp>
#include <ddp/nn/embedding.hpp>
#include <ddp/nn/gelu.hpp>
#include <ddp/nn/layer_norm.hpp>
#include <ddp/tensor/random.hpp>

#include "random_tensor.hpp"

using namespace ddp;

// Named, not anonymous: unit_nn may be compiled as one translation unit (tests/CMakeLists.txt, DDP_UNITY_TESTS).
namespace gptmods_test {

// sum(y * r): the scalar whose gradient backward(r) computes.
inline double weighted_sum(const Tensor<double, Cpu>& y, const Tensor<double, Cpu>& r) {
  REQUIRE(y.shape() == r.shape());
  double s = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) s += y.data()[i] * r.data()[i];
  return s;
}

// Compares analytic[i] with the central difference of loss() in v[i], for every i < n.
inline void check_finite_differences(double* v, const double* analytic, std::int64_t n,
                                     const std::function<double()>& loss, const std::string& what) {
  const double h = 1e-6;
  for (std::int64_t i = 0; i < n; ++i) {
    const double saved = v[i];
    v[i] = saved + h;
    const double up = loss();
    v[i] = saved - h;
    const double down = loss();
    v[i] = saved;
    const double numeric = (up - down) / (2 * h);
    INFO(what << "[" << i << "]: analytic " << analytic[i] << " numeric " << numeric);
    CHECK(std::abs(analytic[i] - numeric) <= 1e-7 + 1e-6 * std::abs(numeric));
  }
}

// Fraction of zeros in y.
inline double zero_fraction(const Tensor<float, Cpu>& y) {
  std::int64_t zeros = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) zeros += y.data()[i] == 0.0f;
  return static_cast<double>(zeros) / static_cast<double>(y.numel());
}

inline bool same_values(const Tensor<float, Cpu>& a, const Tensor<float, Cpu>& b) {
  if (!(a.shape() == b.shape())) return false;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    if (a.data()[i] != b.data()[i]) return false;
  return true;
}

// x with every element in [1, 2): never 0, so a 0 in dropout's output is a dropped element.
inline Tensor<float, Cpu> ones_plus_uniform(Shape s, std::uint64_t seed) {
  Tensor<float, Cpu> t(s);
  Generator g(seed, 0, kStreamData);
  g.fill_uniform(t.view(), 1.0, 2.0);
  return t;
}

}  // namespace gptmods_test

TEST_SUITE("nn") {
  TEST_CASE("transformer modules: finite differences of LayerNorm (affine, no bias, no affine), double") {
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> exec{.pool = &pool};
    for (int variant = 0; variant < 3; ++variant) {
      CAPTURE(variant);
      nn::LayerNorm<double, Cpu> ln({.normalized_shape = 8, .elementwise_affine = variant != 2, .bias = variant == 0});
      for (auto* p : ln.parameters()) {
        auto r = ddp::test::randn<double>(p->shape(), 40 + variant, 0.5, 1.0);
        std::copy(r.data(), r.data() + r.numel(), p->value().data());
      }
      auto x = ddp::test::randn<double>({2, 3, 8}, 41, 0.3, 2.0);
      const auto r = ddp::test::randn<double>({2, 3, 8}, 42);
      ln.zero_grad();
      auto y = ln.forward(exec, x.cview());
      CHECK(y.shape() == Shape{2, 3, 8});
      auto dx = ln.backward(exec, r.cview());
      REQUIRE(dx.shape() == x.shape());
      auto loss = [&] { return gptmods_test::weighted_sum(ln.forward(exec, x.cview()), r); };
      gptmods_test::check_finite_differences(x.data(), dx.data(), x.numel(), loss, "dx");
      for (auto* p : ln.parameters())
        gptmods_test::check_finite_differences(p->value().data(), p->grad().data(), p->numel(), loss, p->name());
    }
  }

  TEST_CASE("transformer modules: LayerNorm normalises each row; names, defaults and describe() follow torch") {
    kernels::cpu::ThreadPool pool(1);
    Exec<Cpu> exec{.pool = &pool};
    nn::LayerNorm<float, Cpu> ln({.normalized_shape = 2});
    CHECK(ln.describe() == "LayerNorm((2,), eps=1e-05, elementwise_affine=True)");
    CHECK(ln.state_dict_keys() == std::vector<std::string>{"weight", "bias"});
    CHECK(ln.weight()->value().data()[1] == 1.0f);
    CHECK(ln.bias()->value().data()[1] == 0.0f);
    // Row (1, 3): mean 2, var 1 -> (-1, 1) / sqrt(1 + eps).
    auto x = Tensor<float, Cpu>::from({1, 2}, {1.0f, 3.0f});
    auto y = ln.forward(exec, x.cview());
    CHECK(y.data()[0] == doctest::Approx(-1.0 / std::sqrt(1.0 + 1e-5)).epsilon(1e-6));
    CHECK(y.data()[1] == doctest::Approx(1.0 / std::sqrt(1.0 + 1e-5)).epsilon(1e-6));
    nn::LayerNorm<float, Cpu> plain({.normalized_shape = 2, .elementwise_affine = false});
    CHECK(plain.parameters().empty());
    CHECK(plain.describe() == "LayerNorm((2,), eps=1e-05, elementwise_affine=False)");
  }

  TEST_CASE("transformer modules: finite differences of GELU, exact and tanh forms, double") {
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> exec{.pool = &pool};
    for (auto form : {nn::GeluApproximate::None, nn::GeluApproximate::Tanh}) {
      nn::GELU<double, Cpu> gelu(form);
      CAPTURE(gelu.describe());
      auto x = ddp::test::randn<double>({2, 3, 7}, 50, 0.0, 2.0);
      const auto r = ddp::test::randn<double>({2, 3, 7}, 51);
      gelu.forward(exec, x.cview());
      auto dx = gelu.backward(exec, r.cview());
      auto loss = [&] { return gptmods_test::weighted_sum(gelu.forward(exec, x.cview()), r); };
      gptmods_test::check_finite_differences(x.data(), dx.data(), x.numel(), loss, "dx");
    }
    // Pinned values: gelu(1) = Phi(1) = 0.8413447460685429; the tanh form gives 0.8411919906082768.
    auto one = Tensor<double, Cpu>::from({1}, {1.0});
    nn::GELU<double, Cpu> exact, tanh_form(nn::GeluApproximate::Tanh);
    CHECK(exact.forward(exec, one.cview()).data()[0] == doctest::Approx(0.8413447460685429).epsilon(1e-15));
    CHECK(tanh_form.forward(exec, one.cview()).data()[0] == doctest::Approx(0.8411919906082768).epsilon(1e-15));
    CHECK(exact.describe() == "GELU(approximate='none')");
    CHECK(tanh_form.describe() == "GELU(approximate='tanh')");
  }

  TEST_CASE("transformer modules: finite differences of Embedding's weight; gradients accumulate by token") {
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> exec{.pool = &pool};
    nn::Embedding<double, Cpu> emb({.num_embeddings = 7, .embedding_dim = 40});
    Generator gen(3);
    emb.reset_parameters(gen);
    // Token 2 three times, token 6 twice, tokens 1, 3 and 5 never.
    const auto ids = Tensor<std::int64_t, Cpu>::from({2, 4}, {2, 0, 6, 2, 4, 2, 6, 0});
    const auto r = ddp::test::randn<double>({2, 4, 40}, 61);
    emb.zero_grad();
    auto y = emb.forward(exec, ids.cview());
    REQUIRE(y.shape() == Shape{2, 4, 40});
    CHECK(y(1, 0, 5) == emb.weight().value()(4, 5));
    auto none = emb.backward(exec, r.cview());
    CHECK(none.numel() == 0);
    auto loss = [&] { return gptmods_test::weighted_sum(emb.forward(exec, ids.cview()), r); };
    gptmods_test::check_finite_differences(emb.weight().value().data(), emb.weight().grad().data(),
                                           emb.weight().numel(), loss, "weight");
    CHECK(emb.weight().grad()(3, 7) == 0.0);
    // A second backward accumulates (the scratch buffer is overwritten, unused rows included).
    const auto once = emb.weight().grad().clone();
    emb.forward(exec, ids.cview());
    emb.backward(exec, r.cview());
    for (std::int64_t i = 0; i < once.numel(); ++i) CHECK(emb.weight().grad().data()[i] == 2.0 * once.data()[i]);
    CHECK(emb.describe() == "Embedding(7, 40)");
    CHECK(emb.state_dict_keys() == std::vector<std::string>{"weight"});
  }

  TEST_CASE("transformer modules: Embedding's init std (torch's 1, minGPT's 0.02)") {
    for (double sd : {1.0, 0.02}) {
      nn::Embedding<float, Cpu> emb({.num_embeddings = 100, .embedding_dim = 100, .init_std = sd});
      Generator gen(5);
      emb.reset_parameters(gen);
      double ss = 0;
      const auto& w = emb.weight().value();
      for (std::int64_t i = 0; i < w.numel(); ++i) ss += double(w.data()[i]) * w.data()[i];
      CHECK(std::sqrt(ss / double(w.numel())) == doctest::Approx(sd).epsilon(0.03));
    }
  }

  TEST_CASE("transformer modules: Embedding rejects bad ids and floating-point input, naming the module") {
    kernels::cpu::ThreadPool pool(1);
    Exec<Cpu> exec{.pool = &pool};
    nn::Embedding<float, Cpu> emb({.num_embeddings = 5, .embedding_dim = 3});
    const auto bad = Tensor<std::int64_t, Cpu>::from({2, 3}, {0, 1, 2, 3, 4, 7});
    CHECK_THROWS_WITH_AS(emb.forward(exec, bad.cview()),
                         "ddp: module '<root>' (Embedding(5, 3)): token id 7 at position (1, 2) of ids (2, 3) is out "
                         "of range [0, 5); ids must be below num_embeddings (5): check the vocabulary size against the "
                         "data",
                         ValueError);
    const auto negative = Tensor<std::int64_t, Cpu>::from({4}, {0, -1, 2, 9});
    CHECK_THROWS_WITH_AS(emb.forward(exec, negative.cview()),
                         "ddp: module '<root>' (Embedding(5, 3)): token id -1 at position (1) of ids (4) is out of "
                         "range [0, 5); ids must be below num_embeddings (5): check the vocabulary size against the "
                         "data",
                         ValueError);
    // The module checks the ids once and tells the kernel (ids_checked); called directly, the kernels check them
    // (they must never read or write outside weight), naming themselves.
    auto y = Tensor<float, Cpu>::empty({4, 3});
    CHECK_THROWS_WITH_AS(
        Kernels<Cpu>::embedding_forward(
            exec,
            kernels::EmbeddingForwardArgs<float, Cpu>{
                .ids = negative.cview(), .weight = emb.weight().value().cview(), .y = y.view()}),
        "ddp: embedding_forward: token id -1 at position (1) of ids (4) is out of range [0, 5); ids must be below "
        "num_embeddings (5): check the vocabulary size against the data",
        ValueError);
    const auto dy = Tensor<float, Cpu>::zeros({4, 3});
    auto dweight = Tensor<float, Cpu>::empty({5, 3});
    CHECK_THROWS_WITH_AS(
        Kernels<Cpu>::embedding_backward(exec,
                                         kernels::EmbeddingBackwardArgs<float, Cpu>{
                                             .ids = negative.cview(), .dy = dy.cview(), .dweight = dweight.view()}),
        "ddp: embedding_backward: token id -1 at position (1) of ids (4) is out of range [0, 5); ids must be below "
        "num_embeddings (5): check the vocabulary size against the data",
        ValueError);
    const auto x = Tensor<float, Cpu>::zeros({2, 3});
    CHECK_THROWS_WITH_AS(emb.forward(exec, x.cview()),
                         "ddp: module '<root>' (Embedding(5, 3)): takes int64 token ids, got values of the model's "
                         "floating-point type (shape (2, 3)); pass the ids as a TensorView<const std::int64_t, D> to "
                         "forward(exec, ids)",
                         ValueError);
    // And a module of T values refuses ids, naming itself.
    nn::LayerNorm<float, Cpu> values_only({.normalized_shape = 3});
    CHECK_THROWS_WITH_AS(values_only.forward(exec, negative.cview()),
                         doctest::Contains("(LayerNorm((3,), eps=1e-05, elementwise_affine=True)): takes values of "
                                           "the model's floating-point type, got int64 token ids (shape (4)); only "
                                           "modules with an embedding (Embedding, GPT) take ids"),
                         ValueError);
    CHECK_THROWS_WITH_AS(emb.backward(exec, Tensor<float, Cpu>::zeros({2, 3, 3}).cview()),
                         "ddp: backward of module '<root>' (Embedding(5, 3)) called without a preceding forward (or "
                         "twice for one forward); call forward(x) before each backward(dy)",
                         ValueError);
    nn::LayerNorm<float, Cpu> ln({.normalized_shape = 4});
    CHECK_THROWS_WITH_AS(
        ln.forward(exec, x.cview()),
        "ddp: module '<root>' (LayerNorm((4,), eps=1e-05, elementwise_affine=True)): input (2, 3) "
        "must end in a dimension of 4 (the normalized_shape); the previous layer's output does not fit",
        ValueError);
    using DropoutF = nn::Dropout<float, Cpu>;
    const nn::DropoutOptions too_large{.p = 1.5};
    CHECK_THROWS_WITH_AS(DropoutF{too_large}, "ddp: Dropout's p must be in [0, 1], got 1.5", ValueError);
  }

  TEST_CASE("transformer modules: finite differences of Dropout's input gradient (mask replayed by step), double") {
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> exec{.pool = &pool};
    nn::Dropout<double, Cpu> drop({.p = 0.3, .seed = 11});
    auto x = ddp::test::randn<double>({3, 5, 4}, 70);
    const auto r = ddp::test::randn<double>({3, 5, 4}, 71);
    drop.set_step(4);
    drop.forward(exec, x.cview());
    CHECK(drop.step() == 5);
    auto dx = drop.backward(exec, r.cview());
    auto loss = [&] {
      drop.set_step(4);  // the same mask on every call
      return gptmods_test::weighted_sum(drop.forward(exec, x.cview()), r);
    };
    gptmods_test::check_finite_differences(x.data(), dx.data(), x.numel(), loss, "dx");
  }

  TEST_CASE("transformer modules: Dropout drops a fraction p, scales by 1/(1-p), and is the identity in eval") {
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> exec{.pool = &pool};
    const auto x = gptmods_test::ones_plus_uniform({4, 128, 200}, 80);  // 102400 elements
    const auto dy = gptmods_test::ones_plus_uniform({4, 128, 200}, 81);
    for (double p : {0.1, 0.5}) {
      CAPTURE(p);
      nn::Dropout<float, Cpu> drop({.p = p, .seed = 7});
      auto y = drop.forward(exec, x.cview());
      // 5 standard deviations of the dropped fraction: sqrt(p (1 - p) / n) <= 0.0016.
      CHECK(std::abs(gptmods_test::zero_fraction(y) - p) <= 0.008);
      const float scale = 1.0f / static_cast<float>(1.0 - p);
      auto dx = drop.backward(exec, dy.cview());
      for (std::int64_t i = 0; i < x.numel(); ++i) {
        const bool kept = y.data()[i] != 0.0f;
        if (!(y.data()[i] == (kept ? x.data()[i] * scale : 0.0f) &&
              dx.data()[i] == (kept ? dy.data()[i] * scale : 0.0f))) {
          FAIL_CHECK("element " << i << ": y " << y.data()[i] << " dx " << dx.data()[i]);
          break;
        }
      }
      drop.eval();
      const std::uint64_t step = drop.step();
      auto same = drop.forward(exec, x.cview());
      CHECK(gptmods_test::same_values(same, x));
      CHECK(gptmods_test::same_values(drop.backward(exec, dy.cview()), dy));
      CHECK(drop.step() == step);  // eval forwards draw nothing
    }
    nn::Dropout<float, Cpu> none({.p = 0.0});
    CHECK(gptmods_test::same_values(none.forward(exec, x.cview()), x));
    CHECK(gptmods_test::same_values(none.backward(exec, dy.cview()), dy));
    CHECK(none.step() == 1);  // a training forward counts even when it draws nothing
    nn::Dropout<float, Cpu> all({.p = 1.0});
    CHECK(gptmods_test::zero_fraction(all.forward(exec, x.cview())) == 1.0);
    CHECK(none.describe() == "Dropout(p=0)");
  }

  TEST_CASE("transformer modules: Dropout's mask is a function of (seed, rank, stream, step), not of threads") {
    kernels::cpu::ThreadPool one(1), two(2);
    Exec<Cpu> e1{.pool = &one}, e2{.pool = &two};
    const auto x = gptmods_test::ones_plus_uniform({2, 100000}, 90);  // 50000 Philox blocks: 2 chunks on 2 threads
    const nn::DropoutOptions o{.p = 0.25, .seed = 1234, .rank = 1, .stream = kStreamDropout};
    nn::Dropout<float, Cpu> a(o), b(o);
    auto ya = a.forward(e1, x.cview());
    auto yb = b.forward(e2, x.cview());
    CHECK(gptmods_test::same_values(ya, yb));
    // The documented formula: element i of step s is dropped iff word i % 4 of block (s << 32) + i / 4 of
    // Generator(seed, rank, stream) has (w + 0.5) / 2^32 < p.
    const Generator g(o.seed, o.rank, o.stream);
    std::int64_t mismatches = 0;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const auto w =
          g.block((std::uint64_t{0} << 32) + static_cast<std::uint64_t>(i / 4))[static_cast<std::size_t>(i % 4)];
      mismatches += (Generator::to_unit(w) < o.p) != (ya.data()[i] == 0.0f);
    }
    CHECK(mismatches == 0);
    // The next step draws another mask; setting the step back replays it (what a resumed run does).
    auto next = a.forward(e1, x.cview());
    CHECK_FALSE(gptmods_test::same_values(next, ya));
    a.set_step(0);
    CHECK(gptmods_test::same_values(a.forward(e2, x.cview()), ya));
    // Another rank, stream or seed: another mask.
    for (const nn::DropoutOptions& other :
         {nn::DropoutOptions{.p = 0.25, .seed = 1234, .rank = 0, .stream = o.stream},
          nn::DropoutOptions{.p = 0.25, .seed = 1234, .rank = 1, .stream = 300},
          nn::DropoutOptions{.p = 0.25, .seed = 1235, .rank = 1, .stream = o.stream}}) {
      nn::Dropout<float, Cpu> c(other);
      CHECK_FALSE(gptmods_test::same_values(c.forward(e1, x.cview()), ya));
    }
  }
}
