// gpt_ops_loss: the forward of nn::GPT (the DDP tutorial's minGPT) written with autograd ops over that GPT's own
// parameters (Var::parameter), ending in the mean cross-entropy: backward() on the result fills every parameter's
// grad() as model.backward() does. bench_gpt_cpu times it beside the explicit forward/backward (issue 41: the
// cost of writing a model with ops); tests/unit/autograd/test_gpt_written_with_ops.cpp checks it against the explicit GPT.
// SPDX-License-Identifier: MIT
//
// Per block, the explicit modules' computation written out (nn/gpt.hpp, nn/causal_self_attention.hpp):
//   a = ln1(x); qkv = c_attn(a) (B, T, 3C)
//   y = causal_attention(qkv, nh) (B, T, C): softmax(q k^T / sqrt(hs) + causal mask) v per head, one fused op
//   y = resid_drop(c_proj(attn.c_proj(y))); x1 = x + y
//   x = x1 + mlp_drop(mlp.2(gelu(mlp.0(ln2(x1)))))
// then ln_f, head (no bias), cross_entropy over the B*T rows. Dropout draws the explicit modules' masks: each
// nn::Dropout's (p, seed, rank, stream) with the given step (the explicit modules' step() before their forward).
// Attention dropout (attn_pdrop > 0) is not written here: ValueError.
#pragma once

#include <cstdint>

#include <ddp/autograd/autograd.hpp>
#include <ddp/core/error.hpp>
#include <ddp/nn/gpt.hpp>

namespace ddp::bench_gpt_ops {

template <class T>
using V = autograd::Var<T, Cpu>;

template <class T>
V<T> param(nn::Parameter<T, Cpu>& p, const Exec<Cpu>& exec) {
  return V<T>::parameter(p, exec);
}
template <class T>
V<T> linear(nn::Linear<T, Cpu>& l, const V<T>& x, const Exec<Cpu>& exec) {
  return autograd::linear(x, param(l.weight(), exec), l.bias() ? param(*l.bias(), exec) : V<T>());
}
template <class T>
V<T> layer_norm(nn::LayerNorm<T, Cpu>& l, const V<T>& x, const Exec<Cpu>& exec) {
  return autograd::layer_norm(x, param(*l.weight(), exec), param(*l.bias(), exec));
}
template <class T>
V<T> dropout(nn::Dropout<T, Cpu>& d, const V<T>& x, std::uint64_t step) {
  const auto& o = d.options();
  if (o.p == 0.0) return x;  // nothing drawn, no copy
  return autograd::dropout(x, autograd::DropoutOptions{.p = o.p, .seed = o.seed, .rank = o.rank, .stream = o.stream,
                                                       .step = step});
}

// ids (B, T), targets (B*T) int64 -> the mean cross-entropy of model's logits (a one-element Var).
template <class T>
V<T> gpt_ops_loss(nn::GPT<T, Cpu>& model, const Exec<Cpu>& exec, const Tensor<std::int64_t, Cpu>& ids,
                  const Tensor<std::int64_t, Cpu>& targets, std::uint64_t dropout_step) {
  const nn::GPTOptions& o = model.options();
  if (o.attn_pdrop != 0.0)
    throw ValueError("ddp: gpt_ops_loss: attention dropout is not written with ops; build the GPT with attn_pdrop 0");
  const std::int64_t b = ids.shape()[0], t = ids.shape()[1];
  auto& stem = model.emb_stem();
  V<T> pos = autograd::narrow(param(stem.pos_emb(), exec), 1, 0, t);                // (1, T, C)
  V<T> x = dropout(stem.drop(), autograd::embedding(ids, param(stem.tok_emb().weight(), exec)) + pos, dropout_step);
  for (std::int64_t i = 0; i < o.n_layer; ++i) {
    auto& blk = model.block(static_cast<std::size_t>(i));
    auto& csa = blk.attn().attn();
    const V<T> qkv = linear(csa.c_attn(), layer_norm(blk.ln1(), x, exec), exec);  // (B, T, 3C)
    V<T> y = autograd::causal_attention(qkv, o.n_head);                         // (B, T, C)
    y = linear(blk.attn().c_proj(), linear(csa.c_proj(), y, exec), exec);
    x = x + dropout(blk.attn().resid_drop(), y, dropout_step);
    V<T> m = linear(blk.mlp_proj(), autograd::gelu(linear(blk.mlp_fc(), layer_norm(blk.ln2(), x, exec), exec)), exec);
    x = x + dropout(blk.mlp_drop(), m, dropout_step);
  }
  V<T> logits = linear(model.head(), layer_norm(model.ln_f(), x, exec), exec);  // (B, T, V)
  return autograd::cross_entropy(autograd::reshape(logits, Shape{b * t, o.vocab_size}), targets);
}

}  // namespace ddp::bench_gpt_ops
