// Recomputing the relu(bn) outputs in backward (docs/decisions/0068): (1) a block or a ResNet with
// recompute_relu gives the same outputs, gradients (bit for bit), running statistics and gradient order as one
// without, in training and in eval; (2) a CPU ResNet-50 step keeps exactly the bytes of the freed outputs less
// after forward, as computed from the architecture, and its peak drops by most of them.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <ddp/nn/basic_block.hpp>
#include <ddp/nn/bottleneck.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/tensor/storage.hpp>

#include "random_tensor.hpp"
#include "support/same_bits.hpp"

namespace test_recompute {

using namespace ddp;

using ddp::test::same_bits;

struct Result {
  Tensor<float, Cpu> y, dx;
  std::vector<Tensor<float, Cpu>> state;  // every parameter's gradient, then every buffer
  std::vector<std::string> ready;
};

Tensor<float, Cpu> copy_of(const Tensor<float, Cpu>& t) {
  Tensor<float, Cpu> c(t.shape());
  std::memcpy(c.data(), t.data(), t.bytes());
  return c;
}

// Two steps (the second sees the first's running statistics), forward and backward each.
Result two_steps(nn::Module<float, Cpu>& m, Exec<Cpu>& exec, const Tensor<float, Cpu>& x, const Tensor<float, Cpu>& dy) {
  Result r;
  m.set_grad_ready_hook([&r](nn::Parameter<float, Cpu>& p) { r.ready.push_back(p.name()); });
  for (int step = 0; step < 2; ++step) {
    m.zero_grad();
    r.y = m.forward(exec, x.cview());
    r.dx = m.backward(exec, dy.cview());
  }
  for (auto* p : m.parameters()) r.state.push_back(copy_of(p->grad()));
  for (auto* b : m.buffers()) {  // running statistics, and num_batches_tracked as a float
    if (!b->is_integer()) {
      r.state.push_back(copy_of(b->real()));
      continue;
    }
    Tensor<float, Cpu> count(Shape{1});
    count.data()[0] = static_cast<float>(b->count().data()[0]);
    r.state.push_back(std::move(count));
  }
  return r;
}

void check_same(const Result& on, const Result& off) {
  CHECK(same_bits(on.y, off.y));
  CHECK(same_bits(on.dx, off.dx));
  REQUIRE(on.state.size() == off.state.size());
  for (std::size_t i = 0; i < on.state.size(); ++i) {
    CAPTURE(i);
    CHECK(same_bits(on.state[i], off.state[i]));
  }
  CHECK(on.ready == off.ready);
}

// Blocks of options o with recompute on and off, the same random parameters (BN's too), the same x and dy.
template <class Block>
void check_block(nn::BlockOptions o, int threads, bool training) {
  CAPTURE(o.inplanes);
  CAPTURE(o.planes);
  CAPTURE(o.stride);
  CAPTURE(threads);
  CAPTURE(training);
  o.recompute_relu = true;
  Block on(o);
  o.recompute_relu = false;
  Block off(o);
  std::uint64_t seed = 70;
  auto pn = on.parameters(), pf = off.parameters();
  REQUIRE(pn.size() == pf.size());
  for (std::size_t i = 0; i < pn.size(); ++i) {
    const Tensor<float, Cpu> v = test::randn(pn[i]->shape(), seed++, 0.1, 0.5);
    std::memcpy(pn[i]->value().data(), v.data(), v.bytes());
    std::memcpy(pf[i]->value().data(), v.data(), v.bytes());
  }
  on.train(training);
  off.train(training);
  kernels::cpu::ThreadPool pool(threads);
  Exec<Cpu> exec{.pool = &pool};
  const std::int64_t n = 3, hw = 9, out = (hw + 2 - 3) / o.stride + 1;
  const Tensor<float, Cpu> x = test::randn(Shape{n, hw, hw, o.inplanes}, 1);
  const Tensor<float, Cpu> dy = test::randn(Shape{n, out, out, o.planes * Block::kExpansion}, 2);
  check_same(two_steps(on, exec, x, dy), two_steps(off, exec, x, dy));
}

std::size_t rounded(std::int64_t elements) {
  return detail::HostPool::round_size(static_cast<std::size_t>(elements) * sizeof(float));
}

// Bytes (in pool size classes) of the relu(bn) outputs a ResNet-50 (width 64) frees after forward with
// recompute_relu: the stem's (N, H/2, W/2, 64) and, per bottleneck, stage 1's (N, h, h, planes) and stage 2's
// (N, h', h', planes) (h' after the block's stride). `largest`: the largest one of them.
struct Freed {
  std::size_t total = 0, largest = 0;
};
Freed resnet50_freed(std::int64_t n, std::int64_t px) {
  Freed f;
  const auto add = [&](std::int64_t hw, std::int64_t c) {
    const std::size_t b = rounded(n * hw * hw * c);
    f.total += b;
    f.largest = std::max(f.largest, b);
  };
  std::int64_t h = (px + 2 * 3 - 7) / 2 + 1;
  add(h, 64);
  h = (h + 2 - 3) / 2 + 1;
  const nn::ResNetSpec spec = nn::resnet_spec("resnet50");
  for (std::size_t l = 0; l < spec.layers.size(); ++l) {
    const std::int64_t planes = std::int64_t{64} << l;
    for (std::int64_t b = 0; b < spec.layers[l]; ++b) {
      const std::int64_t s = b == 0 && l > 0 ? 2 : 1, h2 = (h + 2 - 3) / s + 1;
      add(h, planes);
      add(h2, planes);
      h = h2;
    }
  }
  return f;
}

struct Memory {
  std::size_t kept = 0, peak = 0;
};
// One ResNet-50 step at 112 px on one image: bytes above the state before forward, after forward and at the peak.
Memory resnet50_step(bool recompute, Tensor<float, Cpu>* dx_conv1 = nullptr) {
  const std::int64_t n = 1, px = 112, classes = 10;
  nn::ResNet<float, Cpu> m({.arch = "resnet50", .num_classes = classes, .seed = 3, .recompute_relu = recompute});
  Exec<Cpu> exec;
  const Tensor<float, Cpu> x = test::randn(Shape{n, px, px, 3}, 5), dy = test::randn(Shape{n, classes}, 6);
  m.zero_grad();
  Memory r;
  const std::size_t base = cpu_memory_stats().current_bytes;
  reset_peak_cpu_memory();
  {
    Tensor<float, Cpu> logits = m.forward(exec, x.cview());
    r.kept = cpu_memory_stats().current_bytes - base;
    m.backward(exec, dy.cview());
  }
  r.peak = cpu_memory_stats().peak_bytes - base;
  if (dx_conv1) *dx_conv1 = copy_of(m.conv1().weight().grad());
  return r;
}

}  // namespace test_recompute

