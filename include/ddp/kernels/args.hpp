// Argument structs of every kernel (shared by the CPU and CUDA implementations) and their shape
// checks.
// SPDX-License-Identifier: MIT
//
// Kernels take one Args struct of views, filled with designated initializers:
//   Kernels<D>::conv2d_forward(exec, Conv2dForwardArgs<float, D>{
//       .x = x.view(), .w = w_.view(), .y = y.view(), .stride = {2, 2}, .padding = {3, 3}});
// Layouts (docs/decisions/0005): activations NHWC (N, H, W, C), conv weights KRSC (C_out, kH, kW,
// C_in), linear weights (out, in) as in PyTorch. An empty view means "not wanted" where a comment
// says optional. T: the parameters' element type (weights, their gradients, BatchNorm's
// statistics); A: the activations' and their gradients' (A = T by default; bfloat16 stores them in
// 16 bits, docs/decisions/0070). Arithmetic is in float (double where a kernel says so) whatever A.
// validate(args) throws ValueError naming the op, the tensor, its shape and the expected one;
// every kernel calls it first, so CPU and CUDA reject the same inputs with the same words. The
// transformer modules' Args live beside this file: layer_norm_args.hpp, embedding_args.hpp,
// dropout_args.hpp, attention_args.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/shape.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::kernels {

// A (height, width) pair of sizes: strides, paddings, dilations, kernel sizes.
struct Size2 {
  std::int64_t h = 1, w = 1;
  friend bool operator==(const Size2&, const Size2&) = default;
};

// PyTorch's output size (floor mode): (in + 2 pad - dil (k - 1) - 1) / stride + 1.
inline std::int64_t conv_out_size(std::int64_t in, std::int64_t k, std::int64_t stride,
                                  std::int64_t pad, std::int64_t dil) {
  return (in + 2 * pad - dil * (k - 1) - 1) / stride + 1;
}

// ---- conv2d (no groups; optional bias) ----
template <class T, Device D, class A = T>
struct Conv2dForwardArgs {
  TensorView<const A, D> x;     // (N, H, W, C_in)
  TensorView<const T, D> w;     // (C_out, kH, kW, C_in)
  TensorView<const T, D> bias;  // (C_out), optional
  TensorView<A, D> y;           // (N, H_out, W_out, C_out)
  Size2 stride{1, 1};
  Size2 padding{0, 0};
  Size2 dilation{1, 1};
};

template <class T, Device D, class A = T>
struct Conv2dBackwardArgs {
  TensorView<const A, D> x;   // (N, H, W, C_in), the forward input (needed for dw)
  TensorView<const T, D> w;   // (C_out, kH, kW, C_in) (needed for dx)
  TensorView<const A, D> dy;  // (N, H_out, W_out, C_out)
  // (N, H, W, C_in), optional (first layer needs none); overwritten, or see accumulate_dx
  TensorView<A, D> dx;
  TensorView<T, D> dw;     // (C_out, kH, kW, C_in), optional; overwritten
  TensorView<T, D> dbias;  // (C_out), optional; overwritten
  Size2 stride{1, 1};
  Size2 padding{0, 0};
  Size2 dilation{1, 1};
  // dx += the input gradient (cuBLAS/cuDNN beta = 1): adds a residual block's skip gradient,
  // already in dx, without a pass of its own (docs/decisions/0061). The CPU and ddp's own CUDA
  // kernels give the bits of gradient-then-add; cuBLAS and cuDNN blend in their fp32 epilogue.
  bool accumulate_dx = false;
};

