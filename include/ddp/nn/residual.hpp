// ResidualBlock: forward and backward of ResNet's residual blocks, written once for BasicBlock and
// Bottleneck.
// SPDX-License-Identifier: MIT
//
//   out = relu(bn_L(conv_L(... relu(bn_1(conv_1(x))) ...)) + identity)
//   identity = downsample(x) or x
// A block registers its modules under torchvision's names and order (conv1, bn1, ..., downsample),
// then lists its main path as (conv, bn) stages with add_stage() and its projection with
// set_downsample() (docs/decisions/0019). Each stage is conv -> BatchNorm2d::forward_act (bn +
// ReLU; the last adds the skip before its ReLU). The ReLUs may overwrite the bn outputs because
// BatchNorm's backward needs its input (torchvision's ReLU(inplace=True)). The skip term is freed
// once added: backward does not read it.
// Backward: the last bn's backward_act masks g = dy * (y > 0), the skip path's gradient (through
// downsample.backward if any); the main path runs back stage by stage, and conv_1 adds its input
// gradient into the skip gradient in place (Conv2d::backward_accumulate, docs/decisions/0061), so
// dx = main + skip costs no pass or tensor of its own.
// Gradient order (DDP's first-step buckets follow it): bn_L, downsample.1, downsample.0, conv_L,
// bn_{L-1}, conv_{L-1}, ..., bn_1, conv_1. Example, BasicBlock with downsample: bn2.weight,
// bn2.bias, downsample.1.weight, downsample.1.bias, downsample.0.weight, conv2.weight, bn1.weight,
// bn1.bias, conv1.weight.
// Recomputation (BlockOptions::recompute_relu, docs/decisions/0068): stage i's a = relu(bn_i(c_i))
// is read in backward only by conv_{i+1}'s wgrad and bn_i's mask, conv_{i+1} first. So forward
// frees a after conv_{i+1}; backward recomputes it (bit-identical, so the same gradients) just
// before conv_{i+1}'s backward and frees it after bn_i's. A synchronised bn keeps its a.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/nn/batchnorm2d.hpp"
#include "ddp/nn/conv2d.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/sequential.hpp"

namespace ddp::nn {

struct BlockOptions {
  std::int64_t inplanes = 64;
  std::int64_t planes = 64;
  std::int64_t stride = 1;
  bool downsample = false;  // add the 1x1 conv + BN projection on the skip path
  // Free the main path's relu(bn) outputs after forward and recompute them in backward: less
  // memory for one more BatchNorm forward per stage. Off by default, as torch
  // (docs/decisions/0068).
  bool recompute_relu = false;
};

namespace detail {
// Sequential(Conv2d(inplanes, outplanes, 1, stride, bias=False), BatchNorm2d(outplanes)):
// torchvision's downsample, named "downsample.0" / "downsample.1".
template <class T, Device D, class A = T>
std::unique_ptr<Sequential<T, D, A>> make_downsample(std::int64_t inplanes, std::int64_t outplanes,
                                                     std::int64_t stride) {
  auto ds = std::make_unique<Sequential<T, D, A>>();
  ds->push_back(std::make_unique<Conv2d<T, D, A>>(Conv2dOptions{.in_channels = inplanes,
                                                                .out_channels = outplanes,
                                                                .kernel_size = 1,
                                                                .stride = stride,
                                                                .padding = 0,
                                                                .bias = false}));
  ds->push_back(
      std::make_unique<BatchNorm2d<T, D, A>>(BatchNorm2dOptions{.num_features = outplanes}));
  return ds;
}
}  // namespace detail

template <class T, Device D, class A = T>
class ResidualBlock : public Module<T, D, A> {
 public:
  // x (N, H, W, inplanes) -> out (N, H', W', planes * expansion). x must stay alive until backward.
  Tensor<A, D> forward_impl(Exec<D>& exec, TensorView<const A, D> x) override {
    TensorView<const A, D> h = x;
    for (std::size_t i = 0; i + 1 < stages_.size(); ++i) {
      Stage& st = stages_[i];
      st.c = st.conv->forward(exec, h);
      st.a = st.bn->forward_act(exec, st.c.cview(), {}, true);
      if (i > 0) drop_input_of(i);  // conv_i has read stage i-1's output
      h = st.a.cview();
    }
    Stage& last = stages_.back();
    last.c = last.conv->forward(exec, h);
    if (stages_.size() > 1) drop_input_of(stages_.size() - 1);
    TensorView<const A, D> skip = x;
    Tensor<A, D> id;  // downsample(x), dead once added below
    if (downsample_) {
      id = downsample_->forward(exec, x);
      skip = id.cview();
    } else if (!(x.shape() == last.c.shape())) {
      throw ValueError(ddp::detail::str("ddp: ", this->where(), ": input ", x.shape(),
                                        " and main-path output ", last.c.shape(),
                                        " differ but the block has no downsample"));
    }
    Tensor<A, D> out = last.bn->forward_act(exec, last.c.cview(), skip, true);
    y_ = out.cview();
    have_state_ = true;
    return out;
  }

