// Shared by tests/interop/torch_ddp, torch_join, torch_powersgd and torch_zero: the model of ddp_torch_reference.py in ddp, running a torch
// reference script, the data and optimizer it wrote to init.safetensors, and the comparison with torch's tensors.
// SPDX-License-Identifier: MIT
#pragma once

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <ddp/nn/adaptive_avg_pool2d.hpp>
#include <ddp/nn/batchnorm2d.hpp>
#include <ddp/nn/conv2d.hpp>
#include <ddp/nn/linear.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/relu.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/train/checkpoint.hpp>
#include <ddp/train/safetensors.hpp>

namespace ddp::test::torch_ddp {

// The model of ddp_torch_reference.py: conv -> bn -> relu -> mean over H, W -> a [+ b], by `mode`.
class Net : public nn::Module<float, Cpu> {
 public:
  explicit Net(std::int64_t head_out = 3) {
    conv_ = &register_module("conv", std::make_unique<nn::Conv2d<float, Cpu>>(nn::Conv2dOptions{
                                         .in_channels = 3, .out_channels = 4, .kernel_size = 3, .padding = 1, .bias = false}));
    bn_ = &register_module("bn", std::make_unique<nn::BatchNorm2d<float, Cpu>>(nn::BatchNorm2dOptions{.num_features = 4}));
    relu_ = &register_module("relu", std::make_unique<nn::ReLU<float, Cpu>>());
    pool_ = &register_module("pool", std::make_unique<nn::AdaptiveAvgPool2d<float, Cpu>>());
    a_ = &register_module("a", std::make_unique<nn::Linear<float, Cpu>>(nn::LinearOptions{.in_features = 4, .out_features = head_out}));
    b_ = &register_module("b", std::make_unique<nn::Linear<float, Cpu>>(nn::LinearOptions{.in_features = 4, .out_features = 3}));
  }
  std::string mode = "ab";

  Tensor<float, Cpu> forward_impl(Exec<Cpu>& e, TensorView<const float, Cpu> x) override {
    h1_ = conv_->forward(e, x);  // kept: each module keeps a view of its input until backward
    h2_ = bn_->forward(e, h1_.cview());
    h3_ = relu_->forward(e, h2_.cview());
    p_ = pool_->forward(e, h3_.cview());  // (N, 1, 1, 4)
    used_ = mode;
    Tensor<float, Cpu> out;
    for (char h : used_) {
      Tensor<float, Cpu> y = head(h).forward(e, p_.cview());
      if (out.numel() == 0)
        out = std::move(y);
      else
        for (std::int64_t i = 0; i < out.numel(); ++i) out.data()[i] += y.data()[i];
    }
    return out;
  }
  Tensor<float, Cpu> backward_impl(Exec<Cpu>& e, TensorView<const float, Cpu> dy) override {
    Tensor<float, Cpu> dp;
    for (char h : used_) {
      Tensor<float, Cpu> d = head(h).backward(e, dy);
      if (dp.numel() == 0)
        dp = std::move(d);
      else
        for (std::int64_t i = 0; i < dp.numel(); ++i) dp.data()[i] += d.data()[i];
    }
    auto d3 = pool_->backward(e, dp.cview());
    auto d2 = relu_->backward(e, d3.cview());
    auto d1 = bn_->backward(e, d2.cview());
    return conv_->backward(e, d1.cview());
  }
  std::string describe() const override { return "TorchDdpNet"; }

 private:
  nn::Linear<float, Cpu>& head(char h) { return h == 'a' ? *a_ : *b_; }
  nn::Conv2d<float, Cpu>* conv_;
  nn::BatchNorm2d<float, Cpu>* bn_;
  nn::ReLU<float, Cpu>* relu_;
  nn::AdaptiveAvgPool2d<float, Cpu>* pool_;
  nn::Linear<float, Cpu>* a_;
  nn::Linear<float, Cpu>* b_;
  std::string used_;
  Tensor<float, Cpu> h1_, h2_, h3_, p_;
};

inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (true) {
    const std::size_t next = s.find(sep, at);
    out.push_back(s.substr(at, next == std::string::npos ? std::string::npos : next - at));
    if (next == std::string::npos) return out;
    at = next + 1;
  }
}

