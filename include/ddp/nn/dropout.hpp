// Dropout (torch.nn.Dropout): inverted dropout with a counter-based mask; any shape.
// SPDX-License-Identifier: MIT
//
// Training: y = x / (1 - p) where kept, 0 where dropped, each element dropped with probability p;
// backward dx = dy / (1 - p) where kept, 0 elsewhere (the forward's mask, kept as one byte per
// element). Evaluation (eval()) or p = 0: y = x, no mask is drawn or kept, and backward returns dx
// = dy (the one copy a returned Tensor needs). The mask is a pure function of (seed, rank, stream,
// step) and the element index (docs/decisions/0043): element i of the step-th training forward uses
// word i % 4 of block (step << 32) + i / 4 of Philox stream Generator(seed, rank, stream)
// (tensor/random.hpp), dropped when (w + 0.5) / 2^32 < p. So
//   - ranks draw different masks (rank is part of the counter), and one rank's mask does not depend
//     on the thread count or the device;
//   - a resumed run repeats the masks of an uninterrupted one: step() counts this module's training
//     forwards (eval forwards do not count); restore it with set_step() (with one forward per
//     iteration, the iteration the snapshot resumes at);
//   - dropouts of one model must not share (seed, rank, stream), or they draw the same masks at the
//     same step: give each its own `stream` (ids above 255 are the user's, tensor/random.hpp).
// Runs on any device through Kernels<D>::dropout_forward / dropout_backward, element-wise functors
// of kernels/elementwise.hpp (the CUDA instantiation compiles with them but has not run yet).
#pragma once

#include <cstdint>
#include <string>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/tensor/copy.hpp"
#include "ddp/tensor/random.hpp"

namespace ddp::nn {

struct DropoutOptions {
  double p = 0.5;                         // probability of dropping an element, in [0, 1]
  std::uint64_t seed = 0;                 // the run's seed (Philox key)
  std::uint32_t rank = 0;                 // this process's global rank
  std::uint32_t stream = kStreamDropout;  // one per Dropout of a model
};

template <class T, Device D>
class Dropout : public Module<T, D> {
 public:
  explicit Dropout(const DropoutOptions& o = {}) : o_(o) {
    this->backward_reads_no_input();  // it keeps the mask
    if (!(o.p >= 0.0 && o.p <= 1.0))
      throw ValueError(ddp::detail::str("ddp: Dropout's p must be in [0, 1], got ", o.p));
  }

  const DropoutOptions& options() const noexcept { return o_; }
  // Training forwards done so far: the next one draws the mask of this step.
  std::uint64_t step() const noexcept { return step_; }
  void set_step(std::uint64_t step) noexcept { step_ = step; }

  std::string describe() const override { return ddp::detail::str("Dropout(p=", o_.p, ")"); }

 protected:
  Tensor<T, D> forward_impl(Exec<D>& exec, TensorView<const T, D> x) override {
    Tensor<T, D> y(x.shape());
    masked_ = this->is_training() && o_.p > 0.0;
    if (masked_) {
      if (!(mask_.shape() == x.shape())) mask_ = Tensor<std::uint8_t, D>(x.shape());
      Kernels<D>::dropout_forward(exec, kernels::DropoutForwardArgs<T, D>{.x = x,
                                                                          .y = y.view(),
                                                                          .mask = mask_.view(),
                                                                          .p = o_.p,
                                                                          .seed = o_.seed,
                                                                          .rank = o_.rank,
                                                                          .stream = o_.stream,
                                                                          .step = step_});
    } else {
      copy(x, y.view(), exec);
    }
    if (this->is_training()) ++step_;
    shape_ = x.shape();
    have_forward_ = true;
    return y;
  }

  Tensor<T, D> backward_impl(Exec<D>& exec, TensorView<const T, D> dy) override {
    this->require_forward_state(have_forward_);
    have_forward_ = false;
    expect_shape(dy, shape_, "output gradient dy", "Dropout.backward");
    Tensor<T, D> dx(dy.shape());
    if (masked_)
      Kernels<D>::dropout_backward(
          exec, kernels::DropoutBackwardArgs<T, D>{
                    .dy = dy, .mask = mask_.cview(), .dx = dx.view(), .p = o_.p});
    else
      copy(dy, dx.view(), exec);
    return dx;
  }

 private:
  DropoutOptions o_;
  std::uint64_t step_ = 0;
  Tensor<std::uint8_t, D> mask_;  // the last training forward's mask (1 kept, 0 dropped), x's shape
  Shape shape_;                   // the last forward's input shape
  bool masked_ = false;           // the last forward drew a mask (training and p > 0)
  bool have_forward_ = false;
};

}  // namespace ddp::nn