// (N, H_out, W_out, C_out); throws if the window does not fit. W: the weight's element type when
// it differs from x's (bf16 activations); not deduced, so views of non-const elements convert.
template <class T, Device D, class W = T>
Shape conv2d_output_shape(const TensorView<const T, D>& x,
                          const std::type_identity_t<TensorView<const W, D>>& w, Size2 stride,
                          Size2 padding, Size2 dilation, const char* op = "conv2d") {
  if (x.rank() != 4)
    throw ValueError(
        detail::str("ddp: ", op, ": input x must be NHWC (N, H, W, C_in), got shape ", x.shape()));
  if (w.rank() != 4)
    throw ValueError(detail::str(
        "ddp: ", op, ": weight must be KRSC (C_out, kH, kW, C_in), got shape ", w.shape()));
  if (x.dim(0) == 0)
    throw ValueError(
        detail::str("ddp: ", op, ": batch of zero images (x has shape ", x.shape(), ")"));
  if (x.dim(3) != w.dim(3))
    throw ValueError(detail::str("ddp: ", op, ": input has ", x.dim(3), " channels but the weight ",
                                 w.shape(), " expects ", w.dim(3), " (x is NHWC ", x.shape(),
                                 "; is the input NCHW?)"));
  if (stride.h < 1 || stride.w < 1 || dilation.h < 1 || dilation.w < 1 || padding.h < 0 ||
      padding.w < 0)
    throw ValueError(detail::str(
        "ddp: ", op, ": stride (", stride.h, ", ", stride.w, ") and dilation (", dilation.h, ", ",
        dilation.w, ") must be >= 1 and padding (", padding.h, ", ", padding.w, ") >= 0"));
  const std::int64_t ho = conv_out_size(x.dim(1), w.dim(1), stride.h, padding.h, dilation.h);
  const std::int64_t wo = conv_out_size(x.dim(2), w.dim(2), stride.w, padding.w, dilation.w);
  if (ho < 1 || wo < 1)
    throw ValueError(detail::str("ddp: ", op, ": a ", w.dim(1), "x", w.dim(2), " kernel (dilation ",
                                 dilation.h, "x", dilation.w, ", padding ", padding.h, "x",
                                 padding.w, ") does not fit the ", x.dim(1), "x", x.dim(2),
                                 " input"));
  return Shape{x.dim(0), ho, wo, w.dim(0)};
}

// GPU convolutions have fp32, tf32 and bf16 paths; fp16 is refused because only a cuBLAS 1x1 conv
// could take it, silently, while its neighbours could not.
inline void require_conv_precision(Precision math) {
  if (math == Precision::Fp16)
    throw ValueError(
        "ddp: conv2d: fp16 arithmetic is not implemented for convolutions; use bf16 or tf32 "
        "(--precision)");
}

template <class T, Device D, class A>
void validate(const Conv2dForwardArgs<T, D, A>& a) {
  const Shape ys =
      conv2d_output_shape<A, D, T>(a.x, a.w, a.stride, a.padding, a.dilation, "conv2d_forward");
  expect_shape(a.y, ys, "output y", "conv2d_forward");
  if (!a.bias.empty()) expect_shape(a.bias, Shape{a.w.dim(0)}, "bias", "conv2d_forward");
}

template <class T, Device D, class A>
void validate(const Conv2dBackwardArgs<T, D, A>& a) {
  const Shape ys =
      conv2d_output_shape<A, D, T>(a.x, a.w, a.stride, a.padding, a.dilation, "conv2d_backward");
  expect_shape(a.dy, ys, "output gradient dy", "conv2d_backward");
  if (!a.dx.empty()) expect_shape(a.dx, a.x.shape(), "input gradient dx", "conv2d_backward");
  if (!a.dw.empty()) expect_shape(a.dw, a.w.shape(), "weight gradient dw", "conv2d_backward");
  if (!a.dbias.empty())
    expect_shape(a.dbias, Shape{a.w.dim(0)}, "bias gradient dbias", "conv2d_backward");
}

// ---- batchnorm over the last dimension C of an (..., C) tensor (NHWC: per channel over N*H*W)

// How a synchronised BatchNorm (torch.nn.SyncBatchNorm) sums its per-channel statistics over the
// ranks without the kernels knowing of communicators (nn/sync_batchnorm.hpp: one all-reduce,
// docs/decisions/0027). Training kernels given one (Args::sync) hand it this rank's sums and go on
// with the sums over every rank:
//   forward   (2C + 1) doubles: sum x (C), sum x^2 (C), row count M
//   backward  (2C + 1) doubles: sum g (C), sum g xhat (C), row count M  (g: the incoming gradient)
template <Device D>
class ChannelSumReducer {
 public:
  virtual ~ChannelSumReducer() = default;
  // 1: nothing to synchronise; the layer then runs the ordinary kernels, as torch.
  virtual int ranks() const noexcept = 0;
  // In place: every element becomes its sum over the ranks. Ordered after the work already enqueued
  // on exec (CUDA: its stream), and the work enqueued on exec afterwards sees the sums.
  virtual void all_reduce_sum(const Exec<D>& exec, TensorView<double, D> sums) = 0;
};

