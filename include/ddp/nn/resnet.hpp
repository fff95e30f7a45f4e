// ResNet: torchvision's resnet18/34/50/101/152 by arch name, with its structure, names and
// initialisation.
// SPDX-License-Identifier: MIT
//
// Structure (torchvision.models.resnet.ResNet), activations NHWC:
//   conv1 7x7/2 pad 3 (3 -> 64) - bn1 - relu - maxpool 3x3/2 pad 1
//   layer1..layer4: blocks (BasicBlock for 18/34, Bottleneck for 50/101/152), planes 64, 128,
//     256, 512, strides 1, 2, 2, 2; block 0 gets a downsample (1x1 conv with the layer's stride
//     + BN) when the stride is not 1 or the channel count changes
//   avgpool (adaptive, 1x1) - flatten - fc (512 * expansion -> num_classes)
// Blocks per layer: resnet18 [2,2,2,2], resnet34 [3,4,6,3], resnet50 [3,4,6,3], resnet101
// [3,4,23,3], resnet152 [3,8,36,3]. Example: resnet18 at 224x224 goes (N,224,224,3) -> conv1
// (N,112,112,64) -> maxpool (N,56,56,64) -> layer1 (N,56,56,64) -> layer2 (N,28,28,128) -> layer3
// (N,14,14,256) -> layer4 (N,7,7,512) -> avgpool (N,1,1,512) -> fc (N,num_classes); 11,689,512
// parameters at 1000 classes.
// Initialisation (torchvision's), drawn from Generator(seed, 0, kStreamInit) module by module in
// registration order: convs ~ N(0, 2 / (C_out kH kW)) (kaiming_normal_, fan_out, relu); BN weight
// 1, bias 0; fc weight and bias ~ U(+-1/sqrt(in)); with zero_init_residual each block's last BN
// weight starts at 0. The distributions are PyTorch's, the numbers are not. The layers skip their
// own default initialisation, so building a ResNet leaves the default generator untouched.
// `width` scales every channel count (torchvision: 64) without changing any name.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/nn/adaptive_avg_pool2d.hpp"
#include "ddp/nn/basic_block.hpp"
#include "ddp/nn/batchnorm2d.hpp"
#include "ddp/nn/bottleneck.hpp"
#include "ddp/nn/conv2d.hpp"
#include "ddp/nn/init.hpp"
#include "ddp/nn/linear.hpp"
#include "ddp/nn/maxpool2d.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/sequential.hpp"
#include "ddp/tensor/random.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::nn {

struct ResNetOptions {
  std::string arch = "resnet18";  // resnet18, resnet34, resnet50, resnet101, resnet152
  std::int64_t num_classes = 1000;
  bool zero_init_residual = false;
  // initialisation seed (DDP broadcasts rank 0's parameters anyway)
  std::uint64_t seed = 0;
  std::int64_t in_channels = 3;
  std::int64_t width = 64;  // channels of conv1 and layer1's planes; torchvision: 64
  // Free the stem's and the blocks' relu(bn) outputs after forward and recompute them in
  // backward: same gradients, less memory (docs/decisions/0068). Off by default, as PyTorch.
  bool recompute_relu = false;
};

// Blocks per layer and block type of an arch name; throws ValueError listing the valid names.
struct ResNetSpec {
  bool bottleneck = false;
  std::vector<std::int64_t> layers;
};
inline ResNetSpec resnet_spec(const std::string& arch) {
  if (arch == "resnet18") return {false, {2, 2, 2, 2}};
  if (arch == "resnet34") return {false, {3, 4, 6, 3}};
  if (arch == "resnet50") return {true, {3, 4, 6, 3}};
  if (arch == "resnet101") return {true, {3, 4, 23, 3}};
  if (arch == "resnet152") return {true, {3, 8, 36, 3}};
  throw ValueError(
      ddp::detail::str("ddp: unknown ResNet arch ", ddp::detail::quoted(arch),
                       "; valid: resnet18, resnet34, resnet50, resnet101, resnet152 (--arch)"));
}

