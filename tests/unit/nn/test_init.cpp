// Layers initialise themselves at construction as torch.nn does (docs/decisions/0064): the distributions against
// torch 1.13's rules and torch's own samples, the default generator's seeding, models that keep their own
// initialisation, and a model built without any init call that learns.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <numbers>
#include <sstream>
#include <string>
#include <vector>

#include <ddp/nn/batchnorm2d.hpp>
#include <ddp/nn/conv2d.hpp>
#include <ddp/nn/embedding.hpp>
#include <ddp/nn/gpt.hpp>
#include <ddp/nn/init.hpp>
#include <ddp/nn/layer_norm.hpp>
#include <ddp/nn/linear.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/relu.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/nn/sequential.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/tensor/random.hpp>

#include "support/skip.hpp"
#include "support/temp_dir.hpp"

namespace test_init {

using namespace ddp;

// Moments of a tensor's values, all in double: population variance; frac1 = fraction within one standard deviation
// of the mean (0.6827 for a normal, 1/sqrt(3) = 0.577 for a uniform).
struct Stats {
  std::int64_t n = 0;
  double min = 0, max = 0, mean = 0, var = 0, frac1 = 0;
};

Stats stats_of(const std::vector<double>& x) {
  Stats s;
  s.n = static_cast<std::int64_t>(x.size());
  s.min = *std::min_element(x.begin(), x.end());
  s.max = *std::max_element(x.begin(), x.end());
  for (double v : x) s.mean += v;
  s.mean /= static_cast<double>(s.n);
  for (double v : x) s.var += (v - s.mean) * (v - s.mean);
  s.var /= static_cast<double>(s.n);
  const double sd = std::sqrt(s.var);
  for (double v : x) s.frac1 += std::fabs(v - s.mean) < sd ? 1.0 : 0.0;
  s.frac1 /= static_cast<double>(s.n);
  return s;
}

template <class T>
std::vector<double> values(const Tensor<T, Cpu>& t) {
  return std::vector<double>(t.data(), t.data() + t.numel());
}

// Every parameter and buffer of m by its state_dict name, as doubles.
std::map<std::string, std::vector<double>> state_of(nn::Module<float, Cpu>& m) {
  std::map<std::string, std::vector<double>> out;
  for (auto* p : m.parameters()) out[p->name()] = values(p->value());
  for (auto* b : m.buffers()) out[b->name()] = b->is_integer() ? values(b->count()) : values(b->real());
  return out;
}

// What torch 1.13 does to each tensor (torch/nn/modules/{linear,conv,sparse,batchnorm,normalization}.py).
struct Rule {
  enum Kind { Uniform, Normal, Const } kind;
  double a = 0;  // Uniform: the bound b of U(-b, b); Normal: the std (mean 0); Const: the value
};

// One layer built on both sides. kind: Linear(a -> b), Conv2d(a -> b, k x k), Embedding(a, b), BatchNorm2d(a),
// LayerNorm(a).
struct Case {
  const char* name;
  enum Kind { Linear, Conv, Emb, BN, LN } kind;
  std::int64_t a = 0, b = 0, k = 1;
  bool bias = true;