template <class T, Device D, class A = T>
struct BatchNormForwardArgs {
  TensorView<const A, D> x;       // (N, H, W, C) or (N, C)
  TensorView<const T, D> gamma;   // (C)
  TensorView<const T, D> beta;    // (C)
  TensorView<T, D> running_mean;  // (C): read in eval, updated in training
  TensorView<T, D> running_var;   // (C): unbiased batch variance enters the update, as in PyTorch
  TensorView<A, D> y;             // same shape as x
  TensorView<T, D> save_mean;     // (C) written: batch mean (training) or running mean (eval)
  TensorView<T, D> save_invstd;   // (C) written: 1 / sqrt(var + eps) of the statistics used
  bool training = true;
  double momentum = 0.1;  // running = (1 - momentum) * running + momentum * batch
  double eps = 1e-5;
  // Training only, optional: statistics over every rank's batch (this rank's x may then be empty,
  // as in torch >= 1.12). Eval ignores it (no communication).
  ChannelSumReducer<D>* sync = nullptr;
  // () optional: torch's num_batches_tracked, += 1 per training forward (no launch of its own).
  TensorView<std::int64_t, D> num_batches_tracked;
};

template <class T, Device D, class A = T>
struct BatchNormBackwardArgs {
  TensorView<const A, D> x;            // forward input
  TensorView<const A, D> dy;           // same shape as x
  TensorView<const T, D> gamma;        // (C)
  TensorView<const T, D> save_mean;    // (C) from the forward call
  TensorView<const T, D> save_invstd;  // (C) from the forward call
  TensorView<A, D> dx;                 // same shape as x, optional
  TensorView<T, D> dgamma;             // (C), optional; overwritten
  TensorView<T, D> dbeta;              // (C), optional; overwritten
  bool training = true;                // must match the forward call: batch statistics depend on x
  // As in the forward: dx uses sum g and sum g xhat over every rank; dgamma and dbeta stay this
  // rank's sums (torch's SyncBatchNorm; DDP averages them, docs/decisions/0027).
  ChannelSumReducer<D>* sync = nullptr;
};

// allow_empty: a synchronised training call, where one rank's batch may be empty.
template <class T, Device D>
std::int64_t batchnorm_channels(const TensorView<const T, D>& x, const char* op,
                                bool allow_empty = false) {
  if (x.rank() < 2)
    throw ValueError(detail::str("ddp: ", op, ": x must be (N, ..., C), got shape ", x.shape()));
  if (x.dim(0) == 0 && !allow_empty)
    throw ValueError(
        detail::str("ddp: ", op, ": batch of zero samples (x has shape ", x.shape(), ")"));
  return x.dim(-1);
}

// The synchronised check that validate() cannot make alone: the rows of every rank together.
inline void check_sync_count(double total_rows, const char* op) {
  if (total_rows < 2)
    throw ValueError(detail::str("ddp: ", op,
                                 " (synchronised over ranks): training needs more than 1 value per "
                                 "channel over all ranks together, got ",
                                 total_rows, "; use larger batches or eval mode"));
}

template <class T, Device D, class A>
void validate(const BatchNormForwardArgs<T, D, A>& a) {
  const char* op = "batchnorm_forward";
  const bool synced = a.training && a.sync;
  const std::int64_t c = batchnorm_channels(a.x, op, synced);
  const Shape cs{c};
  expect_shape(a.gamma, cs, "gamma (weight)", op);
  expect_shape(a.beta, cs, "beta (bias)", op);
  expect_shape(a.running_mean, cs, "running_mean", op);
  expect_shape(a.running_var, cs, "running_var", op);
  expect_shape(a.save_mean, cs, "save_mean", op);
  expect_shape(a.save_invstd, cs, "save_invstd", op);
  expect_shape(a.y, a.x.shape(), "output y", op);
  if (!a.num_batches_tracked.empty())
    expect_shape(a.num_batches_tracked, Shape{}, "num_batches_tracked", op);
  if (a.training && !synced && a.x.numel() / c < 2)  // synchronised: check_sync_count on the total
    throw ValueError(detail::str("ddp: ", op,
                                 ": training needs more than 1 value per channel, got x of shape ",
                                 a.x.shape(), "; use a batch larger than 1 or eval mode"));
}