  Tensor<A, D> backward_impl(Exec<D>& exec, TensorView<const A, D> dy) override {
    this->require_forward_state(have_state_);
    have_state_ = false;
    if (!(dy.shape() == y_.shape()))
      throw ValueError(ddp::detail::str("ddp: backward of ", this->where(),
                                        ": output gradient has shape ", dy.shape(),
                                        " but the output has shape ", y_.shape()));
    Tensor<A, D> g(dy.shape());  // dy * (out > 0): the skip path's gradient
    Stage& last = stages_.back();
    Tensor<A, D> h = last.bn->backward_act(exec, dy, y_, g.view());
    // dx starts as the skip gradient (x's shape); conv_1 adds the main path's into it.
    Tensor<A, D> dx = downsample_ ? downsample_->backward(exec, g.cview()) : std::move(g);
    g = {};
    for (std::size_t i = stages_.size(); i-- > 0;) {
      Stage& st = stages_[i];
      if (i + 1 < stages_.size()) {
        h = st.bn->backward_act(exec, h.cview(), st.a.cview(), {});
        if (st.recomputed) st.a = {};
      }
      if (i > 0) {
        Stage& prev = stages_[i - 1];
        if (prev.recomputed) {  // conv_i's input, freed in forward
          prev.a = prev.bn->recompute_act(exec);
          st.conv->rebind_input(prev.a.cview());
        }
        h = st.conv->backward(exec, h.cview());
      } else {
        st.conv->backward_accumulate(exec, h.cview(), dx.view());
      }
    }
    for (Stage& st : stages_) {
      st.c = {};
      st.a = {};
    }
    return dx;
  }

 protected:
  // Appends (conv, bn) to the main path; a block calls it once per stage, first stage first.
  void add_stage(Conv2d<T, D, A>* conv, BatchNorm2d<T, D, A>* bn) {
    stages_.push_back(Stage{.conv = conv, .bn = bn});
  }
  // The skip path's projection (nullptr: identity).
  void set_downsample(Sequential<T, D, A>* downsample) { downsample_ = downsample; }
  // BlockOptions::recompute_relu.
  void set_recompute_relu(bool on) noexcept { recompute_relu_ = on; }

 private:
  struct Stage {
    Conv2d<T, D, A>* conv = nullptr;
    BatchNorm2d<T, D, A>* bn = nullptr;
    Tensor<A, D> c;  // conv output (N, H', W', C'), bn's input
    // relu(bn(c)): the next conv's input and this stage's ReLU mask
    Tensor<A, D> a;
    bool recomputed = false;  // a was freed after forward; backward computes it again
  };

  // Stage i's conv has read stage i-1's output: free it when it can be recomputed.
  void drop_input_of(std::size_t i) {
    Stage& prev = stages_[i - 1];
    prev.recomputed = recompute_relu_ && !prev.bn->forward_synchronised();
    if (prev.recomputed) prev.a = {};
  }

  std::vector<Stage> stages_;
  Sequential<T, D, A>* downsample_ = nullptr;
  bool recompute_relu_ = false;
  TensorView<const A, D> y_;  // the block's output, owned by the caller
  bool have_state_ = false;
};

}  // namespace ddp::nn
