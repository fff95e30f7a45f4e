// Shape ops on Var: reshape, permute, transpose, narrow, cat, split, expand, index_select, ...
// SPDX-License-Identifier: MIT
#pragma once

#include "ddp/autograd/ops_core.hpp"

namespace ddp::autograd {

// ---- shape ops (each copies: a Tensor owns its memory) ----
// The same elements with another shape of equal numel (torch.reshape / view).
template <class T, Device D>
Var<T, D> reshape(const Var<T, D>& x, Shape s) {
  Tensor<T, D> y = detail::clone(x.exec(), x.value().cview());
  y.reshape(s);  // throws naming both shapes
  return detail::record<T, D>("reshape", std::move(y), {x.node_ptr()}, [](Node<T, D>& n) {
    Tensor<T, D> dx = std::move(n.grad);
    n.has_grad = false;
    dx.reshape(n.inputs[0]->value.shape());
    n.inputs[0]->accumulate(std::move(dx));
  });
}

// Dimensions reordered: y's dim i is x's dim perm[i] (torch.permute).
template <class T, Device D>
Var<T, D> permute(const Var<T, D>& x, std::vector<int> perm) {
  const Shape& s = x.shape();
  if (static_cast<int>(perm.size()) != s.rank())
    throw ValueError(
        ddp::detail::str("ddp: autograd: permute: ", perm.size(), " dims given for shape ", s));
  std::vector<bool> seen(perm.size(), false);
  std::vector<std::int64_t> od;
  kernels::StridedIndex ix;  // y index -> x offset
  ix.rank = s.rank();
  for (std::size_t i = 0; i < perm.size(); ++i) {
    const int p = detail::norm_dim(perm[i], "permute", s);
    if (seen[static_cast<std::size_t>(p)])
      throw ValueError(ddp::detail::str("ddp: autograd: permute: dim ", perm[i],
                                        " repeats in the order given for shape ", s));
    seen[static_cast<std::size_t>(p)] = true;
    od.push_back(s[p]);
    ix.dims[i] = s[p];
    ix.strides[i] = s.stride(p);
  }
  Tensor<T, D> y{Shape(od)};
  Kernels<D>::for_each_index(x.exec(), static_cast<std::size_t>(y.numel()),
                             kernels::Gather<T>{.x = x.value().data(), .y = y.data(), .ix = ix});
  return detail::record<T, D>("permute", std::move(y), {x.node_ptr()}, [ix](Node<T, D>& n) {
    Tensor<T, D> dx(n.inputs[0]->value.shape());
    Kernels<D>::for_each_index(n.exec, static_cast<std::size_t>(dx.numel()),
                               kernels::Scatter<T>{.x = n.grad.data(), .y = dx.data(), .iy = ix});
    n.inputs[0]->accumulate(std::move(dx));
  });
}
template <class T, Device D>
Var<T, D> transpose(const Var<T, D>& x, int d0, int d1) {
  std::vector<int> perm(static_cast<std::size_t>(x.rank()));
  for (int i = 0; i < x.rank(); ++i) perm[static_cast<std::size_t>(i)] = i;
  std::swap(perm[static_cast<std::size_t>(detail::norm_dim(d0, "transpose", x.shape()))],
            perm[static_cast<std::size_t>(detail::norm_dim(d1, "transpose", x.shape()))]);
  return permute(x, perm);
}

// Elements [start, start + length) of dimension dim (torch.narrow).
template <class T, Device D>
Var<T, D> narrow(const Var<T, D>& x, int dim, std::int64_t start, std::int64_t length) {
  const Shape& s = x.shape();
  const int d = detail::norm_dim(dim, "narrow", s);
  if (start < 0 || length < 0 || start + length > s[d])
    throw ValueError(ddp::detail::str("ddp: autograd: narrow: [", start, ", ", start + length,
                                      ") is outside dim ", dim, " of shape ", s, " (extent ", s[d],
                                      ")"));
  std::vector<std::int64_t> od = detail::dims_of(s);
  od[static_cast<std::size_t>(d)] = length;
  const Shape ys = Shape(od);
  kernels::StridedIndex ix;
  ix.rank = s.rank();
  for (int i = 0; i < s.rank(); ++i) {
    ix.dims[i] = ys[i];
    ix.strides[i] = s.stride(i);
  }
  ix.base = start * s.stride(d);
  Tensor<T, D> y(ys);
  Kernels<D>::for_each_index(x.exec(), static_cast<std::size_t>(y.numel()),
                             kernels::Gather<T>{.x = x.value().data(), .y = y.data(), .ix = ix});
  return detail::record<T, D>("narrow", std::move(y), {x.node_ptr()}, [ix](Node<T, D>& n) {
    Tensor<T, D> dx = detail::zeros<T, D>(n.exec, n.inputs[0]->value.shape());
    Kernels<D>::for_each_index(n.exec, static_cast<std::size_t>(n.grad.numel()),
                               kernels::Scatter<T>{.x = n.grad.data(), .y = dx.data(), .iy = ix});
    n.inputs[0]->accumulate(std::move(dx));
  });
}

// Joins values along dim (torch.cat); all other dims must match.
template <class T, Device D>
Var<T, D> concat(const std::vector<Var<T, D>>& xs, int dim) {
  if (xs.empty()) throw ValueError("ddp: autograd: concat: no values given");
  const Shape& s0 = xs[0].shape();
  const int d = detail::norm_dim(dim, "concat", s0);
  std::vector<std::int64_t> od = detail::dims_of(s0);
  od[static_cast<std::size_t>(d)] = 0;
  for (const auto& x : xs) {
    const Shape& s = x.shape();
    bool ok = s.rank() == s0.rank();
    for (int i = 0; ok && i < s.rank(); ++i) ok = i == d || s[i] == s0[i];
    if (!ok)
      throw ValueError(ddp::detail::str("ddp: autograd: concat: shapes ", s0, " and ", s,
                                        " differ outside the concatenated dim ", dim));
    od[static_cast<std::size_t>(d)] += s[d];
  }
  const Shape ys = Shape(od);
  Tensor<T, D> y(ys);
  std::vector<kernels::StridedIndex> parts;  // part p's index -> y offset
  std::int64_t at = 0;
  std::vector<std::shared_ptr<Node<T, D>>> inputs;
  for (const auto& x : xs) {
    kernels::StridedIndex iy;
    iy.rank = ys.rank();
    for (int i = 0; i < ys.rank(); ++i) {
      iy.dims[i] = x.shape()[i];
      iy.strides[i] = ys.stride(i);
    }
    iy.base = at * ys.stride(d);
    at += x.shape()[d];
    Kernels<D>::for_each_index(x.exec(), static_cast<std::size_t>(x.numel()),
                               kernels::Scatter<T>{.x = x.value().data(), .y = y.data(), .iy = iy});
    parts.push_back(iy);
    inputs.push_back(x.node_ptr());
  }
  return detail::record<T, D>("concat", std::move(y), std::move(inputs), [parts](Node<T, D>& n) {
    for (std::size_t p = 0; p < parts.size(); ++p) {
      if (!n.inputs[p]->requires_grad) continue;
      Tensor<T, D> dx(n.inputs[p]->value.shape());
      Kernels<D>::for_each_index(
          n.exec, static_cast<std::size_t>(dx.numel()),
          kernels::Gather<T>{.x = n.grad.data(), .y = dx.data(), .ix = parts[p]});
      n.inputs[p]->accumulate(std::move(dx));
    }
  });
}

// Pieces of `sizes[i]` along dim (torch.split with a list of sizes; they must add up to the dim's
// extent).
template <class T, Device D>
std::vector<Var<T, D>> split(const Var<T, D>& x, const std::vector<std::int64_t>& sizes, int dim) {
  const int d = detail::norm_dim(dim, "split", x.shape());
  std::int64_t total = 0;
  for (auto s : sizes) total += s;
  if (total != x.shape()[d])
    throw ValueError(ddp::detail::str("ddp: autograd: split: sizes add up to ", total, " but dim ",
                                      dim, " of shape ", x.shape(), " has ", x.shape()[d]));
  std::vector<Var<T, D>> out;
  std::int64_t at = 0;
  for (auto s : sizes) {
    out.push_back(narrow(x, d, at, s));
    at += s;
  }
  return out;
}

// Rows idx[j] of dimension dim (torch.index_select); idx is int64 on the same device, each in [0,
// extent).
template <class T, Device D>
Var<T, D> index_select(const Var<T, D>& x, int dim, const Tensor<std::int64_t, D>& idx) {
  const Shape& s = x.shape();
  const int d = detail::norm_dim(dim, "index_select", s);
  if (idx.rank() != 1)
    throw ValueError(ddp::detail::str(
        "ddp: autograd: index_select: indices must be 1-D, got shape ", idx.shape()));
  detail::Indices<D> ix = detail::keep_indices(x.exec(), idx, true);  // checked on the host
  const auto keep = ix.keep;
  const Tensor<std::int64_t, Cpu>& host = ix.host;
  for (std::int64_t j = 0; j < host.numel(); ++j)
    if (host.data()[j] < 0 || host.data()[j] >= s[d])
      throw ValueError(ddp::detail::str("ddp: autograd: index_select: index ", host.data()[j],
                                        " at position ", j, " is out of range for dim ", dim,
                                        " of shape ", s));
  std::vector<std::int64_t> od = detail::dims_of(s);
  od[static_cast<std::size_t>(d)] = idx.numel();
  Tensor<T, D> y{Shape(od)};
  const std::int64_t inner = s.stride(d), len_in = s[d], len_out = idx.numel();
  Kernels<D>::for_each_index(x.exec(), static_cast<std::size_t>(y.numel()),
                             kernels::IndexSelect<T>{.x = x.value().data(),
                                                     .idx = keep->data(),
                                                     .y = y.data(),
                                                     .inner = inner,
                                                     .len_in = len_in,
                                                     .len_out = len_out});
  return detail::record<T, D>(
      "index_select", std::move(y), {x.node_ptr()}, [keep, inner, len_in, len_out](Node<T, D>& n) {
        Tensor<T, D> dx(n.inputs[0]->value.shape());
        Kernels<D>::for_each_index(n.exec, static_cast<std::size_t>(dx.numel()),
                                   kernels::IndexSelectGrad<T>{.dy = n.grad.data(),
                                                               .idx = keep->data(),
                                                               .dx = dx.data(),
                                                               .inner = inner,
                                                               .len_in = len_in,
                                                               .len_out = len_out});
        n.inputs[0]->accumulate(std::move(dx));
      });
}

}  // namespace ddp::autograd