template <class T, Device D, class A>
void validate(const BatchNormBackwardArgs<T, D, A>& a) {
  const char* op = "batchnorm_backward";
  const std::int64_t c = batchnorm_channels(a.x, op, a.training && a.sync);
  const Shape cs{c};
  expect_shape(a.dy, a.x.shape(), "output gradient dy", op);
  expect_shape(a.gamma, cs, "gamma (weight)", op);
  expect_shape(a.save_mean, cs, "save_mean", op);
  expect_shape(a.save_invstd, cs, "save_invstd", op);
  if (!a.dx.empty()) expect_shape(a.dx, a.x.shape(), "input gradient dx", op);
  if (!a.dgamma.empty()) expect_shape(a.dgamma, cs, "dgamma", op);
  if (!a.dbeta.empty()) expect_shape(a.dbeta, cs, "dbeta", op);
}

// ---- pooling (NHWC) ----
template <class T, Device D>
struct MaxPool2dForwardArgs {
  TensorView<const T, D> x;  // (N, H, W, C)
  TensorView<T, D> y;        // (N, H_out, W_out, C)
  // (N, H_out, W_out, C): h * W + w of the winning input; optional
  TensorView<std::int32_t, D> argmax;
  Size2 kernel{3, 3};
  Size2 stride{2, 2};
  Size2 padding{1, 1};  // implicit -infinity padding, as in PyTorch
};

template <class T, Device D>
struct MaxPool2dBackwardArgs {
  TensorView<const T, D> dy;                 // (N, H_out, W_out, C)
  TensorView<const std::int32_t, D> argmax;  // from the forward call
  TensorView<T, D> dx;                       // (N, H, W, C), overwritten
  // The forward's window: CUDA gathers per input element from the outputs covering it (no
  // atomics), which needs it; the CPU scatters through argmax and ignores it.
  Size2 kernel{3, 3};
  Size2 stride{2, 2};
  Size2 padding{1, 1};
};

template <class T, Device D>
Shape maxpool2d_output_shape(const TensorView<const T, D>& x, Size2 k, Size2 s, Size2 p) {
  const char* op = "max_pool2d";
  if (x.rank() != 4)
    throw ValueError(
        detail::str("ddp: ", op, ": x must be NHWC (N, H, W, C), got shape ", x.shape()));
  if (x.dim(0) == 0)
    throw ValueError(
        detail::str("ddp: ", op, ": batch of zero images (x has shape ", x.shape(), ")"));
  if (k.h < 1 || k.w < 1 || s.h < 1 || s.w < 1 || p.h < 0 || p.w < 0 || 2 * p.h > k.h ||
      2 * p.w > k.w)
    throw ValueError(detail::str("ddp: ", op, ": kernel (", k.h, ", ", k.w, ") and stride (", s.h,
                                 ", ", s.w, ") must be >= 1 and padding (", p.h, ", ", p.w,
                                 ") at most half the kernel"));
  const std::int64_t ho = conv_out_size(x.dim(1), k.h, s.h, p.h, 1),
                     wo = conv_out_size(x.dim(2), k.w, s.w, p.w, 1);
  if (ho < 1 || wo < 1)
    throw ValueError(detail::str("ddp: ", op, ": a ", k.h, "x", k.w, " window does not fit the ",
                                 x.dim(1), "x", x.dim(2), " input"));
  return Shape{x.dim(0), ho, wo, x.dim(3)};
}

template <class T, Device D>
void validate(const MaxPool2dForwardArgs<T, D>& a) {
  const Shape ys = maxpool2d_output_shape(a.x, a.kernel, a.stride, a.padding);
  expect_shape(a.y, ys, "output y", "max_pool2d_forward");
  if (!a.argmax.empty()) expect_shape(a.argmax, ys, "argmax", "max_pool2d_forward");
}

template <class T, Device D>
void validate(const MaxPool2dBackwardArgs<T, D>& a) {
  if (a.dx.rank() != 4 || a.dy.rank() != 4 || a.dx.dim(0) != a.dy.dim(0) ||
      a.dx.dim(3) != a.dy.dim(3))
    throw ValueError(detail::str("ddp: max_pool2d_backward: dx ", a.dx.shape(), " and dy ",
                                 a.dy.shape(), " must be NHWC with equal N and C"));
  expect_shape(a.argmax, a.dy.shape(), "argmax", "max_pool2d_backward");
}

// Adaptive average pooling: output size is y's (H_out, W_out); cell i covers rows
// [floor(i H / H_out), ceil((i + 1) H / H_out)), as in PyTorch. (1, 1) is global average pooling.
template <class T, Device D>
struct AdaptiveAvgPool2dForwardArgs {
  TensorView<const T, D> x;  // (N, H, W, C)
  TensorView<T, D> y;        // (N, H_out, W_out, C)
};