  // The torch expression that builds it.
  std::string torch() const {
    const char* tf = bias ? "True" : "False";
    std::ostringstream s;
    switch (kind) {
      case Linear: s << "torch.nn.Linear(" << a << ", " << b << ", bias=" << tf << ")"; break;
      case Conv: s << "torch.nn.Conv2d(" << a << ", " << b << ", " << k << ", bias=" << tf << ")"; break;
      case Emb: s << "torch.nn.Embedding(" << a << ", " << b << ")"; break;
      case BN: s << "torch.nn.BatchNorm2d(" << a << ")"; break;
      case LN: s << "torch.nn.LayerNorm(" << a << ")"; break;
    }
    return s.str();
  }
  // Ours, from the default generator.
  std::unique_ptr<nn::Module<float, Cpu>> build() const {
    switch (kind) {
      case Linear:
        return std::make_unique<nn::Linear<float, Cpu>>(nn::LinearOptions{.in_features = a, .out_features = b, .bias = bias});
      case Conv:
        return std::make_unique<nn::Conv2d<float, Cpu>>(
            nn::Conv2dOptions{.in_channels = a, .out_channels = b, .kernel_size = k, .bias = bias});
      case Emb: return std::make_unique<nn::Embedding<float, Cpu>>(nn::EmbeddingOptions{.num_embeddings = a, .embedding_dim = b});
      case BN: return std::make_unique<nn::BatchNorm2d<float, Cpu>>(nn::BatchNorm2dOptions{.num_features = a});
      case LN: return std::make_unique<nn::LayerNorm<float, Cpu>>(nn::LayerNormOptions{.normalized_shape = a});
    }
    return nullptr;
  }
  // torch's rule for `tensor`, written out here (fan_in = weight.size(1) * kH * kW in torch's OIHW layout).
  Rule rule(const std::string& tensor) const {
    switch (kind) {
      case Linear: return {Rule::Uniform, 1.0 / std::sqrt(static_cast<double>(a))};
      case Conv: return {Rule::Uniform, 1.0 / std::sqrt(static_cast<double>(a * k * k))};
      case Emb: return {Rule::Normal, 1.0};
      case BN: return {Rule::Const, tensor == "weight" || tensor == "running_var" ? 1.0 : 0.0};
      case LN: return {Rule::Const, tensor == "weight" ? 1.0 : 0.0};
    }
    return {Rule::Const, 0.0};
  }
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"linear_784_256", Case::Linear, 784, 256},
      {"linear_1_3000", Case::Linear, 1, 3000},  // fan_in 1: U(-1, 1)
      {"conv_3_64_k7", Case::Conv, 3, 64, 7, false},
      {"conv_16_32_k3", Case::Conv, 16, 32, 3, true},
      {"conv_64_64_k1", Case::Conv, 64, 64, 1, true},
      {"embedding_1000_64", Case::Emb, 1000, 64},
      {"batchnorm_32", Case::BN, 32},
      {"layernorm_48", Case::LN, 48},
  };
  return c;
}

// Checks the sample s against rule r. Moments within 5 standard errors for n >= 1000 (their sampling
// distributions are then normal enough): mean sd/sqrt(n); variance sqrt((mu4 - sigma^4) / n), mu4 - sigma^4 =
// b^4 (1/5 - 1/9) for U(-b, b) and 2 s^4 for N(0, s^2); frac1 sqrt(p (1 - p) / n). A uniform's bounds hold exactly
// (slack: the largest value rounded to float may round up by half an ulp, `round_slack` relative), and its sample
// reaches within 30/n of them (missed with probability e^-15).
void check_rule(const Stats& s, const Rule& r, double round_slack) {
  const double n = static_cast<double>(s.n);
  switch (r.kind) {
    case Rule::Uniform: {
      const double b = r.a;
      CHECK(s.max <= b * (1 + round_slack));
      CHECK(s.min >= -b * (1 + round_slack));
      if (s.n < 1000) break;
      CHECK(s.max >= b * (1 - 30 / n));
      CHECK(s.min <= -b * (1 - 30 / n));
      CHECK(std::fabs(s.mean) <= 5 * b / std::sqrt(3 * n));
      CHECK(std::fabs(s.var - b * b / 3) <= 5 * b * b * std::sqrt((1.0 / 5 - 1.0 / 9) / n));
      break;
    }
    case Rule::Normal: {
      const double sd = r.a, p = std::erf(1 / std::numbers::sqrt2);  // 0.6827
      REQUIRE(s.n >= 1000);
      CHECK(std::fabs(s.mean) <= 5 * sd / std::sqrt(n));
      CHECK(std::fabs(s.var - sd * sd) <= 5 * sd * sd * std::sqrt(2 / n));
      CHECK(std::fabs(s.frac1 - p) <= 5 * std::sqrt(p * (1 - p) / n));
      break;
    }
    case Rule::Const:
      CHECK(s.min == r.a);
      CHECK(s.max == r.a);
      break;
  }
}