template <class T, Device D, class A = T>
class ResNet : public Module<T, D, A> {
 public:
  explicit ResNet(const ResNetOptions& o) : o_(o), spec_(resnet_spec(o.arch)) {
    const SkipDefaultInit skip;  // reset_parameters() below draws every parameter
    if (o.num_classes < 1)
      throw ValueError(ddp::detail::str("ddp: ResNet needs num_classes >= 1, got ", o.num_classes,
                                        " (--num-classes)"));
    if (o.in_channels < 1 || o.width < 1)
      throw ValueError(ddp::detail::str("ddp: ResNet needs in_channels >= 1 and width >= 1, got ",
                                        o.in_channels, " and ", o.width));
    const std::int64_t expansion =
        spec_.bottleneck ? Bottleneck<T, D, A>::kExpansion : BasicBlock<T, D, A>::kExpansion;
    conv1_ = &this->register_module(
        "conv1", std::make_unique<Conv2d<T, D, A>>(Conv2dOptions{.in_channels = o.in_channels,
                                                                 .out_channels = o.width,
                                                                 .kernel_size = 7,
                                                                 .stride = 2,
                                                                 .padding = 3,
                                                                 .bias = false}));
    conv1_->set_input_grad(false);  // nothing upstream of the image needs a gradient
    bn1_ = &this->register_module(
        "bn1", std::make_unique<BatchNorm2d<T, D, A>>(BatchNorm2dOptions{.num_features = o.width}));
    maxpool_ = std::make_unique<MaxPool2d<T, D, A>>(
        MaxPool2dOptions{.kernel_size = 3, .stride = 2, .padding = 1});
    Module<T, D, A>::set_detached_path(*maxpool_, "maxpool");  // torchvision's attribute name
    std::int64_t inplanes = o.width;
    for (int l = 0; l < 4; ++l) {
      const std::int64_t planes = o.width << l, stride = l == 0 ? 1 : 2;
      auto seq = std::make_unique<Sequential<T, D, A>>();
      for (std::int64_t b = 0; b < spec_.layers[static_cast<std::size_t>(l)]; ++b) {
        const BlockOptions bo{
            .inplanes = inplanes,
            .planes = planes,
            .stride = b == 0 ? stride : 1,
            .downsample = b == 0 && (stride != 1 || inplanes != planes * expansion),
            .recompute_relu = o.recompute_relu};
        if (spec_.bottleneck)
          last_bns_.push_back(&seq->push_back(std::make_unique<Bottleneck<T, D, A>>(bo)).last_bn());
        else
          last_bns_.push_back(&seq->push_back(std::make_unique<BasicBlock<T, D, A>>(bo)).last_bn());
        inplanes = planes * expansion;
      }
      layers_[l] = &this->register_module(ddp::detail::str("layer", l + 1), std::move(seq));
    }
    avgpool_ = std::make_unique<AdaptiveAvgPool2d<T, D, A>>(1, 1);
    Module<T, D, A>::set_detached_path(*avgpool_, "avgpool");
    fc_ = &this->register_module(
        "fc", std::make_unique<Linear<T, D, A>>(LinearOptions{
                  .in_features = inplanes, .out_features = o.num_classes, .bias = true}));
    reset_parameters();
  }

  // torchvision's initialisation (see the file comment), deterministic in options().seed.
  void reset_parameters() {
    Generator gen(o_.seed, 0, kStreamInit);
    this->visit([&](Module<T, D, A>& m) {
      if (auto* c = dynamic_cast<Conv2d<T, D, A>*>(&m)) {
        const auto& co = c->options();
        const double fan_out =
            static_cast<double>(co.out_channels * co.kernel_size * co.kernel_size);
        init_normal(c->weight(), gen, 0.0, std::sqrt(2.0 / fan_out));
      } else if (auto* bn = dynamic_cast<BatchNorm2d<T, D, A>*>(&m)) {
        bn->reset_parameters();
      } else if (auto* fc = dynamic_cast<Linear<T, D, A>*>(&m)) {
        fc->reset_parameters(gen);
      }
    });
    if (o_.zero_init_residual)
      for (auto* bn : last_bns_) detail::fill_value(bn->weight().value(), T(0));
  }

