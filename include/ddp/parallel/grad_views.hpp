// gradient_as_bucket_view: every parameter's grad() is a view of its slot in its bucket's flat
// buffer, so DDP reduces the gradients where backward wrote them, with no copy into the bucket and
// none back (torch's DistributedDataParallel(gradient_as_bucket_view=True); docs/decisions/0033).
// Both transports use it.
// SPDX-License-Identifier: MIT
//
// Example: bucket {fc.bias (10), fc.weight (10 x 64)} with flat buffer F of 650 floats:
//   fc.bias.grad() is
// F[0, 10), fc.weight.grad() is F[10, 650); a rebuild moves each gradient into its new slot. The
// transport keeps the flat buffers alive while the views exist and gives every parameter its own
// memory back (own_grads) before it frees them.
#pragma once

#include <cstddef>
#include <vector>

#include "ddp/nn/parameter.hpp"
#include "ddp/parallel/bucket.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::parallel {

// Points every parameter of `layouts` at its slot: flats[b] holds bucket b (layouts[b].numel
// elements, D's memory). The current gradients are copied into the slots on exec, so accumulated
// values survive a rebuild.
template <class T, Device D>
void view_grads_in_buckets(const std::vector<nn::Parameter<T, D>*>& params,
                           const std::vector<BucketLayout>& layouts, const std::vector<T*>& flats,
                           const Exec<D>& exec) {
  for (std::size_t b = 0; b < layouts.size(); ++b) {
    const BucketLayout& l = layouts[b];
    for (std::size_t k = 0; k < l.params.size(); ++k)
      params[l.params[k]]->set_grad_view(flats[b] + l.offsets[k], exec);
  }
}

// Every parameter's grad() owns its memory again (a copy of the current values, on exec).
template <class T, Device D>
void own_grads(const std::vector<nn::Parameter<T, D>*>& params, const Exec<D>& exec) {
  for (auto* p : params) p->own_grad(exec);
}

}  // namespace ddp::parallel