// The same layers built by torch 1.13 (seed 0): per tensor "case tensor n min max mean var frac1 bound", bound
// being torch's own kaiming_uniform_(a = sqrt(5)) bound for Linear and Conv2d weights (gain sqrt(3 / fan_in)) and
// its bias bound (1 / sqrt(fan_in)), from torch.nn.init's functions; nan elsewhere. Empty when torch is missing.
struct TorchRow {
  Stats s;
  double bound = 0;
};
std::map<std::string, TorchRow> torch_rows() {
  ddp::test::TempDir dir("ddp_test_init_");
  std::ostringstream py;
  py << "import math, sys\ntry:\n  import torch\nexcept ImportError:\n  sys.exit(77)\n"
        "from torch.nn import init\ntorch.manual_seed(0)\n";
  py << "cases = {\n";
  for (const Case& c : cases()) py << "  '" << c.name << "': " << c.torch() << ",\n";
  py << "}\n"
        "for name, m in cases.items():\n"
        "  for key, t in m.state_dict().items():\n"
        "    x = t.detach().double().flatten()\n"
        "    bound = float('nan')\n"
        "    if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)):\n"
        "      fan_in, _ = init._calculate_fan_in_and_fan_out(m.weight)\n"
        "      gain = init.calculate_gain('leaky_relu', math.sqrt(5))\n"
        "      bound = gain * math.sqrt(3.0 / fan_in) if key == 'weight' else 1 / math.sqrt(fan_in)\n"
        "    mean = x.mean(); var = ((x - mean) ** 2).mean()\n"
        "    frac1 = ((x - mean).abs() < var.sqrt()).double().mean()\n"
        "    print(name, key, x.numel(), *(repr(float(v)) for v in (x.min(), x.max(), mean, var, frac1)), repr(bound))\n";
  const std::string script = dir.file("torch_init.py"), out = dir.file("torch_init.txt");
  std::ofstream(script) << py.str();
  const int rc = std::system(("/usr/bin/python3 " + script + " > " + out).c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) return {};
  REQUIRE(rc == 0);
  std::map<std::string, TorchRow> rows;
  std::ifstream in(out);
  std::string name, key, bound;
  TorchRow r;
  while (in >> name >> key >> r.s.n >> r.s.min >> r.s.max >> r.s.mean >> r.s.var >> r.s.frac1 >> bound) {
    r.bound = bound == "nan" ? std::nan("") : std::stod(bound);
    rows[name + "." + key] = r;
  }
  return rows;
}

// Digits (sklearn's load_digits: 1797 8x8 images, 0..16 scaled to [0, 1], shuffled with seed 0) when /usr/bin/python3
// has sklearn; else 10 Gaussian clusters in 64 dimensions (centres N(0, 1), noise N(0, 1.5^2)): x (n, 64), y (n).
struct Data {
  std::vector<float> x;
  std::vector<std::int64_t> y;
  std::int64_t n = 0;
  std::string what;
};
Data load_data() {
  Data d;
  ddp::test::TempDir dir("ddp_test_init_");
  const std::string script = dir.file("digits.py"), out = dir.file("digits.txt");
  std::ofstream(script) << "import sys\ntry:\n  import numpy as np\n  from sklearn.datasets import load_digits\n"
                           "except ImportError:\n  sys.exit(77)\n"
                           "d = load_digits(); p = np.random.RandomState(0).permutation(len(d.target))\n"
                           "for i in p: print(*(int(v) for v in d.data[i]), int(d.target[i]))\n";
  const int rc = std::system(("/usr/bin/python3 " + script + " > " + out).c_str());
  if (!(WIFEXITED(rc) && WEXITSTATUS(rc) == 77)) {
    REQUIRE(rc == 0);
    std::ifstream in(out);
    int v = 0;
    for (std::int64_t i = 0; in >> v; ++i) {
      if (i % 65 == 64) {
        d.y.push_back(v);
      } else {
        d.x.push_back(static_cast<float>(v) / 16.0f);
      }
    }
    d.n = static_cast<std::int64_t>(d.y.size());
    d.what = "sklearn digits";
    REQUIRE(d.n == 1797);
    return d;
  }
  d.n = 2000;
  d.what = "synthetic clusters";
  Tensor<float, Cpu> centres(Shape{10, 64}), noise(Shape{d.n, 64});
  Generator g(11, 0, kStreamData);
  g.fill_normal(centres.view(), 0.0, 1.0);
  g.fill_normal(noise.view(), 0.0, 1.5);
  for (std::int64_t i = 0; i < d.n; ++i) {
    d.y.push_back(i % 10);
    for (std::int64_t j = 0; j < 64; ++j) d.x.push_back(centres.data()[(i % 10) * 64 + j] + noise.data()[i * 64 + j]);
  }
  return d;
}

struct Result {
  double first_loss = 0, last_loss = 0, accuracy = 0, seconds = 0;
};

