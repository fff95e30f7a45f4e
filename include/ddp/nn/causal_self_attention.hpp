// CausalSelfAttention: minGPT's masked multi-head self-attention with its output projection,
// x (B, T, C) -> (B, T, C).
// SPDX-License-Identifier: MIT
//
// karpathy/minGPT's mingpt/model.py CausalSelfAttention, whose state_dict keys we keep:
//   qkv = c_attn(x)                        Linear(C, 3C): q, k, v side by side, (B, T, 3C)
//   q, k, v -> (B, nh, T, hs)              hs = C / n_head (our kernels read qkv in place)
//   att = softmax(mask(q k^T / sqrt(hs)))  causal: position t attends to positions <= t only
//   att = attn_dropout(att)                Dropout(attn_pdrop), in training only
//   y = att v -> (B, T, C)                 the heads side by side again
//   y = c_proj(y)                          Linear(C, C)
// Parameters "c_attn.weight" (3C, C), "c_attn.bias" (3C), "c_proj.weight" (C, C), "c_proj.bias"
// (C). minGPT's causal-mask buffer "bias" (1, 1, block_size, block_size) is computed instead, so a
// loader must skip that key (as minGPT's from_pretrained does). block_size is the longest T
// accepted. Dropout is inverted (kept probabilities scaled by 1 / (1 - attn_pdrop)); eval() or
// attn_pdrop = 0 draw nothing. Its mask is nn::Dropout's (docs/decisions/0043), a pure function of
// (seed, rank, stream, step) and the element of att (B, nh, T, T): step() counts training forwards,
// set_step() restores it on resume, and each attention of a model needs its own stream.
// resid_pdrop must be 0 (GPT has that Dropout in its AttentionLayer instead).
// Memory: forward keeps qkv (B, T, 3C), att (B, nh, T, T) and the heads' output (B, T, C) for
// c_proj's backward; att is kept, not recomputed (docs/decisions/0044). With dropout att stays
// undropped (the softmax backward needs it) and no mask is kept: backward draws it again.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/attention_args.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/nn/linear.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/tensor/random.hpp"

namespace ddp::nn {

struct CausalSelfAttentionOptions {
  std::int64_t n_embd = 0;      // C
  std::int64_t n_head = 1;      // must divide n_embd
  std::int64_t block_size = 0;  // longest sequence T accepted
  double attn_pdrop = 0.0;      // dropout on att, in [0, 1]
  double resid_pdrop = 0.0;     // dropout on the output (only 0 is implemented)
  // The attention dropout's mask (as nn::DropoutOptions): the run's seed, this process's global
  // rank, and a Philox stream no other dropout of the model uses.
  std::uint64_t seed = 0;
  std::uint32_t rank = 0;
  std::uint32_t stream = kStreamDropout;
};

template <class T, Device D>
class CausalSelfAttention : public Module<T, D> {
 public:
  explicit CausalSelfAttention(const CausalSelfAttentionOptions& o) : o_(o) {
    if (o.n_embd < 1 || o.n_head < 1 || o.block_size < 1)
      throw ValueError(ddp::detail::str("ddp: invalid ", describe(),
                                        ": n_embd, n_head and block_size must be >= 1"));
    if (o.n_embd % o.n_head != 0)
      throw ValueError(ddp::detail::str("ddp: invalid ", describe(), ": n_embd = ", o.n_embd,
                                        " is not divisible by n_head = ", o.n_head,
                                        "; each head gets n_embd / n_head channels"));
    check_probability("attn_pdrop", o.attn_pdrop);
    check_probability("resid_pdrop", o.resid_pdrop);
    if (o.resid_pdrop > 0.0)
      throw ValueError(ddp::detail::str(
          "ddp: ", describe(), ": resid_pdrop = ", o.resid_pdrop,
          " but dropout on the attention's output is not implemented; set it to 0 and "
          "put an nn::Dropout after the module (as GPT's AttentionLayer does)"));
    c_attn_ = &this->register_module(
        "c_attn", std::make_unique<Linear<T, D>>(
                      LinearOptions{.in_features = o.n_embd, .out_features = 3 * o.n_embd}));
    c_proj_ =
        &this->register_module("c_proj", std::make_unique<Linear<T, D>>(LinearOptions{
                                             .in_features = o.n_embd, .out_features = o.n_embd}));
  }

  // torch.nn.Linear's default initialisation for both projections (GPT re-initialises them).
  void reset_parameters(Generator& gen) {
    c_attn_->reset_parameters(gen);
    c_proj_->reset_parameters(gen);
  }

  const CausalSelfAttentionOptions& options() const noexcept { return o_; }
  Linear<T, D>& c_attn() noexcept { return *c_attn_; }
  Linear<T, D>& c_proj() noexcept { return *c_proj_; }
  // Training forwards so far: the next one draws this step's dropout mask.
  std::uint64_t step() const noexcept { return step_; }
  void set_step(std::uint64_t step) noexcept { step_ = step; }

