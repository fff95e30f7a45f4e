// ResidualBlock after docs/decisions/0061 and 0062: (1) the skip gradient added in conv_1's dgrad gives, bit for
// bit, the gradients of the separate add it replaced; the reference runs the block's own submodules through their
// public calls in the old order (overwriting conv backward, then Kernels::add), so it does not run the fold.
// (2) A CPU ResNet-50 step keeps no downsample output: the host pool's bytes after forward are at most what the
// architecture's kept activations need, and the step's peak stays below the activations the old code kept
// (those plus every downsample output), so the memory no longer kept is what the peak dropped by.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <ddp/nn/basic_block.hpp>
#include <ddp/nn/bottleneck.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/tensor/storage.hpp>

#include "random_tensor.hpp"
#include "support/same_bits.hpp"

namespace test_residual_fold {

using namespace ddp;

using ddp::test::same_bits;

// A block's submodules, in registration order: (conv, bn) stages and the downsample (or nullptr).
struct Parts {
  std::vector<nn::Conv2d<float, Cpu>*> convs;
  std::vector<nn::BatchNorm2d<float, Cpu>*> bns;
  nn::Sequential<float, Cpu>* downsample = nullptr;
};
Parts parts_of(nn::Module<float, Cpu>& block) {
  Parts p;
  for (const auto& [name, m] : block.children()) {
    if (auto* c = dynamic_cast<nn::Conv2d<float, Cpu>*>(m)) p.convs.push_back(c);
    if (auto* b = dynamic_cast<nn::BatchNorm2d<float, Cpu>*>(m)) p.bns.push_back(b);
    if (name == "downsample") p.downsample = dynamic_cast<nn::Sequential<float, Cpu>*>(m);
  }
  return p;
}

struct Result {
  Tensor<float, Cpu> y, dx;
  std::vector<Tensor<float, Cpu>> grads;
  std::vector<std::string> ready;  // parameter names in the order their gradients were reported
};

void record_ready(nn::Module<float, Cpu>& m, Result& r) {
  m.set_grad_ready_hook([&r](nn::Parameter<float, Cpu>& p) { r.ready.push_back(p.name()); });
}
void copy_grads(nn::Module<float, Cpu>& m, Result& r) {
  for (auto* p : m.parameters()) {
    Tensor<float, Cpu> g(p->shape());
    std::memcpy(g.data(), p->grad().data(), g.bytes());
    r.grads.push_back(std::move(g));
  }
}

// The block's forward and backward as ResidualBlock ran them before 0061, from its submodules' public calls.
Result reference_step(nn::Module<float, Cpu>& block, Exec<Cpu>& exec, const Tensor<float, Cpu>& x,
                      const Tensor<float, Cpu>& dy) {
  Parts p = parts_of(block);
  const std::size_t stages = p.convs.size();
  Result r;
  record_ready(block, r);
  block.zero_grad();
  std::vector<Tensor<float, Cpu>> c(stages), a(stages);
  TensorView<const float, Cpu> h = x.cview();
  for (std::size_t i = 0; i + 1 < stages; ++i) {
    c[i] = p.convs[i]->forward(exec, h);
    a[i] = p.bns[i]->forward_act(exec, c[i].cview(), {}, true);
    h = a[i].cview();
  }
  c.back() = p.convs.back()->forward(exec, h);
  Tensor<float, Cpu> id = p.downsample ? p.downsample->forward(exec, x.cview()) : Tensor<float, Cpu>();
  r.y = p.bns.back()->forward_act(exec, c.back().cview(), p.downsample ? id.cview() : x.cview(), true);

  Tensor<float, Cpu> g(dy.shape());
  Tensor<float, Cpu> d = p.bns.back()->backward_act(exec, dy.cview(), r.y.cview(), g.view());
  Tensor<float, Cpu> skip = p.downsample ? p.downsample->backward(exec, g.cview()) : Tensor<float, Cpu>();
  d = p.convs.back()->backward(exec, d.cview());
  for (std::size_t i = stages - 1; i-- > 0;) {
    d = p.bns[i]->backward_act(exec, d.cview(), a[i].cview(), {});
    d = p.convs[i]->backward(exec, d.cview());
  }
  Kernels<Cpu>::add(exec, d.cview(), p.downsample ? skip.cview() : g.cview(), d.view());
  r.dx = std::move(d);
  copy_grads(block, r);
  return r;
}

Result block_step(nn::Module<float, Cpu>& block, Exec<Cpu>& exec, const Tensor<float, Cpu>& x,
                  const Tensor<float, Cpu>& dy) {
  Result r;
  record_ready(block, r);
  block.zero_grad();
  r.y = block.forward(exec, x.cview());
  r.dx = block.backward(exec, dy.cview());
  copy_grads(block, r);
  return r;
}

// Two blocks of options o with the same random parameters (BN weights and biases too, so that no product is
// trivially 1 or 0), one step each on the same x and dy: every output, gradient and report order agrees.
template <class Block>
void check_block(const nn::BlockOptions& o, int threads) {
  CAPTURE(o.inplanes);
  CAPTURE(o.planes);
  CAPTURE(o.stride);
  CAPTURE(o.downsample);
  CAPTURE(threads);
  Block fold(o), ref(o);
  std::uint64_t seed = 40;
  auto pf = fold.parameters(), pr = ref.parameters();
  REQUIRE(pf.size() == pr.size());
  for (std::size_t i = 0; i < pf.size(); ++i) {
    const Tensor<float, Cpu> v = test::randn(pf[i]->shape(), seed++, 0.1, 0.5);
    std::memcpy(pf[i]->value().data(), v.data(), v.bytes());
    std::memcpy(pr[i]->value().data(), v.data(), v.bytes());
  }
  kernels::cpu::ThreadPool pool(threads);
  Exec<Cpu> exec{.pool = &pool};
  const std::int64_t n = 3, hw = 9, out = (hw + 2 - 3) / o.stride + 1;
  const Tensor<float, Cpu> x = test::randn(Shape{n, hw, hw, o.inplanes}, 1);
  const Tensor<float, Cpu> dy = test::randn(Shape{n, out, out, o.planes * Block::kExpansion}, 2);
  const Result got = block_step(fold, exec, x, dy), want = reference_step(ref, exec, x, dy);
  CHECK(same_bits(got.y, want.y));
  CHECK(same_bits(got.dx, want.dx));
  REQUIRE(got.grads.size() == want.grads.size());
  for (std::size_t i = 0; i < got.grads.size(); ++i) {
    CAPTURE(pf[i]->name());
    CHECK(same_bits(got.grads[i], want.grads[i]));
  }
  CHECK(got.ready == want.ready);
  CHECK(got.ready.size() == pf.size());
}

// ---- (2) what a ResNet keeps between forward and backward, from its architecture ----

std::size_t rounded(std::int64_t elements, std::size_t element_bytes) {
  return detail::HostPool::round_size(static_cast<std::size_t>(elements) * element_bytes);
}

// Bytes of the tensors a bottleneck ResNet (width 64) keeps at the end of forward, each in its pool size class
// (`exact`: unrounded), and separately the downsample outputs the code before 0062 kept as well. Per module:
// the stem's conv output and relu(bn) output, the max pool's output and its int32 argmax; per block, stages 1 and
// 2's conv output and relu(bn) output, stage 3's conv output and the block output (kept by its layer or the
// ResNet); a downsample's conv output (its BatchNorm's input); the pooled features and the logits.
struct Kept {
  std::size_t activations = 0;  // what forward keeps now
  std::size_t downsample_outputs = 0;  // kept too before 0062
};
Kept resnet50_kept(std::int64_t n, std::int64_t px, std::int64_t classes, bool exact) {
  Kept k;
  const auto add = [&](std::size_t& to, std::int64_t hw, std::int64_t c, std::size_t el = sizeof(float)) {
    const std::int64_t elements = n * hw * hw * c;
    to += exact ? static_cast<std::size_t>(elements) * el : rounded(elements, el);
  };
  const std::int64_t width = 64;
  std::int64_t h = (px + 2 * 3 - 7) / 2 + 1;
  add(k.activations, h, width);
  add(k.activations, h, width);
  h = (h + 2 - 3) / 2 + 1;
  add(k.activations, h, width);
  add(k.activations, h, width, sizeof(std::int32_t));
  std::int64_t inplanes = width;
  const nn::ResNetSpec spec = nn::resnet_spec("resnet50");
  for (std::size_t l = 0; l < spec.layers.size(); ++l) {
    const std::int64_t planes = width << l, out = planes * 4;
    for (std::int64_t b = 0; b < spec.layers[l]; ++b) {
      const std::int64_t s = b == 0 && l > 0 ? 2 : 1, h2 = (h + 2 - 3) / s + 1;
      add(k.activations, h, planes);
      add(k.activations, h, planes);
      add(k.activations, h2, planes);
      add(k.activations, h2, planes);
      add(k.activations, h2, out);
      if (b == 0 && (s != 1 || inplanes != out)) {
        add(k.activations, h2, out);
        add(k.downsample_outputs, h2, out);
      }
      add(k.activations, h2, out);
      h = h2;
      inplanes = out;
    }
  }
  add(k.activations, 1, inplanes);
  add(k.activations, 1, classes);
  return k;
}

}  // namespace test_residual_fold