// Runs `script` WORLD OUT_DIR with the test's python (/usr/bin/python3); its exit code (77: no torch).
inline int run_python(const std::string& script, int world, const std::string& out_dir) {
  const std::string cmd = std::string(DDP_TEST_PYTHON) + " " + script + " " + std::to_string(world) + " " + out_dir;
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// max |ours - theirs| / max(1e-3, max |theirs|) over one tensor.
inline double rel_diff(const float* ours, const std::vector<float>& theirs) {
  double diff = 0, scale = 1e-3;
  for (std::size_t i = 0; i < theirs.size(); ++i) {
    diff = std::max(diff, std::abs(double(ours[i]) - double(theirs[i])));
    scale = std::max(scale, std::abs(double(theirs[i])));
  }
  return diff / scale;
}

// What init.safetensors holds besides the weights: the samples (NHWC), labels, batch size and SGD options.
struct Inputs {
  std::vector<float> x;  // (S, H, W, C)
  std::vector<std::int64_t> labels;
  std::int64_t batch = 0, H = 0, W = 0, C = 0;
  optim::SgdOptions sgd;

  explicit Inputs(const train::SafetensorsFile& init)
      : x(init.at("x_nhwc").as<float>()), labels(init.at("labels").as<std::int64_t>()),
        batch(std::stoll(init.metadata.at("batch"))) {
    const auto& shape = init.at("x_nhwc").shape;
    H = shape[1], W = shape[2], C = shape[3];
    if (const auto it = init.metadata.find("sgd"); it != init.metadata.end()) {  // absent: the script's own options
      const auto s = split(it->second, ',');
      sgd = optim::SgdOptions{.lr = std::stod(s[0]), .momentum = std::stod(s[1]), .weight_decay = std::stod(s[2])};
    }
  }
  // Samples [lo, lo + batch) as an (N, H, W, C) batch and its labels.
  Tensor<float, Cpu> images(std::int64_t lo) const {
    Tensor<float, Cpu> t(Shape{batch, H, W, C});
    std::copy_n(x.data() + lo * H * W * C, batch * H * W * C, t.data());
    return t;
  }
  Tensor<std::int64_t, Cpu> targets(std::int64_t lo) const {
    Tensor<std::int64_t, Cpu> t(Shape{batch});
    std::copy_n(labels.data() + lo, batch, t.data());
    return t;
  }
};

// Forward, cross entropy and backward of `model` (the Net or its DDP wrapper) on samples [lo, lo + batch).
template <class M>
void forward_backward(Exec<Cpu>& exec, M& model, const Inputs& in, std::int64_t lo) {
  const Tensor<float, Cpu> x = in.images(lo);  // alive until backward: the modules keep views of their inputs
  const Tensor<std::int64_t, Cpu> y = in.targets(lo);
  nn::CrossEntropyLoss<float, Cpu> ce;
  auto logits = model.forward(exec, x.cview());
  ce.forward(exec, logits.cview(), y.cview());
  model.backward(exec, ce.backward(exec).cview());
}

struct Comparison {
  double worst = 0;        // the largest rel_diff over every parameter (and float buffer)
  std::string where;       // its name
  bool counters = true;    // the integer buffers are equal
};

// Our model against torch's tensors of one rank (`param.<name>`, `buffer.<name>`); buffers too when `buffers`.
inline Comparison compare(nn::Module<float, Cpu>& net, const train::SafetensorsFile& ref, bool buffers) {
  Comparison c;
  for (auto* p : net.parameters()) {
    const auto& e = ref.at("param." + p->name());
    std::vector<float> mine(static_cast<std::size_t>(p->numel()));
    if (p->layout() == nn::Layout::Krsc)  // torch's OIHW -> our KRSC, as checkpoints do
      train::detail::oihw_to_krsc(reinterpret_cast<const float*>(e.data.data()), mine.data(), p->shape());
    else
      mine = e.as<float>();
    const double d = rel_diff(p->value().data(), mine);
    if (d >= c.worst) c.worst = d, c.where = p->name();
  }
  if (!buffers) return c;
  for (auto* b : net.buffers()) {
    const auto& e = ref.at("buffer." + b->name());
    if (b->is_integer()) {
      c.counters = c.counters && e.as<std::int64_t>() == std::vector<std::int64_t>(b->count().data(), b->count().data() + 1);
      continue;
    }
    const double d = rel_diff(b->real().data(), e.as<float>());
    if (d >= c.worst) c.worst = d, c.where = b->name();
  }
  return c;
}

}  // namespace ddp::test::torch_ddp
