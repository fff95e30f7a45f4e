// Reductions as autograd ops: sum, mean (over all or some dims) and max along a dim.
// SPDX-License-Identifier: MIT
#pragma once

#include "ddp/autograd/ops_core.hpp"

namespace ddp::autograd {

// ---- reductions ----
namespace detail {
// sum (scale 1) or mean (scale 1 / count) over `dims` (all when empty), keeping them as size 1 or
// not.
template <class T, Device D>
Var<T, D> reduce(const Var<T, D>& x, std::vector<int> dims, bool keepdim, bool mean,
                 const char* op) {
  const Shape& s = x.shape();
  std::vector<bool> red(static_cast<std::size_t>(s.rank()), dims.empty());
  for (int d : dims) red[static_cast<std::size_t>(norm_dim(d, op, s))] = true;
  std::vector<std::int64_t> kept, squeezed;
  std::int64_t count = 1;
  for (int i = 0; i < s.rank(); ++i) {
    if (red[static_cast<std::size_t>(i)]) count *= s[i];
    kept.push_back(red[static_cast<std::size_t>(i)] ? 1 : s[i]);
    if (!red[static_cast<std::size_t>(i)]) squeezed.push_back(s[i]);
  }
  const Shape keep_shape = Shape(kept), out_shape = keepdim ? keep_shape : Shape(squeezed);
  const double scale = mean ? 1.0 / static_cast<double>(count) : 1.0;
  Tensor<T, D> y = reduce_to(x.exec(), x.value().cview(), keep_shape, scale);
  y.reshape(out_shape);
  return record<T, D>(op, std::move(y), {x.node_ptr()}, [keep_shape, scale](Node<T, D>& n) {
    Tensor<T, D> dx =
        expand(n.exec, n.grad.cview().reshape(keep_shape), n.inputs[0]->value.shape());
    if (scale != 1.0) Kernels<D>::scale(n.exec, static_cast<T>(scale), dx.view());
    n.inputs[0]->accumulate(std::move(dx));
  });
}
}  // namespace detail

// Sum of all elements (rank-0 result), or over `dims`.
template <class T, Device D>
Var<T, D> sum(const Var<T, D>& x) {
  return detail::reduce(x, {}, false, false, "sum");
}
template <class T, Device D>
Var<T, D> sum(const Var<T, D>& x, std::vector<int> dims, bool keepdim = false) {
  if (dims.empty())
    throw ValueError("ddp: autograd: sum: empty dim list; call sum(x) to sum every element");
  return detail::reduce(x, std::move(dims), keepdim, false, "sum");
}
template <class T, Device D>
Var<T, D> mean(const Var<T, D>& x) {
  return detail::reduce(x, {}, false, true, "mean");
}
template <class T, Device D>
Var<T, D> mean(const Var<T, D>& x, std::vector<int> dims, bool keepdim = false) {
  if (dims.empty())
    throw ValueError("ddp: autograd: mean: empty dim list; call mean(x) to average every element");
  return detail::reduce(x, std::move(dims), keepdim, true, "mean");
}

// Maximum along `dim` (torch.max(x, dim).values); the gradient goes to the first maximal element of
// each line.
template <class T, Device D>
Var<T, D> max(const Var<T, D>& x, int dim, bool keepdim = false) {
  const Shape& s = x.shape();
  const int d = detail::norm_dim(dim, "max", s);
  if (s[d] == 0)
    throw ValueError(
        ddp::detail::str("ddp: autograd: max: dim ", dim, " of shape ", s, " is empty"));
  std::vector<std::int64_t> kept = detail::dims_of(s), squeezed;
  kept[static_cast<std::size_t>(d)] = 1;
  for (int i = 0; i < s.rank(); ++i)
    if (i != d) squeezed.push_back(s[i]);
  Tensor<T, D> y(keepdim ? Shape(kept) : Shape(squeezed));
  auto arg = std::make_shared<Tensor<std::int64_t, D>>(y.shape());
  const auto line = detail::lines_along(s, d);
  Kernels<D>::for_each_index(x.exec(), static_cast<std::size_t>(y.numel()),
                             kernels::MaxAlong<T>{.x = x.value().data(),
                                                  .y = y.data(),
                                                  .arg = arg->data(),
                                                  .line = line,
                                                  .len = s[d],
                                                  .step = s.stride(d)});
  return detail::record<T, D>("max", std::move(y), {x.node_ptr()}, [arg, line, d](Node<T, D>& n) {
    const Shape& xs = n.inputs[0]->value.shape();
    Tensor<T, D> dx = detail::zeros<T, D>(n.exec, xs);
    Kernels<D>::for_each_index(n.exec, static_cast<std::size_t>(n.grad.numel()),
                               kernels::MaxAlongGrad<T>{.dy = n.grad.data(),
                                                        .arg = arg->data(),
                                                        .dx = dx.data(),
                                                        .line = line,
                                                        .step = xs.stride(d)});
    n.inputs[0]->accumulate(std::move(dx));
  });
}

}  // namespace ddp::autograd