template <class T, Device D>
struct AdaptiveAvgPool2dBackwardArgs {
  TensorView<const T, D> dy;  // (N, H_out, W_out, C)
  TensorView<T, D> dx;        // (N, H, W, C), overwritten
};

template <class T, class U, Device D>
void validate_adaptive_pool(const TensorView<T, D>& big, const TensorView<U, D>& small,
                            const char* op) {
  if (big.rank() != 4 || small.rank() != 4)
    throw ValueError(detail::str("ddp: ", op, ": input ", big.shape(), " and output ",
                                 small.shape(), " must both be NHWC"));
  if (big.dim(0) == 0)
    throw ValueError(
        detail::str("ddp: ", op, ": batch of zero images (x has shape ", big.shape(), ")"));
  if (big.dim(0) != small.dim(0) || big.dim(3) != small.dim(3) || small.dim(1) < 1 ||
      small.dim(2) < 1)
    throw ValueError(detail::str("ddp: ", op, ": output ", small.shape(),
                                 " must have the input's N and C (input ", big.shape(),
                                 ") and H_out, W_out >= 1"));
}

template <class T, Device D>
void validate(const AdaptiveAvgPool2dForwardArgs<T, D>& a) {
  validate_adaptive_pool(a.x, a.y, "adaptive_avg_pool2d_forward");
}
template <class T, Device D>
void validate(const AdaptiveAvgPool2dBackwardArgs<T, D>& a) {
  validate_adaptive_pool(a.dx, a.dy, "adaptive_avg_pool2d_backward");
}

// ---- linear: y = x W^T + b ----
template <class T, Device D, class A = T>
struct LinearForwardArgs {
  TensorView<const A, D> x;     // (N, in)
  TensorView<const T, D> w;     // (out, in)
  TensorView<const T, D> bias;  // (out), optional
  TensorView<A, D> y;           // (N, out)
};

template <class T, Device D, class A = T>
struct LinearBackwardArgs {
  TensorView<const A, D> x;   // (N, in)
  TensorView<const T, D> w;   // (out, in)
  TensorView<const A, D> dy;  // (N, out)
  TensorView<A, D> dx;        // (N, in), optional; overwritten
  TensorView<T, D> dw;        // (out, in), optional; overwritten
  TensorView<T, D> dbias;     // (out), optional; overwritten
};

template <class T, Device D, class W = T>
void validate_linear_xw(const TensorView<const T, D>& x,
                        const std::type_identity_t<TensorView<const W, D>>& w, const char* op) {
  if (x.rank() != 2 || w.rank() != 2)
    throw ValueError(detail::str("ddp: ", op, ": x ", x.shape(), " must be (N, in) and w ",
                                 w.shape(),
                                 " (out, in); flatten NHWC activations to (N, H*W*C) first"));
  if (x.dim(0) == 0)
    throw ValueError(
        detail::str("ddp: ", op, ": batch of zero samples (x has shape ", x.shape(), ")"));
  if (x.dim(1) != w.dim(1))
    throw ValueError(detail::str("ddp: ", op, ": input has ", x.dim(1), " features but the weight ",
                                 w.shape(), " expects ", w.dim(1)));
}

template <class T, Device D, class A>
void validate(const LinearForwardArgs<T, D, A>& a) {
  validate_linear_xw<A, D, T>(a.x, a.w, "linear_forward");
  expect_shape(a.y, Shape{a.x.dim(0), a.w.dim(0)}, "output y", "linear_forward");
  if (!a.bias.empty()) expect_shape(a.bias, Shape{a.w.dim(0)}, "bias", "linear_forward");
}

template <class T, Device D, class A>
void validate(const LinearBackwardArgs<T, D, A>& a) {
  validate_linear_xw<A, D, T>(a.x, a.w, "linear_backward");
  expect_shape(a.dy, Shape{a.x.dim(0), a.w.dim(0)}, "output gradient dy", "linear_backward");
  if (!a.dx.empty()) expect_shape(a.dx, a.x.shape(), "input gradient dx", "linear_backward");
  if (!a.dw.empty()) expect_shape(a.dw, a.w.shape(), "weight gradient dw", "linear_backward");
  if (!a.dbias.empty())
    expect_shape(a.dbias, Shape{a.w.dim(0)}, "bias gradient dbias", "linear_backward");
}

