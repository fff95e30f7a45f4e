// DDP_CHECK_INPUTS (nn/check_inputs.hpp, issue 39): an input destroyed between forward and backward, its memory
// handed to a new tensor of the same size, makes backward throw a ValueError naming the module (Linear, Conv2d, a
// Sequential); an input kept alive gives the same gradients as with the check off (Linear's against dW = dy^T x in
// double); memory the pool did not hand out is not checked. With the check off the same program silently reads the
// new tensor: Linear's weight gradient is then dy^T (the new tensor's values), which this test also asserts.
// The GPU uses the same CachingPool class (tensor/cuda/allocator.hpp).
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <ddp/config.hpp>
#include <ddp/core/error.hpp>
#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/nn/check_inputs.hpp>
#include <ddp/nn/conv2d.hpp>
#include <ddp/nn/linear.hpp>
#include <ddp/nn/relu.hpp>
#include <ddp/nn/sequential.hpp>

#include "random_tensor.hpp"

using namespace ddp;

namespace test_freed_input {

// Turns the check on or off for one test case, then restores the process's mode.
struct CheckInputs {
  explicit CheckInputs(bool on) : before(nn::check_inputs_enabled()) { nn::set_check_inputs(on); }
  ~CheckInputs() { nn::set_check_inputs(before); }
  CheckInputs(const CheckInputs&) = delete;
  CheckInputs& operator=(const CheckInputs&) = delete;
  bool before;
};

inline void fill(Tensor<float, Cpu>& t, float v) {
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = v;
}

// forward(x); then, when `free_input`, destroys x and allocates a tensor of x's shape, which must take x's block
// (the pool hands out the last freed block of a size class first), filled with 1000; then backward(dy = 1).
// Returns that new tensor (empty when the input was kept) so that the caller can compare gradients with it.
inline Tensor<float, Cpu> forward_free_backward(nn::Module<float, Cpu>& m, Shape x_shape, bool free_input) {
  Exec<Cpu> exec;
  m.zero_grad();
  auto x = std::make_optional(test::randn<float>(x_shape, 7));
  Tensor<float, Cpu> y = m.forward(exec, x->cview());
  Tensor<float, Cpu> reuse;
  if (free_input) {
    const float* old = x->data();
    x.reset();
    reuse = Tensor<float, Cpu>(x_shape);
    REQUIRE(reuse.data() == old);  // the freed block was handed out again: deterministic reuse
    fill(reuse, 1000.0f);
  }
  Tensor<float, Cpu> dy(y.shape());
  fill(dy, 1.0f);
  m.backward(exec, dy.cview());
  return reuse;
}

inline std::vector<float> grads(nn::Module<float, Cpu>& m) {
  std::vector<float> out;
  for (auto* p : m.parameters())
    for (std::int64_t i = 0; i < p->numel(); ++i) out.push_back(p->grad().data()[i]);
  return out;
}

}  // namespace test_freed_input

using namespace test_freed_input;

TEST_CASE("DDP_CHECK_INPUTS: values of the variable") {
  CHECK_FALSE(nn::parse_check_inputs(std::nullopt));
  CHECK_FALSE(nn::parse_check_inputs(""));
  CHECK_FALSE(nn::parse_check_inputs("0"));
  CHECK(nn::parse_check_inputs("1"));
  CHECK_THROWS_WITH_AS(nn::parse_check_inputs("yes"), doctest::Contains("DDP_CHECK_INPUTS='yes' is not valid; use 1"),
                       ConfigError);
}

TEST_CASE("DDP_CHECK_INPUTS: the stamp of an address inside a pool block changes when the block is handed out again") {
  if constexpr (!BuildConfig::cpu_caching) return;  // no pool (DDP_CPU_CACHING=0): nothing is stamped
  std::optional<Tensor<float, Cpu>> a(Tensor<float, Cpu>(Shape{100}));
  const float* p = a->data();
  const auto s0 = Allocator<Cpu>::stamp(p);
  REQUIRE(s0.has_value());
  CHECK(Allocator<Cpu>::stamp(p + 37) == s0);  // an interior address (a slice) maps to the same block
  a.reset();
  CHECK_FALSE(Allocator<Cpu>::stamp(p).has_value());  // free
  Tensor<float, Cpu> b(Shape{100});
  REQUIRE(b.data() == p);
  const auto s1 = Allocator<Cpu>::stamp(p);
  REQUIRE(s1.has_value());
  CHECK(s1->block == s0->block);
  CHECK(s1->allocation != s0->allocation);
  std::vector<float> own(4);
  CHECK_FALSE(Allocator<Cpu>::stamp(own.data()).has_value());  // not the pool's
}