TEST_SUITE("nn") {
  TEST_CASE("recompute_relu: blocks give the same outputs, gradients and statistics, bit for bit") {
    using namespace test_recompute;
    for (bool training : {true, false})
      for (int threads : {1, 2}) {
        check_block<nn::BasicBlock<float, Cpu>>({.inplanes = 8, .planes = 8, .stride = 1}, threads, training);
        check_block<nn::BasicBlock<float, Cpu>>({.inplanes = 8, .planes = 16, .stride = 2, .downsample = true},
                                                threads, training);
        check_block<nn::Bottleneck<float, Cpu>>({.inplanes = 16, .planes = 4, .stride = 1}, threads, training);
        check_block<nn::Bottleneck<float, Cpu>>({.inplanes = 8, .planes = 4, .stride = 2, .downsample = true},
                                                threads, training);
      }
  }

  TEST_CASE("recompute_relu: a ResNet-18 gives the same logits, gradients and statistics, bit for bit") {
    using namespace test_recompute;
    const auto opts = [](bool r) {
      return nn::ResNetOptions{.arch = "resnet18", .num_classes = 5, .seed = 9, .width = 8, .recompute_relu = r};
    };
    nn::ResNet<float, Cpu> on(opts(true)), off(opts(false));
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> exec{.pool = &pool};
    const Tensor<float, Cpu> x = test::randn(Shape{2, 32, 32, 3}, 11), dy = test::randn(Shape{2, 5}, 12);
    check_same(two_steps(on, exec, x, dy), two_steps(off, exec, x, dy));
  }

  TEST_CASE("recompute_relu: a CPU ResNet-50 step keeps the freed outputs' bytes less, and its peak drops") {
    using namespace test_recompute;
    if constexpr (!BuildConfig::cpu_caching) return;  // DDP_CPU_CACHING=0 (ASan builds): nothing is counted
    Tensor<float, Cpu> g_on, g_off;
    const Memory on = resnet50_step(true, &g_on), off = resnet50_step(false, &g_off);
    const Freed freed = resnet50_freed(1, 112);
    MESSAGE("kept after forward: ", off.kept, " B -> ", on.kept, " B; peak ", off.peak, " B -> ", on.peak,
            " B; freed outputs from the architecture ", freed.total, " B (largest ", freed.largest, " B)");
    CHECK(off.kept - on.kept == freed.total);
    // Backward holds at most one recomputed output at a time (plus 4 C-float scratch vectors), and every other
    // tensor it holds is held without recomputation too.
    CHECK(off.peak - on.peak + freed.largest + 4 * 512 >= freed.total);
    CHECK(same_bits(g_on, g_off));
  }
}
