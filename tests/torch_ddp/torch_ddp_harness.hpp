// What tests/torch_ddp and tests/torch_powersgd share on the C++ side: the model of ddp_torch_reference.py,
// running a torch reference script, and the comparison of a model's parameters with torch's file.
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
#include <ddp/nn/relu.hpp>
#include <ddp/train/checkpoint.hpp>
#include <ddp/train/safetensors.hpp>

namespace ddp::test::torch_ddp {

// The model of ddp_torch_reference.py: conv -> bn -> relu -> mean over H, W -> a [+ b], by `mode`.
class Net : public nn::Module<float, Cpu> {
 public:
  explicit Net(std::int64_t head_out = 3) {
    conv_ = &register_module("conv", std::make_unique<nn::Conv2d<float, Cpu>>(nn::Conv2dOptions{
                                         .in_channels = 3, .out_channels = 4, .kernel_size = 3, .padding = 1}));
    bn_ = &register_module("bn", std::make_unique<nn::BatchNorm2d<float, Cpu>>(nn::BatchNorm2dOptions{.num_features = 4}));
    relu_ = &register_module("relu", std::make_unique<nn::ReLU<float, Cpu>>());
    pool_ = &register_module("pool", std::make_unique<nn::AdaptiveAvgPool2d<float, Cpu>>());
    a_ = &register_module("a", std::make_unique<nn::Linear<float, Cpu>>(nn::LinearOptions{.in_features = 4, .out_features = head_out}));
    b_ = &register_module("b", std::make_unique<nn::Linear<float, Cpu>>(nn::LinearOptions{.in_features = 4, .out_features = 3}));
  }
  std::string mode = "ab";

  Tensor<float, Cpu> forward(Exec<Cpu>& e, TensorView<const float, Cpu> x) override {
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
  Tensor<float, Cpu> backward(Exec<Cpu>& e, TensorView<const float, Cpu> dy) override {
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

// Runs `python_script WORLD OUT_DIR`; its exit code (77: torch missing), -1 when it did not exit.
inline int run_reference(const std::string& script, int world, const std::string& out_dir) {
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

// The largest rel_diff over `net`'s parameters against `ref`'s `param.<name>` tensors (torch layout: OIHW
// conv weights are converted to our KRSC first, as checkpoints do); `where` gets the tensor's name.
template <class M>
double worst_param_diff(M& net, const train::SafetensorsFile& ref, std::string& where) {
  double worst = 0;
  for (auto* p : net.parameters()) {
    const auto& e = ref.at("param." + p->name());
    std::vector<float> mine(static_cast<std::size_t>(p->numel()));
    if (p->layout() == nn::Layout::Krsc)
      train::detail::oihw_to_krsc(reinterpret_cast<const float*>(e.data.data()), mine.data(), p->shape());
    else
      mine = e.template as<float>();
    const double d = rel_diff(p->value().data(), mine);
    if (d >= worst) worst = d, where = p->name();
  }
  return worst;
}

}  // namespace ddp::test::torch_ddp
