// BatchNorm2d: per-channel batch normalisation of NHWC activations (torch.nn.BatchNorm2d, affine,
// tracking stats).
// SPDX-License-Identifier: MIT
//
// Training: y = gamma (x - mean_B) / sqrt(var_B + eps) + beta with the batch's biased variance, and
//   running_mean = (1 - momentum) running_mean + momentum mean_B
//   running_var  = (1 - momentum) running_var  + momentum var_B n/(n-1)  (unbiased; n = N*H*W)
//   num_batches_tracked += 1
// Evaluation: the running statistics replace the batch ones; nothing is updated. state_dict names:
// weight, bias (parameters); running_mean, running_var, num_batches_tracked (buffers).
// forward_act/backward_act: the same layer then "+ residual, ReLU", as the residual blocks and the
// stem use it: one fused pass on the GPU, the same numbers as forward + add + relu.
// Synchronised (torch.nn.SyncBatchNorm, docs/decisions/0027): set_sync(reducer), which
// convert_sync_batchnorm applies to every BatchNorm2d, makes training use every rank's batch
// together (one all-reduce in forward, one in backward); a rank's batch may then be empty. Eval and
// a single rank communicate nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "ddp/config.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/fused_args.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/nn/module.hpp"

namespace ddp::nn {

struct BatchNorm2dOptions {
  std::int64_t num_features = 0;
  double eps = 1e-5;
  double momentum = 0.1;
};

template <class T, Device D, class A = T>
class BatchNorm2d : public Module<T, D, A> {
 public:
  explicit BatchNorm2d(const BatchNorm2dOptions& o) : o_(o) {
    if (o.num_features < 1)
      throw ValueError(
          ddp::detail::str("ddp: BatchNorm2d needs num_features >= 1, got ", o.num_features));
    const Shape c{o.num_features};
    weight_ = &this->register_parameter("weight", c);
    bias_ = &this->register_parameter("bias", c);
    running_mean_ = &this->register_buffer("running_mean", c, DType::F32);
    running_var_ = &this->register_buffer("running_var", c, DType::F32);
    num_batches_tracked_ = &this->register_buffer("num_batches_tracked", Shape{}, DType::I64);
    save_mean_ = Tensor<T, D>(c);
    save_invstd_ = Tensor<T, D>(c);
    reset_parameters();
  }

  // weight 1, bias 0, running_mean 0, running_var 1, num_batches_tracked 0 (as torch).
  void reset_parameters() {
    detail::fill_value(weight_->value(), T(1));
    detail::fill_value(bias_->value(), T(0));
    detail::fill_value(running_mean_->real(), T(0));
    detail::fill_value(running_var_->real(), T(1));
    detail::fill_value(num_batches_tracked_->count(), std::int64_t{0});
  }

  const BatchNorm2dOptions& options() const noexcept { return o_; }
  Parameter<T, D>& weight() noexcept { return *weight_; }
  Parameter<T, D>& bias() noexcept { return *bias_; }
  Tensor<T, D>& running_mean() noexcept { return running_mean_->real(); }
  Tensor<T, D>& running_var() noexcept { return running_var_->real(); }
  Tensor<std::int64_t, D>& num_batches_tracked() noexcept { return num_batches_tracked_->count(); }

  // Synchronises the training statistics through `sync` (shared by the layers of a model; nullptr:
  // this rank's batch alone again). Every rank of the group must then run the same layers in the
  // same order.
  void set_sync(std::shared_ptr<kernels::ChannelSumReducer<D>> sync) { sync_ = std::move(sync); }
  bool is_sync() const noexcept { return sync_ != nullptr; }

  std::string describe() const override {
    return ddp::detail::str(sync_ ? "SyncBatchNorm(" : "BatchNorm2d(", o_.num_features,
                            ", eps=", o_.eps, ", momentum=", o_.momentum, ")");
  }