// SGD (lr 0.05, momentum 0.9, batch 50) for `epochs` over the first n_train samples; accuracy on the rest, in eval
// mode. `image`: the input is (B, 8, 8, 1) NHWC, else (B, 64). first_loss / last_loss: mean loss of the first and
// last epoch.
Result fit(nn::Sequential<float, Cpu>& net, const Data& d, std::int64_t n_train, int epochs, bool image) {
  Exec<Cpu> exec;
  optim::SGD<float, Cpu> opt(net, {.lr = 0.05, .momentum = 0.9});
  nn::CrossEntropyLoss<float, Cpu> ce;
  auto shape = [&](std::int64_t b) { return image ? Shape{b, 8, 8, 1} : Shape{b, 64}; };
  const std::int64_t batch = 50;
  Result r;
  const auto t0 = std::chrono::steady_clock::now();
  for (int e = 0; e < epochs; ++e) {
    double sum = 0;
    int steps = 0;
    for (std::int64_t s = 0; s + batch <= n_train; s += batch, ++steps) {
      Tensor<float, Cpu> x(shape(batch));
      Tensor<std::int64_t, Cpu> y(Shape{batch});
      std::memcpy(x.data(), d.x.data() + s * 64, static_cast<std::size_t>(batch * 64) * sizeof(float));
      std::memcpy(y.data(), d.y.data() + s, static_cast<std::size_t>(batch) * sizeof(std::int64_t));
      net.zero_grad();
      Tensor<float, Cpu> logits = net.forward(exec, x.cview());
      sum += ce.forward(exec, logits.cview(), y.cview());
      net.backward(exec, ce.backward(exec).cview());
      opt.step(exec);
    }
    (e == 0 ? r.first_loss : r.last_loss) = sum / steps;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  net.eval();
  const std::int64_t n_test = d.n - n_train;
  Tensor<float, Cpu> x(shape(n_test));
  std::memcpy(x.data(), d.x.data() + n_train * 64, static_cast<std::size_t>(n_test * 64) * sizeof(float));
  Tensor<float, Cpu> logits = net.forward(exec, x.cview());
  std::int64_t right = 0;
  for (std::int64_t i = 0; i < n_test; ++i) {
    const float* row = logits.data() + i * 10;
    right += std::max_element(row, row + 10) - row == d.y[static_cast<std::size_t>(n_train + i)];
  }
  r.accuracy = static_cast<double>(right) / static_cast<double>(n_test);
  net.train();
  return r;
}

std::unique_ptr<nn::Sequential<float, Cpu>> mlp() {
  auto net = std::make_unique<nn::Sequential<float, Cpu>>();
  net->push_back(std::make_unique<nn::Linear<float, Cpu>>(nn::LinearOptions{.in_features = 64, .out_features = 64}));
  net->push_back(std::make_unique<nn::ReLU<float, Cpu>>());
  net->push_back(std::make_unique<nn::Linear<float, Cpu>>(nn::LinearOptions{.in_features = 64, .out_features = 10}));
  return net;
}
// Conv2d(1 -> 8, 3x3, pad 1, bias) - BatchNorm2d - ReLU - Linear(8*8*8 -> 10) on (B, 8, 8, 1).
std::unique_ptr<nn::Sequential<float, Cpu>> cnn() {
  auto net = std::make_unique<nn::Sequential<float, Cpu>>();
  net->push_back(std::make_unique<nn::Conv2d<float, Cpu>>(
      nn::Conv2dOptions{.in_channels = 1, .out_channels = 8, .kernel_size = 3, .padding = 1, .bias = true}));
  net->push_back(std::make_unique<nn::BatchNorm2d<float, Cpu>>(nn::BatchNorm2dOptions{.num_features = 8}));
  net->push_back(std::make_unique<nn::ReLU<float, Cpu>>());
  net->push_back(std::make_unique<nn::Linear<float, Cpu>>(nn::LinearOptions{.in_features = 512, .out_features = 10}));
  return net;
}

// A small model with every initialising layer, built from the default generator.
std::unique_ptr<nn::Sequential<float, Cpu>> every_layer() {
  auto net = cnn();
  net->push_back(std::make_unique<nn::Embedding<float, Cpu>>(nn::EmbeddingOptions{.num_embeddings = 9, .embedding_dim = 5}));
  net->push_back(std::make_unique<nn::LayerNorm<float, Cpu>>(nn::LayerNormOptions{.normalized_shape = 5}));
  return net;
}

bool same_bits(nn::Module<float, Cpu>& a, nn::Module<float, Cpu>& b) {
  auto pa = a.parameters(), pb = b.parameters();
  REQUIRE(pa.size() == pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i)
    if (std::memcmp(pa[i]->value().data(), pb[i]->value().data(), pa[i]->value().bytes()) != 0) return false;
  return true;
}

// n floats drawn by fill(view) from a fresh tensor.
template <class F>
std::vector<float> drawn(std::int64_t n, F&& fill) {
  Tensor<float, Cpu> t(Shape{n});
  fill(t.view());
  return std::vector<float>(t.data(), t.data() + n);
}
template <class T>
std::vector<float> floats(const Tensor<T, Cpu>& t) {
  return std::vector<float>(t.data(), t.data() + t.numel());
}

}  // namespace test_init

