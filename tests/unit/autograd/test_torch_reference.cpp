// Every autograd op's value and input gradients against torch.autograd 1.13 on the same float64 inputs and seed
// gradient (make_autograd_reference.py, run at test time by /usr/bin/python3; skipped when torch is missing).
// Tolerance |ours - torch| <= 1e-12 + 1e-10 |torch|: float64 on both sides, sums in another order.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ddp/autograd/autograd.hpp>

// unit_autograd is globbed (tests/CMakeLists.txt) without the reference tests' compile definitions; this file
// reads the reference with RefFile::read and runs its own script, so generate()'s paths only need to compile.
#ifndef DDP_TEST_PYTHON
#define DDP_TEST_PYTHON "/usr/bin/python3"
#endif
#ifndef DDP_REFERENCE_DIR
#define DDP_REFERENCE_DIR "tests/interop/reference"
#define DDP_REFERENCE_OUT "."
#endif
#include "interop/reference/reference_file.hpp"
#include "support/skip.hpp"
#include "support/temp_dir.hpp"
#include "unit/autograd/gradcheck.hpp"

namespace test_torch_reference {
using namespace ddp;
using namespace ddp::autograd;
using ddp::test::gradcheck_support::Td;
using ddp::test::gradcheck_support::Vd;
using I64 = Tensor<std::int64_t, Cpu>;
using Op = std::function<Vd(std::vector<Vd>&, const I64&)>;

// The ops, by the case names of make_autograd_reference.py.
const std::map<std::string, Op>& ops() {
  using V = std::vector<Vd>;
  static const std::map<std::string, Op> m = {
      {"add", [](V& v, const I64&) { return v[0] + v[1]; }},
      {"sub", [](V& v, const I64&) { return v[0] - v[1]; }},
      {"mul", [](V& v, const I64&) { return v[0] * v[1]; }},
      {"div", [](V& v, const I64&) { return v[0] / v[1]; }},
      {"scalar",
       [](V& v, const I64&) { return (2.0 * v[0] + 1.0) / 3.0 - (1.0 - v[0]) * 0.5 + 1.0 / (v[0] + 3.0); }},
      {"neg", [](V& v, const I64&) { return -v[0]; }},
      {"exp", [](V& v, const I64&) { return autograd::exp(v[0]); }},
      {"log", [](V& v, const I64&) { return autograd::log(v[0]); }},
      {"pow", [](V& v, const I64&) { return autograd::pow(v[0], 2.5); }},
      {"sqrt", [](V& v, const I64&) { return autograd::sqrt(v[0]); }},
      {"rsqrt", [](V& v, const I64&) { return autograd::rsqrt(v[0]); }},
      {"abs", [](V& v, const I64&) { return autograd::abs(v[0]); }},
      {"clamp", [](V& v, const I64&) { return autograd::clamp(v[0], -0.3, 0.4); }},
      {"relu", [](V& v, const I64&) { return autograd::relu(v[0]); }},
      {"gelu", [](V& v, const I64&) { return autograd::gelu(v[0]); }},
      {"gelu_tanh", [](V& v, const I64&) { return autograd::gelu(v[0], true); }},
      {"silu", [](V& v, const I64&) { return autograd::silu(v[0]); }},
      {"tanh", [](V& v, const I64&) { return autograd::tanh(v[0]); }},
      {"sigmoid", [](V& v, const I64&) { return autograd::sigmoid(v[0]); }},
      {"mish", [](V& v, const I64&) { return autograd::mish(v[0]); }},
      {"sum_all", [](V& v, const I64&) { return autograd::sum(v[0]); }},
      {"sum_dims", [](V& v, const I64&) { return autograd::sum(v[0], {0, 2}, true); }},
      {"mean_dim", [](V& v, const I64&) { return autograd::mean(v[0], {1}); }},
      {"mean_all", [](V& v, const I64&) { return autograd::mean(v[0]); }},
      {"max_dim", [](V& v, const I64&) { return autograd::max(v[0], 1); }},
      {"matmul", [](V& v, const I64&) { return matmul(v[0], v[1]); }},
      {"matmul_bcast", [](V& v, const I64&) { return matmul(v[0], v[1]); }},
      {"linear", [](V& v, const I64&) { return linear(v[0], v[1], v[2]); }},
      {"reshape", [](V& v, const I64&) { return reshape(v[0], Shape{3, 4}); }},
      {"transpose", [](V& v, const I64&) { return transpose(v[0], 0, 2); }},
      {"permute", [](V& v, const I64&) { return permute(v[0], {2, 0, 3, 1}); }},
      {"narrow", [](V& v, const I64&) { return narrow(v[0], 1, 1, 3); }},
      {"concat", [](V& v, const I64&) { return concat<double, Cpu>({v[0], v[1]}, 1); }},
      {"split",
       [](V& v, const I64&) {
         auto p = split(v[0], {2, 3}, 0);
         return concat<double, Cpu>({p[1] * 2.0, p[0]}, 0);
       }},
      {"index_select", [](V& v, const I64& i) { return index_select(v[0], 1, i); }},
      {"softmax", [](V& v, const I64&) { return softmax(v[0], 1); }},
      {"log_softmax", [](V& v, const I64&) { return log_softmax(v[0]); }},
      {"cross_entropy", [](V& v, const I64& t) { return cross_entropy(v[0], t); }},
      {"cross_entropy_smooth", [](V& v, const I64& t) { return cross_entropy(v[0], t, 0.1); }},
      {"mse_loss", [](V& v, const I64&) { return mse_loss(v[0], v[1]); }},
      {"embedding", [](V& v, const I64& i) { return embedding(i, v[0]); }},
      {"layer_norm", [](V& v, const I64&) { return layer_norm(v[0], v[1], v[2], 1e-5); }},
      {"layer_norm_plain", [](V& v, const I64&) { return layer_norm(v[0], {}, {}, 1e-6); }},
      {"causal_attention", [](V& v, const I64&) { return causal_attention(v[0], 2); }},
      {"conv2d",
       [](V& v, const I64&) {
         return conv2d(v[0], v[1], v[2], {.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 2}});
       }},
      {"conv2d_nobias", [](V& v, const I64&) { return conv2d(v[0], v[1], {}, {.padding = {1, 1}}); }},
      {"max_pool2d", [](V& v, const I64&) { return max_pool2d(v[0], {3, 3}, {2, 2}, {1, 1}); }},
      {"adaptive_avg_pool2d", [](V& v, const I64&) { return adaptive_avg_pool2d(v[0], {2, 3}); }},
      {"batch_norm",
       [](V& v, const I64&) {
         auto rm = Td::zeros({5}), rv = Td::full({5}, 1.0);
         return batch_norm(v[0], v[1], v[2], rm, rv);
       }},
      {"mlp",
       [](V& v, const I64& t) {
         return cross_entropy(linear(autograd::gelu(linear(v[0], v[1], v[2])), v[3]) + autograd::sum(v[1] * v[1]), t);
       }},
  };
  return m;
}