TEST_CASE("DDP_CHECK_INPUTS: an input freed and reused before backward throws naming the module") {
  if constexpr (!BuildConfig::cpu_caching) return;  // under ASan the freed input is a real use after free
  const CheckInputs on(true);
  SUBCASE("Linear") {
    nn::Linear<float, Cpu> m({.in_features = 5, .out_features = 3});
    CHECK_THROWS_WITH_AS(forward_free_backward(m, Shape{4, 5}, true),
                         doctest::Contains("ddp: backward of module '<root>' (Linear(in_features=5, out_features=3"),
                         ValueError);
    CHECK_THROWS_WITH_AS(forward_free_backward(m, Shape{4, 5}, true),
                         doctest::Contains("was freed and its memory handed to another tensor before backward "
                                           "(DDP_CHECK_INPUTS=1); keep the batch / input tensor alive until "
                                           "backward returns"),
                         ValueError);
  }
  SUBCASE("Conv2d") {
    nn::Conv2d<float, Cpu> m({.in_channels = 2, .out_channels = 3, .kernel_size = 3, .padding = 1});
    CHECK_THROWS_WITH_AS(forward_free_backward(m, Shape{2, 6, 6, 2}, true),
                         doctest::Contains("ddp: backward of module '<root>' (Conv2d("), ValueError);
  }
  SUBCASE("Sequential: the module whose own forward got the input") {
    nn::Sequential<float, Cpu> m;
    m.push_back(std::make_unique<nn::Linear<float, Cpu>>(nn::LinearOptions{.in_features = 5, .out_features = 4}));
    m.push_back(std::make_unique<nn::ReLU<float, Cpu>>());
    m.push_back(std::make_unique<nn::Linear<float, Cpu>>(nn::LinearOptions{.in_features = 4, .out_features = 2}));
    CHECK_THROWS_WITH_AS(forward_free_backward(m, Shape{3, 5}, true),
                         doctest::Contains("ddp: backward of module '<root>' (Sequential(3 modules)): the input of "
                                           "its forward"),
                         ValueError);
  }
}

TEST_CASE("DDP_CHECK_INPUTS: an input kept alive passes and the gradients are those without the check") {
  nn::Sequential<float, Cpu> m;
  m.push_back(std::make_unique<nn::Linear<float, Cpu>>(nn::LinearOptions{.in_features = 5, .out_features = 4}));
  m.push_back(std::make_unique<nn::ReLU<float, Cpu>>());
  m.push_back(std::make_unique<nn::Linear<float, Cpu>>(nn::LinearOptions{.in_features = 4, .out_features = 2}));
  nn::Conv2d<float, Cpu> conv({.in_channels = 2, .out_channels = 3, .kernel_size = 3, .padding = 1});
  std::vector<float> off_seq, off_conv;
  {
    const CheckInputs off(false);
    forward_free_backward(m, Shape{3, 5}, false);
    forward_free_backward(conv, Shape{2, 6, 6, 2}, false);
    off_seq = grads(m);
    off_conv = grads(conv);
  }
  const CheckInputs on(true);
  forward_free_backward(m, Shape{3, 5}, false);  // the children's inputs are the parent's kept intermediates
  forward_free_backward(conv, Shape{2, 6, 6, 2}, false);
  CHECK(grads(m) == off_seq);
  CHECK(grads(conv) == off_conv);

  // Memory the pool did not hand out (a caller's buffer in a view) is not checked.
  nn::Linear<float, Cpu> lin({.in_features = 5, .out_features = 3});
  std::vector<float> own(4 * 5, 0.5f);
  Exec<Cpu> exec;
  lin.zero_grad();
  Tensor<float, Cpu> y = lin.forward(exec, TensorView<const float, Cpu>(own.data(), Shape{4, 5}));
  Tensor<float, Cpu> dy(y.shape());
  fill(dy, 1.0f);
  CHECK_NOTHROW(lin.backward(exec, dy.cview()));
  // dW[o][i] = sum_n dy[n][o] x[n][i] = 4 * 0.5, in double.
  for (std::int64_t i = 0; i < 15; ++i) CHECK(lin.parameters()[0]->grad().data()[i] == doctest::Approx(2.0));
}

TEST_CASE("DDP_CHECK_INPUTS off: an input freed and reused is read silently (the behaviour the check exposes)") {
  if constexpr (!BuildConfig::cpu_caching) return;  // under ASan the freed input is a real use after free
  const CheckInputs off(false);
  nn::Linear<float, Cpu> m({.in_features = 5, .out_features = 3});
  Tensor<float, Cpu> reuse;
  CHECK_NOTHROW(reuse = forward_free_backward(m, Shape{4, 5}, true));
  // backward read the new tensor (all 1000) instead of x: dW[o][i] = sum_n 1 * 1000 = 4000, in double.
  REQUIRE(reuse.numel() == 20);
  const auto& dw = m.parameters()[0]->grad();
  for (std::int64_t i = 0; i < dw.numel(); ++i) CHECK(dw.data()[i] == doctest::Approx(4000.0));
}
