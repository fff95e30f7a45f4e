// Three user models written with ops only (nn::OpsModule), shared by the torch comparison
// (test_ops_models.cpp, make_ops_model_reference.py builds the same models in torch) and the DDP tests
// (tests/unit/parallel/test_ddp_ops_models.cpp):
//   ResCnn:      NHWC (N, 6, 6, 3) -> conv3x3 + relu -> residual block (conv, relu, conv, + x, relu)
//                -> global average pool -> linear -> (N, 5) logits.
//   SwiGluMlp:   (N, 6) -> linear -> h + down(silu(gate(h)) * up(h)) -> linear -> (N, 5) logits.
//   TinyGpt:     ids (N, 5) over 11 tokens -> wte + wpe -> pre-norm causal self-attention (2 heads) and gelu MLP
//                blocks -> layer_norm -> linear(., wte): the output projection IS the input embedding (one weight)
//                -> (N * 5, 11) logits.
// Parameters are registered as in torch's modules of the same names (state_dict keys match the script's).
// SPDX-License-Identifier: MIT
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ddp/autograd/autograd.hpp>
#include <ddp/nn/ops_module.hpp>

namespace ddp::test::ops_models {

namespace ag = ddp::autograd;

// y = x W^T (+ b), W (out, in): torch.nn.Linear's parameters.
template <class T>
class LinearOp : public nn::OpsModule<T, Cpu> {
 public:
  using typename nn::OpsModule<T, Cpu>::Var;
  using typename nn::OpsModule<T, Cpu>::Graph;
  LinearOp(std::int64_t in, std::int64_t out, bool bias = true)
      : w_(&this->register_parameter("weight", Shape{out, in})),
        b_(bias ? &this->register_parameter("bias", Shape{out}) : nullptr) {}
  std::string describe() const override { return "LinearOp"; }

 protected:
  Var forward_ops(Graph& g, const Var& x) override { return ag::linear(x, g.param(*w_), b_ ? g.param(*b_) : Var()); }

 private:
  nn::Parameter<T, Cpu>* w_;
  nn::Parameter<T, Cpu>* b_;
};

// 3x3 convolution, padding 1, with bias; weight (C_out, 3, 3, C_in) (ddp's KRSC layout).
template <class T>
class ConvOp : public nn::OpsModule<T, Cpu> {
 public:
  using typename nn::OpsModule<T, Cpu>::Var;
  using typename nn::OpsModule<T, Cpu>::Graph;
  ConvOp(std::int64_t cin, std::int64_t cout)
      : w_(&this->register_parameter("weight", Shape{cout, 3, 3, cin}, nn::Layout::Krsc)),
        b_(&this->register_parameter("bias", Shape{cout})) {}
  std::string describe() const override { return "ConvOp"; }

 protected:
  Var forward_ops(Graph& g, const Var& x) override {
    return ag::conv2d(x, g.param(*w_), g.param(*b_), {.padding = {1, 1}});
  }

 private:
  nn::Parameter<T, Cpu>* w_;
  nn::Parameter<T, Cpu>* b_;
};

template <class T>
class LayerNormOp : public nn::OpsModule<T, Cpu> {
 public:
  using typename nn::OpsModule<T, Cpu>::Var;
  using typename nn::OpsModule<T, Cpu>::Graph;
  explicit LayerNormOp(std::int64_t c)
      : w_(&this->register_parameter("weight", Shape{c})), b_(&this->register_parameter("bias", Shape{c})) {}
  std::string describe() const override { return "LayerNormOp"; }

 protected:
  Var forward_ops(Graph& g, const Var& x) override { return ag::layer_norm(x, g.param(*w_), g.param(*b_), 1e-5); }

 private:
  nn::Parameter<T, Cpu>* w_;
  nn::Parameter<T, Cpu>* b_;
};

template <class T>
class ResBlock : public nn::OpsModule<T, Cpu> {
 public:
  using typename nn::OpsModule<T, Cpu>::Var;
  using typename nn::OpsModule<T, Cpu>::Graph;
  explicit ResBlock(std::int64_t c)
      : conv1_(&this->register_module("conv1", std::make_unique<ConvOp<T>>(c, c))),
        conv2_(&this->register_module("conv2", std::make_unique<ConvOp<T>>(c, c))) {}
  std::string describe() const override { return "ResBlock"; }

 protected:
  Var forward_ops(Graph& g, const Var& x) override { return ag::relu(x + g(*conv2_, ag::relu(g(*conv1_, x)))); }

 private:
  ConvOp<T>* conv1_;
  ConvOp<T>* conv2_;
};

template <class T>
class ResCnn : public nn::OpsModule<T, Cpu> {
 public:
  using typename nn::OpsModule<T, Cpu>::Var;
  using typename nn::OpsModule<T, Cpu>::Graph;
  static constexpr std::int64_t kClasses = 5;
  ResCnn()
      : stem_(&this->register_module("stem", std::make_unique<ConvOp<T>>(3, 8))),
        block_(&this->register_module("block", std::make_unique<ResBlock<T>>(8))),
        fc_(&this->register_module("fc", std::make_unique<LinearOp<T>>(8, kClasses))) {}
  std::string describe() const override { return "ResCnn"; }