TEST_SUITE("nn") {
  TEST_CASE("residual blocks: the skip gradient added in conv1's dgrad equals the separate add, bit for bit") {
    using namespace test_residual_fold;
    for (int threads : {1, 2}) {
      check_block<nn::BasicBlock<float, Cpu>>({.inplanes = 8, .planes = 8, .stride = 1, .downsample = false}, threads);
      check_block<nn::BasicBlock<float, Cpu>>({.inplanes = 8, .planes = 16, .stride = 2, .downsample = true}, threads);
      check_block<nn::Bottleneck<float, Cpu>>({.inplanes = 16, .planes = 4, .stride = 1, .downsample = false}, threads);
      check_block<nn::Bottleneck<float, Cpu>>({.inplanes = 8, .planes = 4, .stride = 1, .downsample = true}, threads);
      check_block<nn::Bottleneck<float, Cpu>>({.inplanes = 8, .planes = 4, .stride = 2, .downsample = true}, threads);
    }
  }

  TEST_CASE("a CPU ResNet-50 step keeps no downsample output; its peak is below the activations kept before") {
    using namespace test_residual_fold;
    if constexpr (!BuildConfig::cpu_caching) return;  // DDP_CPU_CACHING=0 (ASan builds): nothing is counted
    // 112 px, one image: the stem's 56x56x64 output is 49 x 2^14 bytes, the size classes before 0062 rounded up
    // by 8/7 (docs/decisions/0062); layer4 is 4x4.
    const std::int64_t n = 1, px = 112, classes = 10;
    nn::ResNet<float, Cpu> m({.arch = "resnet50", .num_classes = classes, .seed = 3});
    Exec<Cpu> exec;
    const Tensor<float, Cpu> x = test::randn(Shape{n, px, px, 3}, 5), dy = test::randn(Shape{n, classes}, 6);
    m.zero_grad();
    const std::size_t base = cpu_memory_stats().current_bytes;
    reset_peak_cpu_memory();
    Tensor<float, Cpu> logits = m.forward(exec, x.cview());
    const std::size_t kept = cpu_memory_stats().current_bytes - base;
    m.backward(exec, dy.cview());
    const std::size_t peak = cpu_memory_stats().peak_bytes - base;
    const Kept now = resnet50_kept(n, px, classes, false), exact = resnet50_kept(n, px, classes, true);
    MESSAGE("kept after forward ", kept, " B (architecture: ", now.activations, " B in size classes, ",
            exact.activations, " B exact); downsample outputs no longer kept ", exact.downsample_outputs,
            " B; peak of the step ", peak, " B");
    CHECK(kept <= now.activations);
    CHECK(now.activations - exact.activations < exact.activations / 16);  // the size classes' rounding
    // Before 0062 the forward state alone was every activation plus the downsample outputs, each rounded up.
    CHECK(peak < exact.activations + exact.downsample_outputs);
    CHECK(peak >= kept);
  }
}