  Tensor<A, D> forward_impl(Exec<D>& exec, TensorView<const A, D> x) override {
    check_input(x);
    Tensor<A, D> y(x.shape());
    run_synced([&] { Kernels<D>::batchnorm_forward(exec, forward_args(x, y)); });
    after_forward(x);
    return y;
  }

  // y = relu(bn(x) + residual) (residual optional: empty view; relu optional). backward_act must
  // follow (not backward): it needs y, the returned tensor, kept alive by the caller.
  Tensor<A, D> forward_act(Exec<D>& exec, TensorView<const A, D> x, TensorView<const A, D> residual,
                           bool relu) {
    const trace::Span span = this->trace_span("forward");
    check_input(x);
    Tensor<A, D> y(x.shape());
    const kernels::BatchNormActForwardArgs<T, D, A> a{
        .bn = forward_args(x, y), .residual = residual, .relu = relu};
    run_synced([&] { Kernels<D>::batchnorm_act_forward(exec, a); });
    after_forward(x);
    act_relu_ = relu;
    return y;
  }

  // dy, y: forward_act's output gradient and output. Returns dx; writes dy * (y > 0) (the
  // residual's gradient) into dresidual unless empty; reports weight and bias ready.
  Tensor<A, D> backward_act(Exec<D>& exec, TensorView<const A, D> dy, TensorView<const A, D> y,
                            TensorView<A, D> dresidual) {
    const trace::Span span = this->trace_span("backward");
    this->require_forward_state(have_x_);
    have_x_ = false;
    Tensor<A, D> dx(x_.shape());
    const kernels::BatchNormActBackwardArgs<T, D, A> a{
        .bn = backward_args(dy, dx), .y = y, .dresidual = dresidual, .relu = act_relu_};
    Kernels<D>::batchnorm_act_backward(exec, a);
    weight_->grad_done(exec);
    bias_->grad_done(exec);
    return dx;
  }

  // forward_act's output (no residual) again from the kept input, bit-identical on an Exec with the
  // forward's threads (docs/decisions/0068). Changes no state: running statistics and
  // save_mean/save_invstd go to scratch. Only between forward_act and backward_act, and not after a
  // synchronised forward (it would communicate).
  Tensor<A, D> recompute_act(Exec<D>& exec) {
    this->require_forward_state(have_x_);
    if (forward_sync_)
      throw ValueError(ddp::detail::str("ddp: ", this->where(),
                                        ": recompute_act after a synchronised forward would "
                                        "all-reduce again; keep forward_act's output instead"));
    const trace::Span span = this->trace_span("recompute");
    Tensor<A, D> y(x_.shape());
    const Shape c{o_.num_features};
    // Training updates the running statistics it is given (scratch here, their values never reach
    // y); eval reads the layer's and writes none (BnChannelOutputs::finish with no rows).
    Tensor<T, D> rm(c), rv(c), sm(c), si(c);
    if (forward_training_) {
      Kernels<D>::fill(exec, rm.view(), T(0));
      Kernels<D>::fill(exec, rv.view(), T(1));
    }
    const kernels::BatchNormActForwardArgs<T, D, A> a{
        .bn = {.x = x_,
               .gamma = weight_->value().cview(),
               .beta = bias_->value().cview(),
               .running_mean = forward_training_ ? rm.view() : running_mean_->real().view(),
               .running_var = forward_training_ ? rv.view() : running_var_->real().view(),
               .y = y.view(),
               .save_mean = sm.view(),
               .save_invstd = si.view(),
               .training = forward_training_,
               .momentum = o_.momentum,
               .eps = o_.eps},
        .residual = {},
        .relu = act_relu_};
    Kernels<D>::batchnorm_act_forward(exec, a);
    return y;
  }
  // Whether the last forward synchronised its statistics (recompute_act cannot follow it).
  bool forward_synchronised() const noexcept { return forward_sync_; }

  Tensor<A, D> backward_impl(Exec<D>& exec, TensorView<const A, D> dy) override {
    this->require_forward_state(have_x_);
    have_x_ = false;
    Tensor<A, D> dx(x_.shape());
    Kernels<D>::batchnorm_backward(exec, backward_args(dy, dx));
    weight_->grad_done(exec);
    bias_->grad_done(exec);
    return dx;
  }