  const ResNetOptions& options() const noexcept { return o_; }
  std::string describe() const override {
    return ddp::detail::str("ResNet(", o_.arch, ", num_classes=", o_.num_classes,
                            o_.width != 64 ? ddp::detail::str(", width=", o_.width) : std::string(),
                            ")");
  }
  Conv2d<T, D, A>& conv1() noexcept { return *conv1_; }
  Linear<T, D, A>& fc() noexcept { return *fc_; }
  // i in 1..4
  Sequential<T, D, A>& layer(int i) { return *layers_.at(static_cast<std::size_t>(i - 1)); }

  // x (N, H, W, in_channels) NHWC -> logits (N, num_classes). x must stay alive until backward.
  Tensor<A, D> forward_impl(Exec<D>& exec, TensorView<const A, D> x) override {
    if (x.rank() != 4)
      throw ValueError(ddp::detail::str("ddp: ", this->where(),
                                        ": input must be an NHWC batch (N, H, W, ", o_.in_channels,
                                        "), got shape ", x.shape()));
    if (x.dim(0) == 0)
      throw ValueError(ddp::detail::str("ddp: ", this->where(),
                                        ": batch of zero images (input shape ", x.shape(),
                                        "); check --batch-size and the loader"));
    if (x.dim(3) != o_.in_channels)
      throw ValueError(
          ddp::detail::str("ddp: ", this->where(), ": input has ", x.dim(3),
                           " channels but the model takes ", o_.in_channels, " (input shape ",
                           x.shape(), "; images must be NHWC, channels last: is the input NCHW?)"));
    acts_.clear();
    acts_.push_back(conv1_->forward(exec, x));
    acts_.push_back(bn1_->forward_act(exec, acts_.back().cview(), {}, true));
    acts_.push_back(maxpool_->forward(exec, acts_.back().cview()));
    // relu(bn1) is read again only as bn1's ReLU mask (the max pool kept its argmax)
    stem_recomputed_ = o_.recompute_relu && !bn1_->forward_synchronised();
    if (stem_recomputed_) acts_[1] = {};
    for (auto* layer : layers_) acts_.push_back(layer->forward(exec, acts_.back().cview()));
    acts_.push_back(avgpool_->forward(exec, acts_.back().cview()));
    const std::int64_t n = x.dim(0), c = acts_.back().dim(3);
    return fc_->forward(exec, acts_.back().cview().reshape(Shape{n, c}));
  }

  // dlogits (N, num_classes) -> empty (the image needs no gradient); fills every parameter's grad.
  Tensor<A, D> backward_impl(Exec<D>& exec, TensorView<const A, D> dlogits) override {
    this->require_forward_state(acts_.size() == 8);
    Tensor<A, D> g = fc_->backward(exec, dlogits);
    const Shape pooled = acts_[7].shape();
    g.reshape(pooled);
    g = avgpool_->backward(exec, g.cview());
    for (int l = 3; l >= 0; --l)
      g = layers_[static_cast<std::size_t>(l)]->backward(exec, g.cview());
    g = maxpool_->backward(exec, g.cview());
    if (stem_recomputed_) acts_[1] = bn1_->recompute_act(exec);
    g = bn1_->backward_act(exec, g.cview(), acts_[1].cview(), {});
    Tensor<A, D> dx = conv1_->backward(exec, g.cview());
    acts_.clear();
    return dx;
  }

 private:
  ResNetOptions o_;
  ResNetSpec spec_;
  Conv2d<T, D, A>* conv1_ = nullptr;
  BatchNorm2d<T, D, A>* bn1_ = nullptr;
  // no state_dict entries: kept outside the tree
  std::unique_ptr<MaxPool2d<T, D, A>> maxpool_;
  std::array<Sequential<T, D, A>*, 4> layers_{};
  std::unique_ptr<AdaptiveAvgPool2d<T, D, A>> avgpool_;  // likewise
  Linear<T, D, A>* fc_ = nullptr;
  std::vector<BatchNorm2d<T, D, A>*> last_bns_;  // zero_init_residual targets
  // conv1, relu(bn1), maxpool, layer1..4, avgpool outputs: (N, H', W', C) each
  std::vector<Tensor<A, D>> acts_;
  bool stem_recomputed_ = false;  // acts_[1] was freed after forward
};

}  // namespace ddp::nn