 protected:
  Var forward_ops(Graph& g, const Var& x) override {
    Var h = g(*block_, ag::relu(g(*stem_, x)));                        // (N, 6, 6, 8)
    Var pooled = ag::adaptive_avg_pool2d(h, {1, 1});                   // (N, 1, 1, 8)
    return g(*fc_, ag::reshape(pooled, Shape{pooled.shape()[0], 8}));  // (N, 5)
  }

 private:
  ConvOp<T>* stem_;
  ResBlock<T>* block_;
  LinearOp<T>* fc_;
};

template <class T>
class SwiGluMlp : public nn::OpsModule<T, Cpu> {
 public:
  using typename nn::OpsModule<T, Cpu>::Var;
  using typename nn::OpsModule<T, Cpu>::Graph;
  static constexpr std::int64_t kClasses = 5;
  SwiGluMlp()
      : inp_(&this->register_module("inp", std::make_unique<LinearOp<T>>(6, 8))),
        gate_(&this->register_module("gate", std::make_unique<LinearOp<T>>(8, 16, false))),
        up_(&this->register_module("up", std::make_unique<LinearOp<T>>(8, 16, false))),
        down_(&this->register_module("down", std::make_unique<LinearOp<T>>(16, 8, false))),
        head_(&this->register_module("head", std::make_unique<LinearOp<T>>(8, kClasses))) {}
  std::string describe() const override { return "SwiGluMlp"; }

 protected:
  Var forward_ops(Graph& g, const Var& x) override {
    Var h = g(*inp_, x);
    h = h + g(*down_, ag::silu(g(*gate_, h)) * g(*up_, h));
    return g(*head_, h);
  }

 private:
  LinearOp<T>*inp_, *gate_, *up_, *down_, *head_;
};

template <class T>
class TinyGpt : public nn::OpsModule<T, Cpu> {
 public:
  using typename nn::OpsModule<T, Cpu>::Var;
  using typename nn::OpsModule<T, Cpu>::Graph;
  static constexpr std::int64_t kVocab = 11, kLen = 5, kC = 8, kHeads = 2;
  TinyGpt()
      : wte_(&this->register_parameter("wte", Shape{kVocab, kC})),
        wpe_(&this->register_parameter("wpe", Shape{kLen, kC})),
        ln1_(&this->register_module("ln1", std::make_unique<LayerNormOp<T>>(kC))),
        qkv_(&this->register_module("qkv", std::make_unique<LinearOp<T>>(kC, 3 * kC))),
        proj_(&this->register_module("proj", std::make_unique<LinearOp<T>>(kC, kC))),
        ln2_(&this->register_module("ln2", std::make_unique<LayerNormOp<T>>(kC))),
        fc_(&this->register_module("fc", std::make_unique<LinearOp<T>>(kC, 4 * kC))),
        fc_out_(&this->register_module("fc_out", std::make_unique<LinearOp<T>>(4 * kC, kC))),
        lnf_(&this->register_module("lnf", std::make_unique<LayerNormOp<T>>(kC))) {}
  std::string describe() const override { return "TinyGpt"; }

 protected:
  Var forward_ops(Graph& g, const Var& x) override {
    (void)g;
    this->reject_values(x.shape());
  }
  // ids (N, L) -> logits (N * L, V).
  Var forward_ops_ids(Graph& g, const Tensor<std::int64_t, Cpu>& ids) override {
    const std::int64_t n = ids.shape()[0], l = ids.shape()[1], hd = kC / kHeads;
    Tensor<std::int64_t, Cpu> pos(Shape{l});
    for (std::int64_t i = 0; i < l; ++i) pos.data()[i] = i;
    Tensor<T, Cpu> mask(Shape{l, l});  // additive causal mask: -1e9 above the diagonal
    for (std::int64_t i = 0; i < l; ++i)
      for (std::int64_t j = 0; j < l; ++j) mask.data()[i * l + j] = j > i ? T(-1e9) : T(0);
    Var wte = g.param(*wte_);
    Var h = ag::embedding(ids, wte) + ag::embedding(pos, g.param(*wpe_));  // (N, L, C)
    // causal self-attention
    auto heads = [&](const Var& t) { return ag::transpose(ag::reshape(t, Shape{n, l, kHeads, hd}), 1, 2); };
    auto qkv = ag::split(g(*qkv_, g(*ln1_, h)), {kC, kC, kC}, 2);
    Var q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);  // (N, H, L, hd)
    Var att = ag::matmul(q, ag::transpose(k, 2, 3)) * T(1.0 / std::sqrt(double(hd))) + g.constant(std::move(mask));
    Var y = ag::matmul(ag::softmax(att, 3), v);  // (N, H, L, hd)
    h = h + g(*proj_, ag::reshape(ag::transpose(y, 1, 2), Shape{n, l, kC}));
    h = h + g(*fc_out_, ag::gelu(g(*fc_, g(*ln2_, h))));
    Var logits = ag::linear(g(*lnf_, h), wte);  // the embedding, tied
    return ag::reshape(logits, Shape{n * l, kVocab});
  }

 private:
  nn::Parameter<T, Cpu>* wte_;
  nn::Parameter<T, Cpu>* wpe_;
  LayerNormOp<T>* ln1_;
  LinearOp<T>*qkv_, *proj_;
  LayerNormOp<T>* ln2_;
  LinearOp<T>*fc_, *fc_out_;
  LayerNormOp<T>* lnf_;
};

}  // namespace ddp::test::ops_models