 private:
  void check_input(TensorView<const A, D> x) const {
    if (x.rank() < 2)
      throw ValueError(ddp::detail::str(
          "ddp: ", this->where(), ": input must be NHWC (N, H, W, C), got shape ", x.shape()));
    // synchronised: the other ranks' batches count (torch >= 1.12)
    if (x.dim(0) == 0 && !syncing())
      throw ValueError(ddp::detail::str("ddp: ", this->where(),
                                        ": batch of zero images (input shape ", x.shape(),
                                        "); check --batch-size and the loader"));
    if (x.dim(-1) != o_.num_features)
      throw ValueError(ddp::detail::str("ddp: ", this->where(), ": input has ", x.dim(-1),
                                        " channels but the layer expects ", o_.num_features,
                                        " (input shape ", x.shape(), ", NHWC)"));
  }
  // Whether this forward synchronises: training, a reducer, more than one rank (torch's need_sync).
  bool syncing() const noexcept { return this->is_training() && sync_ && sync_->ranks() > 1; }
  // A synchronised call's argument errors (total batch too small) get this layer's name.
  template <class F>
  void run_synced(F&& f) {
    if (!syncing()) return f();
    try {
      f();
    } catch (const ValueError& e) {
      std::string_view what = e.what();
      if (what.starts_with("ddp: ")) what.remove_prefix(5);
      throw ValueError(ddp::detail::str("ddp: ", this->where(), ": ", what));
    }
  }
  kernels::BatchNormForwardArgs<T, D, A> forward_args(TensorView<const A, D> x, Tensor<A, D>& y) {
    return {.x = x,
            .gamma = weight_->value().cview(),
            .beta = bias_->value().cview(),
            .running_mean = running_mean_->real().view(),
            .running_var = running_var_->real().view(),
            .y = y.view(),
            .save_mean = save_mean_.view(),
            .save_invstd = save_invstd_.view(),
            .training = this->is_training(),
            .momentum = o_.momentum,
            .eps = o_.eps,
            .sync = syncing() ? sync_.get() : nullptr,
            // the kernel counts a training batch
            .num_batches_tracked = num_batches_tracked_->count().view()};
  }
  void after_forward(TensorView<const A, D> x) {
    const bool training = this->is_training();
    x_ = x;
    have_x_ = true;
    forward_training_ = training;
    forward_sync_ = syncing();
  }
  kernels::BatchNormBackwardArgs<T, D, A> backward_args(TensorView<const A, D> dy,
                                                        Tensor<A, D>& dx) {
    return {.x = x_,
            .dy = dy,
            .gamma = weight_->value().cview(),
            .save_mean = save_mean_.cview(),
            .save_invstd = save_invstd_.cview(),
            .dx = dx.view(),
            .dgamma = weight_->grad_dest(),
            .dbeta = bias_->grad_dest(),
            .training = forward_training_,
            .sync = forward_sync_ ? sync_.get() : nullptr};
  }

  BatchNorm2dOptions o_;
  Parameter<T, D>* weight_ = nullptr;            // gamma (C)
  Parameter<T, D>* bias_ = nullptr;              // beta (C)
  Buffer<T, D>* running_mean_ = nullptr;         // (C)
  Buffer<T, D>* running_var_ = nullptr;          // (C)
  Buffer<T, D>* num_batches_tracked_ = nullptr;  // () int64
  Tensor<T, D> save_mean_;                       // (C) statistics of the last forward
  Tensor<T, D> save_invstd_;                     // (C)
  TensorView<const A, D> x_;                     // forward input, owned by the caller
  bool have_x_ = false;
  bool forward_training_ = true;
  bool act_relu_ = true;       // the relu flag of the last forward_act
  bool forward_sync_ = false;  // whether the last forward synchronised (its backward must too)
  std::shared_ptr<kernels::ChannelSumReducer<D>> sync_;
};

}  // namespace ddp::nn
