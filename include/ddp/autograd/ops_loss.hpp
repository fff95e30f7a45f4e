// softmax, log_softmax and the losses (cross_entropy, mse_loss) as autograd ops.
// SPDX-License-Identifier: MIT
#pragma once

#include "ddp/autograd/ops_core.hpp"

namespace ddp::autograd {

// ---- softmax family and losses ----
namespace detail {
template <class T, Device D>
Var<T, D> softmax_impl(const Var<T, D>& x, int dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  const Shape& s = x.shape();
  const int d = norm_dim(dim, op, s);
  const auto line = lines_along(s, d);
  const std::int64_t lines = s.numel() / std::max<std::int64_t>(s[d], 1);
  Tensor<T, D> y(s);
  Kernels<D>::for_each_index(x.exec(), static_cast<std::size_t>(lines),
                             kernels::SoftmaxAlong<T>{.x = x.value().data(),
                                                      .y = y.data(),
                                                      .line = line,
                                                      .len = s[d],
                                                      .step = s.stride(d),
                                                      .log_form = log});
  return record<T, D>(op, std::move(y), {x.node_ptr()}, [line, lines, d, log](Node<T, D>& n) {
    const Shape& xs = n.value.shape();
    Tensor<T, D> dx(xs);
    Kernels<D>::for_each_index(n.exec, static_cast<std::size_t>(lines),
                               kernels::SoftmaxAlongGrad<T>{.y = n.value.data(),
                                                            .dy = n.grad.data(),
                                                            .dx = dx.data(),
                                                            .line = line,
                                                            .len = xs[d],
                                                            .step = xs.stride(d),
                                                            .log_form = log});
    n.inputs[0]->accumulate(std::move(dx));
  });
}
}  // namespace detail

template <class T, Device D>
Var<T, D> softmax(const Var<T, D>& x, int dim = -1) {
  return detail::softmax_impl(x, dim, false);
}
template <class T, Device D>
Var<T, D> log_softmax(const Var<T, D>& x, int dim = -1) {
  return detail::softmax_impl(x, dim, true);
}

// torch.nn.functional.cross_entropy(logits (N, C), targets (N) int64, reduction="mean",
// label_smoothing): Kernels<D>::cross_entropy, whose gradient it asks for again in backward (no (N,
// C) buffer kept alive).
template <class T, Device D>
Var<T, D> cross_entropy(const Var<T, D>& logits, const Tensor<std::int64_t, D>& targets,
                        double label_smoothing = 0.0) {
  auto labels = detail::keep_indices(logits.exec(), targets, false).keep;
  const double loss = Kernels<D>::cross_entropy(
      logits.exec(), kernels::CrossEntropyArgs<T, D>{.logits = logits.value().cview(),
                                                     .labels = labels->cview(),
                                                     .label_smoothing = label_smoothing});
  Tensor<T, D> y(Shape{});
  Kernels<D>::fill(logits.exec(), y.view(), static_cast<T>(loss));
  return detail::record<T, D>(
      "cross_entropy", std::move(y), {logits.node_ptr()}, [labels, label_smoothing](Node<T, D>& n) {
        auto& L = *n.inputs[0];
        Tensor<T, D> dz(L.value.shape());
        Kernels<D>::cross_entropy(
            n.exec, kernels::CrossEntropyArgs<T, D>{.logits = L.value.cview(),
                                                    .labels = labels->cview(),
                                                    .dlogits = dz.view(),
                                                    .label_smoothing = label_smoothing});
        // d(loss)/d(logits) times the incoming scalar gradient.
        Tensor<T, D> g = detail::broadcast_binary(n.exec, dz.cview(), n.grad.cview(), dz.shape(),
                                                  kernels::MulOp<T>{});
        L.accumulate(std::move(g));
      });
}

// torch.nn.functional.mse_loss(x, target) with mean reduction (Kernels<D>::mse); both get
// gradients.
template <class T, Device D>
Var<T, D> mse_loss(const Var<T, D>& x, const Var<T, D>& target) {
  if (!(x.shape() == target.shape()))
    throw ValueError(ddp::detail::str("ddp: autograd: mse_loss: input ", x.shape(), " and target ",
                                      target.shape(), " must have the same shape"));
  const double loss = Kernels<D>::mse(
      x.exec(), kernels::MseArgs<T, D>{.x = x.value().cview(), .target = target.value().cview()});
  Tensor<T, D> y(Shape{});
  Kernels<D>::fill(x.exec(), y.view(), static_cast<T>(loss));
  return detail::record<T, D>(
      "mse_loss", std::move(y), {x.node_ptr(), target.node_ptr()}, [](Node<T, D>& n) {
        auto& X = *n.inputs[0];
        auto& Y = *n.inputs[1];
        Tensor<T, D> dx(X.value.shape());
        Kernels<D>::mse(n.exec,
                        kernels::MseArgs<T, D>{
                            .x = X.value.cview(), .target = Y.value.cview(), .dx = dx.view()});
        Tensor<T, D> g = detail::broadcast_binary(n.exec, dx.cview(), n.grad.cview(), dx.shape(),
                                                  kernels::MulOp<T>{});
        if (Y.requires_grad) {  // d/d(target) = -d/d(x)
          Tensor<T, D> gy = detail::clone(n.exec, g.cview());
          Kernels<D>::scale(n.exec, T(-1), gy.view());
          Y.accumulate(std::move(gy));
        }
        if (X.requires_grad) X.accumulate(std::move(g));
      });
}

}  // namespace ddp::autograd