// ---- losses (mean reduction); each returns the loss and optionally writes d(loss)/d(input) ----
// Cross-entropy with label smoothing s over C classes, PyTorch's formula (p_i = softmax(logits_i)):
//   loss = mean_i [ (1 - s) (-log p_i[y_i]) + (s / C) sum_c (-log p_i[c]) ]
//   dlogits_i = (p_i - (1 - s) onehot(y_i) - s / C) / N
template <class T, Device D>
struct CrossEntropyArgs {
  TensorView<const T, D> logits;             // (N, C)
  TensorView<const std::int64_t, D> labels;  // (N), each in [0, C)
  TensorView<T, D> dlogits;                  // (N, C), optional; overwritten
  double label_smoothing = 0.0;              // in [0, 1]
};

// loss = mean((x - target)^2) over all elements; dx = 2 (x - target) / numel.
template <class T, Device D>
struct MseArgs {
  TensorView<const T, D> x;
  TensorView<const T, D> target;  // same shape as x
  TensorView<T, D> dx;            // optional; overwritten
};

template <class T, Device D>
void validate(const CrossEntropyArgs<T, D>& a) {
  const char* op = "cross_entropy";
  if (a.logits.rank() != 2)
    throw ValueError(
        detail::str("ddp: ", op, ": logits must be (N, C), got shape ", a.logits.shape()));
  if (a.logits.dim(0) == 0)
    throw ValueError(
        detail::str("ddp: ", op, ": batch of zero samples (logits ", a.logits.shape(), ")"));
  expect_shape(a.labels, Shape{a.logits.dim(0)}, "labels", op);
  if (!a.dlogits.empty()) expect_shape(a.dlogits, a.logits.shape(), "dlogits", op);
  if (!(a.label_smoothing >= 0.0 && a.label_smoothing <= 1.0))
    throw ValueError(
        detail::str("ddp: ", op, ": label_smoothing must be in [0, 1], got ", a.label_smoothing));
}

// Labels live on the device; the kernel throws this for the first bad one.
inline ValueError label_out_of_range(std::int64_t label, std::int64_t index, std::int64_t classes) {
  return ValueError(detail::str("ddp: cross_entropy: label ", label, " of sample ", index,
                                " is out of range for ", classes,
                                " classes (labels must be in [0, ", classes - 1,
                                "]); check the dataset's labels against --num-classes"));
}

template <class T, Device D>
void validate(const MseArgs<T, D>& a) {
  if (a.x.numel() == 0)
    throw ValueError(detail::str("ddp: mse: empty input (x has shape ", a.x.shape(), ")"));
  expect_shape(a.target, a.x.shape(), "target", "mse");
  if (!a.dx.empty()) expect_shape(a.dx, a.x.shape(), "input gradient dx", "mse");
}

// ---- SGD, torch.optim.SGD's update for one parameter tensor ----
//   g = grad + weight_decay * param
//   if momentum != 0: buf = first_step ? g : momentum * buf + (1 - dampening) * g
//                     g = nesterov ? g + momentum * buf : buf
//   param -= lr * g
template <class T, Device D>
struct SgdArgs {
  TensorView<T, D> param;
  TensorView<const T, D> grad;       // same shape as param
  TensorView<T, D> momentum_buffer;  // same shape; required when momentum != 0
  // true: the buffer is initialised to g (PyTorch's "buf is None")
  bool first_step = true;
  double lr = 0.1;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

// Shared by SgdArgs and MultiSgdArgs (kernels/fused_args.hpp); `op` names the kernel.
inline void validate_sgd_hyperparameters(const char* op, double lr, double momentum,
                                         double dampening, double weight_decay, bool nesterov) {
  if (lr < 0.0 || momentum < 0.0 || weight_decay < 0.0)
    throw ValueError(detail::str("ddp: ", op, ": lr (", lr, "), momentum (", momentum,
                                 ") and weight_decay (", weight_decay, ") must be >= 0"));
  if (nesterov && (momentum <= 0.0 || dampening != 0.0))
    throw ValueError(detail::str(
        "ddp: ", op, ": nesterov momentum requires momentum > 0 and dampening 0, got momentum ",
        momentum, " and dampening ", dampening));
}

template <class T, Device D>
void validate(const SgdArgs<T, D>& a) {
  const char* op = "sgd_step";
  expect_shape(a.grad, a.param.shape(), "grad", op);
  validate_sgd_hyperparameters(op, a.lr, a.momentum, a.dampening, a.weight_decay, a.nesterov);
  if (a.momentum != 0.0) expect_shape(a.momentum_buffer, a.param.shape(), "momentum_buffer", op);
}

}  // namespace ddp::kernels