  std::string describe() const override {
    return ddp::detail::str("CausalSelfAttention(n_embd=", o_.n_embd, ", n_head=", o_.n_head,
                            ", block_size=", o_.block_size, ", attn_pdrop=", o_.attn_pdrop,
                            ", resid_pdrop=", o_.resid_pdrop, ")");
  }

  Tensor<T, D> forward_impl(Exec<D>& exec, TensorView<const T, D> x) override {
    if (x.rank() != 3 || x.dim(0) < 1 || x.dim(1) < 1)
      throw ValueError(ddp::detail::str("ddp: ", this->where(),
                                        ": input must be (B, T, C) with B, T >= 1 but has shape ",
                                        x.shape()));
    const std::int64_t b = x.dim(0), t = x.dim(1), c = o_.n_embd;
    if (x.dim(2) != c)
      throw ValueError(ddp::detail::str("ddp: ", this->where(), ": input ", x.shape(), " has ",
                                        x.dim(2), " channels but n_embd is ", c));
    if (t > o_.block_size)
      throw ValueError(ddp::detail::str(
          "ddp: ", this->where(), ": sequence length T = ", t, " exceeds block_size = ",
          o_.block_size, "; crop the input to the last block_size positions or raise block_size"));
    // The Linears see (B*T, C) rows.
    qkv_ = c_attn_->forward(exec, x.reshape(Shape{b * t, c}));
    qkv_.reshape(Shape{b, t, 3 * c});
    att_ = Tensor<T, D>(Shape{b, o_.n_head, t, t});
    heads_ = Tensor<T, D>(Shape{b * t, c});
    drop_ = kernels::AttentionDropout{};  // p = 0: none
    if (this->is_training() && o_.attn_pdrop > 0.0)
      drop_ = {
          .p = o_.attn_pdrop, .seed = o_.seed, .rank = o_.rank, .stream = o_.stream, .step = step_};
    Kernels<D>::attention_forward(
        exec, kernels::AttentionForwardArgs<T, D>{.qkv = qkv_.cview(),
                                                  .att = att_.view(),
                                                  .y = heads_.view().reshape(Shape{b, t, c}),
                                                  .n_head = o_.n_head,
                                                  .dropout = drop_});
    if (this->is_training()) ++step_;
    Tensor<T, D> y = c_proj_->forward(exec, heads_.cview());
    y.reshape(Shape{b, t, c});
    have_state_ = true;
    return y;
  }

  Tensor<T, D> backward_impl(Exec<D>& exec, TensorView<const T, D> dy) override {
    this->require_forward_state(have_state_);
    const std::int64_t b = qkv_.dim(0), t = qkv_.dim(1), c = o_.n_embd;
    expect_shape(dy, Shape{b, t, c}, "output gradient dy", this->where().c_str());
    have_state_ = false;
    // c_proj's grads are final here
    Tensor<T, D> dheads = c_proj_->backward(exec, dy.reshape(Shape{b * t, c}));
    heads_ = Tensor<T, D>();
    Tensor<T, D> dqkv(Shape{b * t, 3 * c});
    Kernels<D>::attention_backward(
        exec, kernels::AttentionBackwardArgs<T, D>{.qkv = qkv_.cview(),
                                                   .att = att_.cview(),
                                                   .dy = dheads.cview().reshape(Shape{b, t, c}),
                                                   .dqkv = dqkv.view().reshape(Shape{b, t, 3 * c}),
                                                   .n_head = o_.n_head,
                                                   .dropout = drop_});
    att_ = Tensor<T, D>();
    qkv_ = Tensor<T, D>();
    Tensor<T, D> dx = c_attn_->backward(exec, dqkv.cview());
    dx.reshape(Shape{b, t, c});
    return dx;
  }

 private:
  void check_probability(const char* name, double p) const {
    if (!(p >= 0.0 && p <= 1.0))
      throw ValueError(ddp::detail::str("ddp: invalid ", describe(), ": ", name, " = ", p,
                                        " must be in [0, 1]"));
  }

  CausalSelfAttentionOptions o_;
  Linear<T, D>* c_attn_ = nullptr;  // (C -> 3C)
  Linear<T, D>* c_proj_ = nullptr;  // (C -> C)
  Tensor<T, D> qkv_;                // (B, T, 3C): c_attn's output, the attention's input
  Tensor<T, D> att_;                // (B, nh, T, T): softmax probabilities, 0 above the diagonal
  // (B*T, C): the heads' output side by side, c_proj's input (it keeps a view)
  Tensor<T, D> heads_;
  // the last forward's draw (p = 0: none), which backward draws again
  kernels::AttentionDropout drop_;
  std::uint64_t step_ = 0;  // training forwards so far
  bool have_state_ = false;
};

}  // namespace ddp::nn
