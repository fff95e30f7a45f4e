// Sequential: runs child modules in order (torch.nn.Sequential); children are named "0", "1", ...
// SPDX-License-Identifier: MIT
//
// forward keeps every intermediate output (children keep views of their inputs), and returns the
// last one; backward walks the children in reverse. ResNet's layer1..4 and each block's downsample
// are Sequentials, which is where state_dict names like "layer2.0.downsample.1.running_mean" come
// from.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/nn/module.hpp"

namespace ddp::nn {

template <class T, Device D, class A = T>
class Sequential : public Module<T, D, A> {
 public:
  Sequential() = default;

  // Appends `m` under the name "<index>"; returns it.
  template <class M>
  M& push_back(std::unique_ptr<M> m) {
    M& ref = this->register_module(std::to_string(layers_.size()), std::move(m));
    layers_.push_back(&ref);
    return ref;
  }
  std::size_t size() const noexcept { return layers_.size(); }
  Module<T, D, A>& operator[](std::size_t i) { return *layers_.at(i); }

  std::string describe() const override {
    return ddp::detail::str("Sequential(", layers_.size(), " modules)");
  }

  Tensor<A, D> forward_impl(Exec<D>& exec, TensorView<const A, D> x) override {
    if (layers_.empty())
      throw ValueError(ddp::detail::str("ddp: ", this->where(), " has no modules to run"));
    outputs_.clear();
    outputs_.reserve(layers_.size() - 1);
    TensorView<const A, D> cur = x;
    for (std::size_t i = 0; i + 1 < layers_.size(); ++i) {
      outputs_.push_back(layers_[i]->forward(exec, cur));
      cur = outputs_.back().cview();
    }
    return layers_.back()->forward(exec, cur);
  }

  Tensor<A, D> backward_impl(Exec<D>& exec, TensorView<const A, D> dy) override {
    this->require_forward_state(!layers_.empty() && outputs_.size() + 1 == layers_.size());
    Tensor<A, D> g = layers_.back()->backward(exec, dy);
    for (std::size_t i = layers_.size() - 1; i-- > 0;) g = layers_[i]->backward(exec, g.cview());
    outputs_.clear();
    return g;
  }

 private:
  std::vector<Module<T, D, A>*> layers_;
  std::vector<Tensor<A, D>> outputs_;  // outputs of layers_[0 .. n-2]
};

}  // namespace ddp::nn
