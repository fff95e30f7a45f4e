// nn: LayerNorm, GELU (exact and tanh) and Embedding against PyTorch (make_transformer_reference.py), float32,
// forward and backward through the modules, with 1 and 2 threads. Dropout is left out: torch draws its mask
// from its own generator, so only the statistics can be compared (tests/unit/nn/test_transformer_modules.cpp).
// SPDX-License-Identifier: MIT
//
// Tolerance: |ddp - torch| <= 1e-5 * (|torch| + rms(torch)) per element: relative error 1e-5, with the tensor's
// RMS as the floor for elements near zero. The largest error of each op is printed ("max rel err").
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include <ddp/nn/embedding.hpp>
#include <ddp/nn/gelu.hpp>
#include <ddp/nn/layer_norm.hpp>
#include <ddp/tensor/tensor.hpp>

#include "reference_file.hpp"

// Named, not anonymous: reference_torch may be compiled as one translation unit with test_torch_ops.cpp.
namespace transformer_ref {

using ddp::Cpu;
using ddp::Exec;
using ddp::Shape;
using ddp::Tensor;
using ddp::TensorView;

inline const ddp::test::RefFile& ref() {
  static const ddp::test::RefFile r = ddp::test::RefFile::generate("make_transformer_reference.py");
  return r;
}

inline Shape shape_of(const ddp::test::RefTensor& r) {
  switch (r.dims.size()) {
    case 1:
      return Shape{r.dims[0]};
    case 2:
      return Shape{r.dims[0], r.dims[1]};
    case 3:
      return Shape{r.dims[0], r.dims[1], r.dims[2]};
    default:
      throw std::runtime_error("unsupported reference rank");
  }
}

// A reference tensor as is (row-major, torch's shape, which is ddp's for these modules).
inline Tensor<float, Cpu> get(const std::string& name) {
  const auto& r = ref().at(name);
  auto t = Tensor<float, Cpu>::empty(shape_of(r));
  for (std::int64_t k = 0; k < t.numel(); ++k) t.data()[k] = static_cast<float>(r.f[static_cast<std::size_t>(k)]);
  return t;
}
inline Tensor<std::int64_t, Cpu> get_ids(const std::string& name) {
  const auto& r = ref().at(name);
  auto t = Tensor<std::int64_t, Cpu>::empty(shape_of(r));
  std::copy(r.i.begin(), r.i.end(), t.data());
  return t;
}

// The largest relative error seen per op, printed at exit.
struct Worst {
  std::map<std::string, double> by_op;
  ~Worst() {
    for (const auto& [op, e] : by_op) std::printf("max rel err vs torch: %-22s %.3g\n", op.c_str(), e);
  }
};
inline Worst& worst() {
  static Worst w;
  return w;
}

inline void check_close(TensorView<const float, Cpu> got, const Tensor<float, Cpu>& want, const std::string& op,
                        const std::string& what) {
  CAPTURE(op);
  CAPTURE(what);
  REQUIRE(got.shape() == want.shape());
  double ss = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) ss += double(want.data()[i]) * want.data()[i];
  const double rms = std::sqrt(ss / double(std::max<std::int64_t>(want.numel(), 1)));
  double e_max = 0;
  std::int64_t at = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const double w = want.data()[i], g = got.data()[i];
    const double e = std::abs(g - w) / (std::abs(w) + rms + 1e-30);
    if (!(e <= e_max)) {
      e_max = e;
      at = i;
    }
  }
  CAPTURE(at);
  CAPTURE(got.data()[at]);
  CAPTURE(want.data()[at]);
  CHECK(e_max <= 1e-5);
  double& w = worst().by_op[op + " " + what];
  w = std::max(w, e_max);
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

}  // namespace transformer_ref

namespace tfref = transformer_ref;

TEST_SUITE("nn") {
  TEST_CASE("LayerNorm forward and backward equal PyTorch's") {
    for (std::int64_t i = 0; i < tfref::ref().int_at("ln/count"); ++i) {
      const std::string c = "ln" + std::to_string(i);
      CAPTURE(c);
      const auto x = tfref::get(c + "/x"), dy = tfref::get(c + "/dy");
      const bool affine = tfref::ref().int_at(c + "/affine") != 0;
      tfref::with_threads([&](ddp::Exec<ddp::Cpu>& exec) {
        ddp::nn::LayerNorm<float, ddp::Cpu> ln(
            {.normalized_shape = x.dim(-1), .eps = tfref::ref().float_at(c + "/eps"), .elementwise_affine = affine});
        if (affine) {
          const auto w = tfref::get(c + "/weight"), b = tfref::get(c + "/bias");
          std::copy(w.data(), w.data() + w.numel(), ln.weight()->value().data());
          std::copy(b.data(), b.data() + b.numel(), ln.bias()->value().data());
        }
        ln.zero_grad();
        auto y = ln.forward(exec, x.cview());
        tfref::check_close(y.cview(), tfref::get(c + "/y"), "layer_norm", "y");
        auto dx = ln.backward(exec, dy.cview());
        tfref::check_close(dx.cview(), tfref::get(c + "/dx"), "layer_norm", "dx");
        if (affine) {
          tfref::check_close(ln.weight()->grad().cview(), tfref::get(c + "/dweight"), "layer_norm", "dweight");
          tfref::check_close(ln.bias()->grad().cview(), tfref::get(c + "/dbias"), "layer_norm", "dbias");
        }
      });
    }
  }

  TEST_CASE("GELU, exact and tanh forms, forward and backward equal PyTorch's (and minGPT's NewGELU)") {
    const auto x = tfref::get("gelu/x"), dy = tfref::get("gelu/dy");
    const std::pair<const char*, ddp::nn::GeluApproximate> forms[] = {{"none", ddp::nn::GeluApproximate::None},
                                                                      {"tanh", ddp::nn::GeluApproximate::Tanh},
                                                                      {"newgelu", ddp::nn::GeluApproximate::Tanh}};
    for (const auto& [name, form] : forms) {
      const std::string c = std::string("gelu_") + name;
      tfref::with_threads([&](ddp::Exec<ddp::Cpu>& exec) {
        ddp::nn::GELU<float, ddp::Cpu> gelu(form);
        auto y = gelu.forward(exec, x.cview());
        tfref::check_close(y.cview(), tfref::get(c + "/y"), c, "y");
        auto dx = gelu.backward(exec, dy.cview());
        tfref::check_close(dx.cview(), tfref::get(c + "/dx"), c, "dx");
      });
    }
  }

  TEST_CASE("Embedding forward and weight gradient equal PyTorch's") {
    for (std::int64_t i = 0; i < tfref::ref().int_at("emb/count"); ++i) {
      const std::string c = "emb" + std::to_string(i);
      CAPTURE(c);
      const auto w = tfref::get(c + "/weight"), dy = tfref::get(c + "/dy");
      const auto ids = tfref::get_ids(c + "/ids");
      tfref::with_threads([&](ddp::Exec<ddp::Cpu>& exec) {
        ddp::nn::Embedding<float, ddp::Cpu> emb({.num_embeddings = w.dim(0), .embedding_dim = w.dim(1)});
        std::copy(w.data(), w.data() + w.numel(), emb.weight().value().data());
        emb.zero_grad();
        auto y = emb.forward(exec, ids.cview());
        tfref::check_close(y.cview(), tfref::get(c + "/y"), "embedding", "y");
        emb.backward(exec, dy.cview());
        tfref::check_close(emb.weight().grad().cview(), tfref::get(c + "/dweight"), "embedding", "dweight");
      });
    }
  }
}
