// Transformer layers as autograd ops on the existing kernels: embedding, layer_norm,
// causal_attention, dropout.
// SPDX-License-Identifier: MIT
#pragma once

#include "ddp/autograd/ops_core.hpp"

namespace ddp::autograd {

// ---- transformer layers as ops (the existing Kernels<D> members) ----
// Rows ids[...] of weight (V, C) (torch.nn.functional.embedding): ids of any shape S give (S...,
// C). The kernel checks every id; the weight's gradient adds the dy rows of repeated ids.
template <class T, Device D>
Var<T, D> embedding(const Tensor<std::int64_t, D>& ids, const Var<T, D>& weight) {
  const Shape& sw = weight.shape();
  if (sw.rank() != 2)
    throw ValueError(ddp::detail::str("ddp: autograd: embedding: weight ", sw, " must be (V, C)"));
  if (ids.rank() >= Shape::kMaxRank)
    throw ValueError(ddp::detail::str("ddp: autograd: embedding: ids of shape ", ids.shape(),
                                      " leave no room for C"));
  auto keep = detail::keep_indices(weight.exec(), ids, false).keep;
  const std::int64_t n = ids.numel(), c = sw[1];
  std::vector<std::int64_t> od = detail::dims_of(ids.shape());
  od.push_back(c);
  Tensor<T, D> y{Shape(od)};
  Kernels<D>::embedding_forward(
      weight.exec(), kernels::EmbeddingForwardArgs<T, D>{.ids = keep->cview().reshape(Shape{n}),
                                                         .weight = weight.value().cview(),
                                                         .y = y.view().reshape(Shape{n, c})});
  return detail::record<T, D>(
      "embedding", std::move(y), {weight.node_ptr()}, [keep, n, c](Node<T, D>& nd) {
        Tensor<T, D> dw(nd.inputs[0]->value.shape());
        Kernels<D>::embedding_backward(nd.exec, kernels::EmbeddingBackwardArgs<T, D>{
                                                    .ids = keep->cview().reshape(Shape{n}),
                                                    .dy = nd.grad.cview().reshape(Shape{n, c}),
                                                    .dweight = dw.view(),
                                                    // forward checked these very ids
                                                    .ids_checked = true});
        nd.inputs[0]->accumulate(std::move(dw));
      });
}

// Causal multi-head self-attention on the packed projection qkv (B, T, 3C) (q, k, v side by side,
// minGPT's c_attn output; head h is columns h * hs .. (h + 1) * hs of each, hs = C / n_head) -> y
// (B, T, C), the heads side by side: torch's (softmax(q k^T / sqrt(hs) + causal mask)
// v).transpose(1, 2).reshape(B, T, C) per head, in one op on Kernels<D>::attention_forward/backward
// (nn::CausalSelfAttention's kernels, kernels/attention_args.hpp). Keeps the probabilities (B, nh,
// T, T) for backward: one such tensor, and no (B, nh, T, hs) copies of q, k, v or y.
template <class T, Device D>
Var<T, D> causal_attention(const Var<T, D>& qkv, std::int64_t n_head) {
  const Shape& s = qkv.shape();
  if (s.rank() != 3 || s[2] % 3 != 0 || n_head < 1 || (s[2] / 3) % n_head != 0)
    throw ValueError(ddp::detail::str("ddp: autograd: causal_attention: qkv ", s,
                                      " must be (B, T, 3C) with C ",
                                      "divisible by n_head = ", n_head));
  const std::int64_t b = s[0], t = s[1], c = s[2] / 3;
  auto att = std::make_shared<Tensor<T, D>>(Shape{b, n_head, t, t});
  Tensor<T, D> y(Shape{b, t, c});
  Kernels<D>::attention_forward(
      qkv.exec(),
      kernels::AttentionForwardArgs<T, D>{
          .qkv = qkv.value().cview(), .att = att->view(), .y = y.view(), .n_head = n_head});
  return detail::record<T, D>(
      "causal_attention", std::move(y), {qkv.node_ptr()}, [att, n_head](Node<T, D>& nd) {
        Tensor<T, D> dqkv(nd.inputs[0]->value.shape());
        Kernels<D>::attention_backward(
            nd.exec, kernels::AttentionBackwardArgs<T, D>{.qkv = nd.inputs[0]->value.cview(),
                                                          .att = att->cview(),
                                                          .dy = nd.grad.cview(),
                                                          .dqkv = dqkv.view(),
                                                          .n_head = n_head});
        nd.inputs[0]->accumulate(std::move(dqkv));
      });
}

// torch.nn.functional.layer_norm over the last dim: x (..., C), weight and bias (C) or empty Vars
// for none.
template <class T, Device D>
Var<T, D> layer_norm(const Var<T, D>& x, const Var<T, D>& weight = {}, const Var<T, D>& bias = {},
                     double eps = 1e-5) {
  using S = kernels::LayerNormStat<T>;
  const Shape& sx = x.shape();
  if (sx.rank() < 1)
    throw ValueError(
        ddp::detail::str("ddp: autograd: layer_norm: x must have rank >= 1, got shape ", sx));
  const std::int64_t c = sx[-1], m = sx.numel() / std::max<std::int64_t>(c, 1);
  for (const Var<T, D>* p : {&weight, &bias})
    if (p->defined() && !(p->shape() == Shape{c}))
      throw ValueError(
          ddp::detail::str("ddp: autograd: layer_norm: ", p == &weight ? "weight" : "bias",
                           " has shape ", p->shape(), " but x ", sx, " needs (", c, ")"));
  auto mean = std::make_shared<Tensor<S, D>>(Shape{m});
  auto rstd = std::make_shared<Tensor<S, D>>(Shape{m});
  Tensor<T, D> y(sx);
  Kernels<D>::layer_norm_forward(
      x.exec(), kernels::LayerNormForwardArgs<T, D>{
                    .x = x.value().cview().reshape(Shape{m, c}),
                    .weight = weight.defined() ? weight.value().cview() : TensorView<const T, D>(),
                    .bias = bias.defined() ? bias.value().cview() : TensorView<const T, D>(),
                    .y = y.view().reshape(Shape{m, c}),
                    .mean = mean->view(),
                    .rstd = rstd->view(),
                    .eps = eps});
  std::vector<std::shared_ptr<Node<T, D>>> inputs{x.node_ptr()};
  const int wi = weight.defined() ? 1 : 0, bi = bias.defined() ? 1 + wi : 0;
  if (weight.defined()) inputs.push_back(weight.node_ptr());
  if (bias.defined()) inputs.push_back(bias.node_ptr());
  return detail::record<T, D>(
      "layer_norm", std::move(y), std::move(inputs), [mean, rstd, m, c, wi, bi](Node<T, D>& n) {
        auto& X = *n.inputs[0];
        const bool gw = wi && n.inputs[static_cast<std::size_t>(wi)]->requires_grad;
        const bool gb = bi && n.inputs[static_cast<std::size_t>(bi)]->requires_grad;
        Tensor<T, D> dx, dw, db;
        if (X.requires_grad) dx = Tensor<T, D>(X.value.shape());
        if (gw) dw = Tensor<T, D>(Shape{c});
        if (gb) db = Tensor<T, D>(Shape{c});
        Kernels<D>::layer_norm_backward(
            n.exec, kernels::LayerNormBackwardArgs<T, D>{
                        .x = X.value.cview().reshape(Shape{m, c}),
                        .weight = wi ? n.inputs[static_cast<std::size_t>(wi)]->value.cview()
                                     : TensorView<const T, D>(),
                        .mean = mean->cview(),
                        .rstd = rstd->cview(),
                        .dy = n.grad.cview().reshape(Shape{m, c}),
                        .dx = X.requires_grad ? dx.view().reshape(Shape{m, c}) : TensorView<T, D>(),
                        .dweight = dw.view(),
                        .dbias = db.view()});
        if (X.requires_grad) X.accumulate(std::move(dx));
        if (gw) n.inputs[static_cast<std::size_t>(wi)]->accumulate(std::move(dw));
        if (gb) n.inputs[static_cast<std::size_t>(bi)]->accumulate(std::move(db));
      });
}

// Inverted dropout (torch.nn.functional.dropout in training mode) with nn::Dropout's counter-based
// mask: the mask is a function of (seed, rank, stream, step) and the element index, so one step's
// mask is reproducible.
struct DropoutOptions {
  double p = 0.5;
  std::uint64_t seed = 0;
  std::uint32_t rank = 0;
  // one per dropout of a model: two sharing (seed, rank, stream) draw the same mask
  std::uint32_t stream = 0;
  std::uint64_t step = 0;  // below 2^32
  bool training = true;    // false: the identity (a copy)
};
template <class T, Device D>
Var<T, D> dropout(const Var<T, D>& x, const DropoutOptions& o) {
  if (!o.training || o.p == 0.0) return x * T(1);
  auto mask = std::make_shared<Tensor<std::uint8_t, D>>(x.shape());
  Tensor<T, D> y(x.shape());
  Kernels<D>::dropout_forward(x.exec(), kernels::DropoutForwardArgs<T, D>{.x = x.value().cview(),
                                                                          .y = y.view(),
                                                                          .mask = mask->view(),
                                                                          .p = o.p,
                                                                          .seed = o.seed,
                                                                          .rank = o.rank,
                                                                          .stream = o.stream,
                                                                          .step = o.step});
  const double p = o.p;
  return detail::record<T, D>("dropout", std::move(y), {x.node_ptr()}, [mask, p](Node<T, D>& n) {
    Tensor<T, D> dx(n.value.shape());
    Kernels<D>::dropout_backward(
        n.exec, kernels::DropoutBackwardArgs<T, D>{
                    .dy = n.grad.cview(), .mask = mask->cview(), .dx = dx.view(), .p = p});
    n.inputs[0]->accumulate(std::move(dx));
  });
}

}  // namespace ddp::autograd