TEST_SUITE("nn") {
  TEST_CASE("init: every layer draws torch 1.13's default distribution, checked against torch's own samples") {
    using namespace test_init;
    const auto torch = torch_rows();
    if (torch.empty()) ddp::test::note_skipped("/usr/bin/python3 cannot import torch: init compared with the rules only");
    int compared = 0;
    for (std::size_t i = 0; i < cases().size(); ++i) {
      const Case& c = cases()[i];
      ddp::manual_seed(100 + i);
      auto ours = state_of(*c.build());
      for (const auto& [key, x] : ours) {
        CAPTURE(c.name);
        CAPTURE(key);
        const Rule r = c.rule(key);
        const Stats s = stats_of(x);
        check_rule(s, r, r.kind == Rule::Uniform ? 0x1p-24 : 0.0);  // float rounding of the largest draw
        if (torch.empty()) continue;
        const auto it = torch.find(std::string(c.name) + "." + key);
        REQUIRE_MESSAGE(it != torch.end(), "torch has no tensor ", key);
        CHECK(it->second.s.n == s.n);
        check_rule(it->second.s, r, 0x1p-23);  // the rule is torch's: its own samples obey it
        if (r.kind == Rule::Uniform) CHECK(std::fabs(it->second.bound - r.a) <= 1e-12 * r.a);  // and its formula
        ++compared;
      }
    }
    if (!torch.empty()) {
      CHECK(compared == 17);  // weight and bias of 4 layers, 2 bias-free weights, BatchNorm2d's 5 tensors
      CHECK(torch.size() == static_cast<std::size_t>(compared));
    }
  }

  TEST_CASE("init: the default generator draws Generator(seed)'s numbers in parameter order") {
    using namespace test_init;
    ddp::manual_seed(7);
    CHECK(ddp::initial_seed() == 7);
    nn::Linear<float, Cpu> lin({.in_features = 5, .out_features = 3});
    nn::Conv2d<float, Cpu> conv({.in_channels = 2, .out_channels = 3, .kernel_size = 3, .bias = true});
    nn::Embedding<float, Cpu> emb({.num_embeddings = 4, .embedding_dim = 6, .init_std = 0.5});
    Generator g(7);  // what the documentation says the default generator is after manual_seed(7)
    const double bl = 1 / std::sqrt(5.0), bc = 1 / std::sqrt(18.0);
    CHECK(floats(lin.weight().value()) == drawn(15, [&](auto v) { g.fill_uniform(v, -bl, bl); }));
    CHECK(floats(lin.bias()->value()) == drawn(3, [&](auto v) { g.fill_uniform(v, -bl, bl); }));
    CHECK(floats(conv.weight().value()) == drawn(54, [&](auto v) { g.fill_uniform(v, -bc, bc); }));
    CHECK(floats(conv.bias()->value()) == drawn(3, [&](auto v) { g.fill_uniform(v, -bc, bc); }));
    CHECK(floats(emb.weight().value()) == drawn(24, [&](auto v) { g.fill_normal(v, 0.0, 0.5); }));
    // reset_parameters(gen) draws the same from a generator of the caller's; reset_parameters() from the default one.
    Generator h(7);
    lin.reset_parameters(h);
    manual_seed(7);
    nn::Linear<float, Cpu> again({.in_features = 5, .out_features = 3});
    CHECK(std::memcmp(lin.weight().value().data(), again.weight().value().data(), 15 * sizeof(float)) == 0);
    again.reset_parameters();
    CHECK(std::memcmp(lin.weight().value().data(), again.weight().value().data(), 15 * sizeof(float)) != 0);
  }

  TEST_CASE("init: the same seed builds a bit-identical model, another seed another one") {
    using namespace test_init;
    ddp::manual_seed(3);
    auto a = every_layer();
    ddp::manual_seed(3);
    auto b = every_layer();
    auto c = every_layer();  // the generator moved on
    ddp::manual_seed(4);
    auto d = every_layer();
    CHECK(same_bits(*a, *b));
    CHECK_FALSE(same_bits(*a, *c));
    CHECK_FALSE(same_bits(*a, *d));
    // SkipDefaultInit: no draw, the parameters stay zero and the generator where it was.
    ddp::manual_seed(3);
    {
      const nn::SkipDefaultInit skip;
      nn::Linear<float, Cpu> lin({.in_features = 4, .out_features = 4});
      for (float v : floats(lin.weight().value())) CHECK(v == 0.0f);
    }
    CHECK(same_bits(*a, *every_layer()));
  }

  TEST_CASE("init: ResNet and GPT keep their own seeded initialisation and leave the default generator alone") {
    using namespace test_init;
    // Built after different manual_seeds: the same numbers (their options' seed decides), the first ones being the
    // documented first draws of Generator(seed, 0, kStreamInit): conv1 ~ N(0, 2 / fan_out), tok_emb ~ N(0, 0.02^2).
    ddp::manual_seed(1);
    nn::ResNet<float, Cpu> r1({.arch = "resnet18", .num_classes = 3, .seed = 7, .width = 4});
    ddp::manual_seed(2);
    nn::ResNet<float, Cpu> r2({.arch = "resnet18", .num_classes = 3, .seed = 7, .width = 4});
    CHECK(same_bits(r1, r2));
    Generator g(7, 0, kStreamInit);
    CHECK(floats(r1.conv1().weight().value()) ==
          drawn(4 * 7 * 7 * 3, [&](auto v) { g.fill_normal(v, 0.0, std::sqrt(2.0 / (4 * 49))); }));
    const nn::GPTOptions go{.vocab_size = 11, .block_size = 4, .n_layer = 1, .n_head = 2, .n_embd = 8, .seed = 5};
    nn::GPT<float, Cpu> g1(go);
    ddp::manual_seed(9);
    nn::GPT<float, Cpu> g2(go);
    CHECK(same_bits(g1, g2));
    Generator h(5, 0, kStreamInit);
    CHECK(floats(g1.emb_stem().tok_emb().weight().value()) == drawn(88, [&](auto v) { h.fill_normal(v, 0.0, 0.02); }));
    // Neither construction drew from the default generator.
    nn::Linear<float, Cpu> after({.in_features = 3, .out_features = 2});
    ddp::manual_seed(9);
    nn::Linear<float, Cpu> fresh({.in_features = 3, .out_features = 2});
    CHECK(same_bits(after, fresh));
  }

  TEST_CASE("init: a model built without any init call learns (and the same model left at zero does not)") {
    using namespace test_init;
    const Data d = load_data();
    const std::int64_t n_train = 1500;
    const double chance = std::log(10.0);
    ddp::manual_seed(0);
    for (bool image : {false, true}) {
      CAPTURE(image);
      auto net = image ? cnn() : mlp();
      const int epochs = image ? 3 : 8;
      const Result r = fit(*net, d, n_train, epochs, image);
      const std::string model = image ? "Conv2d-BatchNorm2d-ReLU-Linear" : "Linear-ReLU-Linear";
      MESSAGE(d.what, ", ", model, ": loss ", r.first_loss, " (epoch 1) -> ", r.last_loss, " (epoch ", epochs,
              "), held-out accuracy ", r.accuracy, ", ", r.seconds * 1e3, " ms of training");
      CHECK(r.last_loss < 0.2 * chance);
      CHECK(r.accuracy > 0.85);
      // What the user saw: zero weights give zero gradients everywhere but the last bias, so only the class
      // frequencies are learnt.
      std::unique_ptr<nn::Sequential<float, Cpu>> zero;
      {
        const nn::SkipDefaultInit skip;
        zero = image ? cnn() : mlp();
      }
      const Result z = fit(*zero, d, n_train, epochs, image);
      MESSAGE("left at zero: loss ", z.first_loss, " -> ", z.last_loss, ", held-out accuracy ", z.accuracy);
      CHECK(z.last_loss > 0.95 * chance);
      CHECK(z.accuracy < 0.3);
    }
  }
}