Td to_tensor(const test::RefTensor& r) {
  Td t(Shape(r.dims));
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = r.f[static_cast<std::size_t>(i)];
  return t;
}

void expect_close(const Td& ours, const test::RefTensor& want, const std::string& what) {
  REQUIRE_MESSAGE(ours.shape() == to_tensor(want).shape(), what, ": shape ", ours.shape());
  for (std::int64_t i = 0; i < ours.numel(); ++i) {
    const double w = want.f[static_cast<std::size_t>(i)], g = ours.data()[i];
    INFO(what, "[", i, "]: ours ", g, " torch ", w);
    CHECK(std::abs(g - w) <= 1e-12 + 1e-10 * std::abs(w));
  }
}

TEST_CASE("autograd ops against torch.autograd 1.13 (float64 values and gradients)") {
  test::TempDir dir("ddp_autograd_ref_");
  const std::string out = dir.file("ref.bin");
  const std::string script =
      (std::filesystem::path(__FILE__).parent_path() / "make_autograd_reference.py").string();
  const int rc = std::system((std::string(DDP_TEST_PYTHON) + " " + script + " " + out).c_str());
  const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  if (code == 77) return test::note_skipped("make_autograd_reference.py: torch is not importable by /usr/bin/python3");
  REQUIRE_MESSAGE(code == 0, "make_autograd_reference.py failed (exit ", code, ")");
  const test::RefFile ref = test::RefFile::read(out);
  std::string names;
  for (auto c : ref.at("cases").i) names.push_back(static_cast<char>(c));
  int checked = 0;
  for (std::size_t at = 0; at < names.size();) {
    const std::size_t end = std::min(names.find('\n', at), names.size());
    const std::string name = names.substr(at, end - at);
    at = end + 1;
    CAPTURE(name);
    REQUIRE_MESSAGE(ops().count(name), "no ddp op for reference case ", name);
    std::vector<Vd> in;
    for (int k = 0; ref.has(name + "/in" + std::to_string(k)); ++k)
      in.push_back(Vd::leaf(to_tensor(ref.at(name + "/in" + std::to_string(k))), true));
    I64 idx;
    if (ref.has(name + "/idx")) {
      const auto& r = ref.at(name + "/idx");
      idx = I64(Shape(r.dims));
      for (std::int64_t i = 0; i < idx.numel(); ++i) idx.data()[i] = r.i[static_cast<std::size_t>(i)];
    }
    Vd y = ops().at(name)(in, idx);
    expect_close(y.value(), ref.at(name + "/out"), name + " value");
    y.backward(to_tensor(ref.at(name + "/seed")));
    for (std::size_t k = 0; k < in.size(); ++k)
      expect_close(in[k].grad(), ref.at(name + "/grad" + std::to_string(k)), name + " grad" + std::to_string(k));
    ++checked;
  }
  CHECK(checked == static_cast<int>(ops().size()));
  std::printf("autograd: %d ops match torch.autograd\n", checked);
}

}  // namespace test_torch_reference
