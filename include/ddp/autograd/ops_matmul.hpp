// matmul (batched, broadcasting) and linear as autograd ops.
// SPDX-License-Identifier: MIT
#pragma once

#include "ddp/autograd/ops_core.hpp"

namespace ddp::autograd {

// ---- matmul and linear ----
// a (..., m, k) @ b (..., k, n) -> (..., m, n); both of rank >= 2, batch dims broadcast
// (torch.matmul).
template <class T, Device D>
Var<T, D> matmul(const Var<T, D>& a, const Var<T, D>& b) {
  const Shape &sa = a.shape(), &sb = b.shape();
  if (sa.rank() < 2 || sb.rank() < 2)
    throw ValueError(ddp::detail::str("ddp: autograd: matmul: both operands need rank >= 2, got ",
                                      sa, " and ", sb, "; reshape a vector to (1, k) or (k, 1)"));
  const std::int64_t m = sa[-2], k = sa[-1], n = sb[-1];
  if (sb[-2] != k)
    throw ValueError(ddp::detail::str("ddp: autograd: matmul: shapes ", sa, " and ", sb,
                                      " do not chain: a has ", k, " columns but b has ", sb[-2],
                                      " rows"));
  std::vector<std::int64_t> ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  const Shape batch = detail::broadcast_shapes(Shape(ba), Shape(bb), "matmul");
  std::vector<std::int64_t> od = detail::dims_of(batch);
  od.push_back(m);
  od.push_back(n);
  const Shape out_shape = Shape(od);
  // Offsets of each batch's matrix in a, b (in elements), and the number of batches.
  struct Batches {
    kernels::StridedIndex ia, ib;
    std::int64_t count;
  };
  auto batches = [batch](const Shape& sa, const Shape& sb) {
    std::vector<std::int64_t> ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
    Batches r{detail::broadcast_index(Shape(ba), batch), detail::broadcast_index(Shape(bb), batch),
              batch.numel()};
    for (int i = 0; i < r.ia.rank; ++i) r.ia.strides[i] *= sa[-2] * sa[-1];
    for (int i = 0; i < r.ib.rank; ++i) r.ib.strides[i] *= sb[-2] * sb[-1];
    return r;
  };
  const Batches bt = batches(sa, sb);
  Tensor<T, D> y(out_shape);
  for (std::int64_t i = 0; i < bt.count; ++i)
    detail::gemm(a.exec(), false, false, m, n, k, a.value().data() + bt.ia(i), k,
                 b.value().data() + bt.ib(i), n, y.data() + i * m * n, n);
  return detail::record<T, D>(
      "matmul", std::move(y), {a.node_ptr(), b.node_ptr()},
      [bt, m, n, k, out_shape](Node<T, D>& nd) {
        const auto& A = *nd.inputs[0];
        const auto& B = *nd.inputs[1];
        std::vector<std::int64_t> batch_dims(out_shape.begin(), out_shape.end() - 2);
        // da (batch, m, k) = dy (m, n) b^T (n, k), summed over a's broadcast batch dims
        if (A.requires_grad) {
          std::vector<std::int64_t> fd = batch_dims;
          fd.push_back(m);
          fd.push_back(k);
          Tensor<T, D> full{Shape(fd)};
          for (std::int64_t i = 0; i < bt.count; ++i)
            detail::gemm(nd.exec, false, true, m, k, n, nd.grad.data() + i * m * n, n,
                         B.value.data() + bt.ib(i), n, full.data() + i * m * k, k);
          if (A.value.shape() == full.shape())  // no broadcast batch dim: full is da
            nd.inputs[0]->accumulate(std::move(full));
          else
            nd.inputs[0]->accumulate(detail::reduce_to(nd.exec, full.cview(), A.value.shape()));
        }
        if (B.requires_grad) {  // db (batch, k, n) = a^T (k, m) dy (m, n)
          std::vector<std::int64_t> fd = batch_dims;
          fd.push_back(k);
          fd.push_back(n);
          Tensor<T, D> full{Shape(fd)};
          for (std::int64_t i = 0; i < bt.count; ++i)
            detail::gemm(nd.exec, true, false, k, n, m, A.value.data() + bt.ia(i), k,
                         nd.grad.data() + i * m * n, n, full.data() + i * k * n, n);
          if (B.value.shape() == full.shape())
            nd.inputs[1]->accumulate(std::move(full));
          else
            nd.inputs[1]->accumulate(detail::reduce_to(nd.exec, full.cview(), B.value.shape()));
        }
      });
}

// y = x W^T + b (torch.nn.functional.linear): x (..., in), w (out, in), bias (out) or an empty Var
// for none. Runs Kernels<D>::linear_forward / linear_backward on x viewed as (N, in).
template <class T, Device D>
Var<T, D> linear(const Var<T, D>& x, const Var<T, D>& w, const Var<T, D>& bias = {}) {
  const Shape &sx = x.shape(), &sw = w.shape();
  if (sx.rank() < 1 || sw.rank() != 2 || sx[-1] != sw[1])
    throw ValueError(ddp::detail::str("ddp: autograd: linear: x ", sx,
                                      " must be (..., in) and the weight ", sw,
                                      " (out, in) with the same in"));
  if (bias.defined() && !(bias.shape() == Shape{sw[0]}))
    throw ValueError(ddp::detail::str("ddp: autograd: linear: bias has shape ", bias.shape(),
                                      " but the weight ", sw, " needs (", sw[0], ")"));
  const std::int64_t in = sw[1], out = sw[0], rows = sx.numel() / std::max<std::int64_t>(in, 1);
  std::vector<std::int64_t> od = detail::dims_of(sx);
  od.back() = out;
  Tensor<T, D> y{Shape(od)};
  Kernels<D>::linear_forward(
      x.exec(), kernels::LinearForwardArgs<T, D>{
                    .x = x.value().cview().reshape(Shape{rows, in}),
                    .w = w.value().cview(),
                    .bias = bias.defined() ? bias.value().cview() : TensorView<const T, D>(),
                    .y = y.view().reshape(Shape{rows, out})});
  std::vector<std::shared_ptr<Node<T, D>>> inputs{x.node_ptr(), w.node_ptr()};
  if (bias.defined()) inputs.push_back(bias.node_ptr());
  return detail::record<T, D>(
      "linear", std::move(y), std::move(inputs), [rows, in, out](Node<T, D>& n) {
        auto& X = *n.inputs[0];
        auto& W = *n.inputs[1];
        const bool has_b = n.inputs.size() == 3;
        Tensor<T, D> dx, dw, db;
        if (X.requires_grad) dx = Tensor<T, D>(X.value.shape());
        if (W.requires_grad) dw = Tensor<T, D>(W.value.shape());
        if (has_b && n.inputs[2]->requires_grad) db = Tensor<T, D>(Shape{out});
        Kernels<D>::linear_backward(
            n.exec,
            kernels::LinearBackwardArgs<T, D>{
                .x = X.value.cview().reshape(Shape{rows, in}),
                .w = W.value.cview(),
                .dy = n.grad.cview().reshape(Shape{rows, out}),
                .dx = X.requires_grad ? dx.view().reshape(Shape{rows, in}) : TensorView<T, D>(),
                .dw = dw.view(),
                .dbias = db.view()});
        if (X.requires_grad) n.inputs[0]->accumulate(std::move(dx));
        if (W.requires_grad) n.inputs[1]->accumulate(std::move(dw));
        if (has_b && n.inputs[2]->requires_grad) n.inputs[2]->accumulate(std::move(db));
      });
}

}  // namespace ddp::autograd
