// Argument structs of every kernel (shared by the CPU and CUDA implementations) and their shape checks.
// SPDX-License-Identifier: MIT
//
// Kernels take one Args struct of views, filled with designated initializers:
//   Kernels<D>::conv2d_forward(exec, Conv2dForwardArgs<float, D>{.x = x.view(), .w = w_.view(), .y = y.view(),
//                                                                .stride = {2, 2}, .padding = {3, 3}});
// Layouts (docs/ARCHITECTURE.md D5): activations NHWC (N, H, W, C), conv weights KRSC (C_out, kH, kW, C_in), linear
// weights (out, in) as in PyTorch. An empty view means "not wanted" where a comment says optional.
// validate(args) throws ValueError naming the op, the tensor, its shape and the expected one; every
// kernel calls it first, so CPU and CUDA reject the same inputs with the same words.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
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
inline std::int64_t conv_out_size(std::int64_t in, std::int64_t k, std::int64_t stride, std::int64_t pad,
                                  std::int64_t dil) {
  return (in + 2 * pad - dil * (k - 1) - 1) / stride + 1;
}

// ---- conv2d (no groups; optional bias) ----
template <class T, Device D>
struct Conv2dForwardArgs {
  TensorView<const T, D> x;     // (N, H, W, C_in)
  TensorView<const T, D> w;     // (C_out, kH, kW, C_in)
  TensorView<const T, D> bias;  // (C_out), optional
  TensorView<T, D> y;           // (N, H_out, W_out, C_out)
  Size2 stride{1, 1};
  Size2 padding{0, 0};
  Size2 dilation{1, 1};
};

template <class T, Device D>
struct Conv2dBackwardArgs {
  TensorView<const T, D> x;   // (N, H, W, C_in), the forward input (needed for dw)
  TensorView<const T, D> w;   // (C_out, kH, kW, C_in) (needed for dx)
  TensorView<const T, D> dy;  // (N, H_out, W_out, C_out)
  TensorView<T, D> dx;        // (N, H, W, C_in), optional (first layer needs none); overwritten
  TensorView<T, D> dw;        // (C_out, kH, kW, C_in), optional; overwritten
  TensorView<T, D> dbias;     // (C_out), optional; overwritten
  Size2 stride{1, 1};
  Size2 padding{0, 0};
  Size2 dilation{1, 1};
};

// The output shape of a conv: (N, H_out, W_out, C_out). Throws if the window does not fit.
template <class T, Device D>
Shape conv2d_output_shape(const TensorView<const T, D>& x, const TensorView<const T, D>& w, Size2 stride, Size2 padding,
                          Size2 dilation, const char* op = "conv2d") {
  if (x.rank() != 4)
    throw ValueError(detail::str("ddp: ", op, ": input x must be NHWC (N, H, W, C_in), got shape ", x.shape()));
  if (w.rank() != 4)
    throw ValueError(detail::str("ddp: ", op, ": weight must be KRSC (C_out, kH, kW, C_in), got shape ", w.shape()));
  if (x.dim(0) == 0) throw ValueError(detail::str("ddp: ", op, ": batch of zero images (x has shape ", x.shape(), ")"));
  if (x.dim(3) != w.dim(3))
    throw ValueError(detail::str("ddp: ", op, ": input has ", x.dim(3), " channels but the weight ", w.shape(),
                                 " expects ", w.dim(3), " (x is NHWC ", x.shape(), "; is the input NCHW?)"));
  if (stride.h < 1 || stride.w < 1 || dilation.h < 1 || dilation.w < 1 || padding.h < 0 || padding.w < 0)
    throw ValueError(detail::str("ddp: ", op, ": stride (", stride.h, ", ", stride.w, ") and dilation (", dilation.h,
                                 ", ", dilation.w, ") must be >= 1 and padding (", padding.h, ", ", padding.w,
                                 ") >= 0"));
  const std::int64_t ho = conv_out_size(x.dim(1), w.dim(1), stride.h, padding.h, dilation.h);
  const std::int64_t wo = conv_out_size(x.dim(2), w.dim(2), stride.w, padding.w, dilation.w);
  if (ho < 1 || wo < 1)
    throw ValueError(detail::str("ddp: ", op, ": a ", w.dim(1), "x", w.dim(2), " kernel (dilation ", dilation.h, "x",
                                 dilation.w, ", padding ", padding.h, "x", padding.w, ") does not fit the ", x.dim(1),
                                 "x", x.dim(2), " input"));
  return Shape{x.dim(0), ho, wo, w.dim(0)};
}

template <class T, Device D>
void validate(const Conv2dForwardArgs<T, D>& a) {
  const Shape ys = conv2d_output_shape(a.x, a.w, a.stride, a.padding, a.dilation, "conv2d_forward");
  expect_shape(a.y, ys, "output y", "conv2d_forward");
  if (!a.bias.empty()) expect_shape(a.bias, Shape{a.w.dim(0)}, "bias", "conv2d_forward");
}

template <class T, Device D>
void validate(const Conv2dBackwardArgs<T, D>& a) {
  const Shape ys = conv2d_output_shape(a.x, a.w, a.stride, a.padding, a.dilation, "conv2d_backward");
  expect_shape(a.dy, ys, "output gradient dy", "conv2d_backward");
  if (!a.dx.empty()) expect_shape(a.dx, a.x.shape(), "input gradient dx", "conv2d_backward");
  if (!a.dw.empty()) expect_shape(a.dw, a.w.shape(), "weight gradient dw", "conv2d_backward");
  if (!a.dbias.empty()) expect_shape(a.dbias, Shape{a.w.dim(0)}, "bias gradient dbias", "conv2d_backward");
}

// ---- batchnorm over the last dimension C of an (..., C) tensor (NHWC: per channel over N*H*W) ----

// How a synchronised BatchNorm (torch.nn.SyncBatchNorm) sums its per-channel statistics over the ranks of a
// process group, without the kernels knowing of communicators: nn/sync_batchnorm.hpp implements it with one
// all-reduce (docs/ARCHITECTURE.md D27). Training kernels given one (Args::sync) compute this rank's sums,
// hand them here, and go on with the sums over every rank:
//   forward   (2C + 1) doubles: sum x (C), sum x^2 (C), row count M
//   backward  (2C + 1) doubles: sum g (C), sum g xhat (C), row count M   (g: the gradient reaching the BN)
template <Device D>
class ChannelSumReducer {
 public:
  virtual ~ChannelSumReducer() = default;
  // How many ranks take part (1: nothing to synchronise; the layer then runs the ordinary kernels, as torch).
  virtual int ranks() const noexcept = 0;
  // In place: every element becomes its sum over the ranks. Ordered after the work already enqueued on
  // exec (CUDA: its stream), and the work enqueued on exec afterwards sees the sums.
  virtual void all_reduce_sum(const Exec<D>& exec, TensorView<double, D> sums) = 0;
};

template <class T, Device D>
struct BatchNormForwardArgs {
  TensorView<const T, D> x;       // (N, H, W, C) or (N, C)
  TensorView<const T, D> gamma;   // (C)
  TensorView<const T, D> beta;    // (C)
  TensorView<T, D> running_mean;  // (C): read in eval, updated in training
  TensorView<T, D> running_var;   // (C): unbiased batch variance enters the update, as in PyTorch
  TensorView<T, D> y;             // same shape as x
  TensorView<T, D> save_mean;     // (C) written: batch mean (training) or running mean (eval)
  TensorView<T, D> save_invstd;   // (C) written: 1 / sqrt(var + eps) of the statistics used
  bool training = true;
  double momentum = 0.1;  // running = (1 - momentum) * running + momentum * batch
  double eps = 1e-5;
  // Training only, optional: the statistics are those of every rank's batch together (count M summed over
  // the ranks; this rank's x may then be empty, as in torch >= 1.12). Eval ignores it (no communication).
  ChannelSumReducer<D>* sync = nullptr;
};

template <class T, Device D>
struct BatchNormBackwardArgs {
  TensorView<const T, D> x;            // forward input
  TensorView<const T, D> dy;           // same shape as x
  TensorView<const T, D> gamma;        // (C)
  TensorView<const T, D> save_mean;    // (C) from the forward call
  TensorView<const T, D> save_invstd;  // (C) from the forward call
  TensorView<T, D> dx;                 // same shape as x, optional
  TensorView<T, D> dgamma;             // (C), optional; overwritten
  TensorView<T, D> dbeta;              // (C), optional; overwritten
  bool training = true;                // must match the forward call: batch statistics depend on x
  // Training only, optional, as in the forward call: dx uses sum g and sum g xhat over every rank; dgamma
  // and dbeta stay this rank's sums (torch's SyncBatchNorm; DDP then averages them, docs/ARCHITECTURE.md D27).
  ChannelSumReducer<D>* sync = nullptr;
};

// allow_empty: a synchronised training call, where one rank's batch may be empty (the others' are not).
template <class T, Device D>
std::int64_t batchnorm_channels(const TensorView<const T, D>& x, const char* op, bool allow_empty = false) {
  if (x.rank() < 2) throw ValueError(detail::str("ddp: ", op, ": x must be (N, ..., C), got shape ", x.shape()));
  if (x.dim(0) == 0 && !allow_empty)
    throw ValueError(detail::str("ddp: ", op, ": batch of zero samples (x has shape ", x.shape(), ")"));
  return x.dim(-1);
}

// The synchronised check that validate() cannot make alone: the rows of every rank together.
inline void check_sync_count(double total_rows, const char* op) {
  if (total_rows < 2)
    throw ValueError(detail::str("ddp: ", op, " (synchronised over ranks): training needs more than 1 value per "
                                 "channel over all ranks together, got ", total_rows,
                                 "; use larger batches or eval mode"));
}

template <class T, Device D>
void validate(const BatchNormForwardArgs<T, D>& a) {
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
  if (a.training && !synced && a.x.numel() / c < 2)  // synchronised: check_sync_count on the total
    throw ValueError(detail::str("ddp: ", op, ": training needs more than 1 value per channel, got x of shape ",
                                 a.x.shape(), "; use a batch larger than 1 or eval mode"));
}

template <class T, Device D>
void validate(const BatchNormBackwardArgs<T, D>& a) {
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
  TensorView<const T, D> x;            // (N, H, W, C)
  TensorView<T, D> y;                  // (N, H_out, W_out, C)
  TensorView<std::int32_t, D> argmax;  // (N, H_out, W_out, C): h * W + w of the winning input; optional
  Size2 kernel{3, 3};
  Size2 stride{2, 2};
  Size2 padding{1, 1};  // implicit -infinity padding, as in PyTorch
};

template <class T, Device D>
struct MaxPool2dBackwardArgs {
  TensorView<const T, D> dy;                 // (N, H_out, W_out, C)
  TensorView<const std::int32_t, D> argmax;  // from the forward call
  TensorView<T, D> dx;                       // (N, H, W, C), overwritten
  // The forward's window (the CPU scatters through argmax and ignores it; CUDA gathers, per input
  // element, from the outputs whose window covers it, which needs the geometry; no atomics).
  Size2 kernel{3, 3};
  Size2 stride{2, 2};
  Size2 padding{1, 1};
};

template <class T, Device D>
Shape maxpool2d_output_shape(const TensorView<const T, D>& x, Size2 k, Size2 s, Size2 p) {
  const char* op = "max_pool2d";
  if (x.rank() != 4) throw ValueError(detail::str("ddp: ", op, ": x must be NHWC (N, H, W, C), got shape ", x.shape()));
  if (x.dim(0) == 0) throw ValueError(detail::str("ddp: ", op, ": batch of zero images (x has shape ", x.shape(), ")"));
  if (k.h < 1 || k.w < 1 || s.h < 1 || s.w < 1 || p.h < 0 || p.w < 0 || 2 * p.h > k.h || 2 * p.w > k.w)
    throw ValueError(detail::str("ddp: ", op, ": kernel (", k.h, ", ", k.w, ") and stride (", s.h, ", ", s.w,
                                 ") must be >= 1 and padding (", p.h, ", ", p.w, ") at most half the kernel"));
  const std::int64_t ho = conv_out_size(x.dim(1), k.h, s.h, p.h, 1), wo = conv_out_size(x.dim(2), k.w, s.w, p.w, 1);
  if (ho < 1 || wo < 1)
    throw ValueError(detail::str("ddp: ", op, ": a ", k.h, "x", k.w, " window does not fit the ", x.dim(1), "x",
                                 x.dim(2), " input"));
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
  if (a.dx.rank() != 4 || a.dy.rank() != 4 || a.dx.dim(0) != a.dy.dim(0) || a.dx.dim(3) != a.dy.dim(3))
    throw ValueError(detail::str("ddp: max_pool2d_backward: dx ", a.dx.shape(), " and dy ", a.dy.shape(),
                                 " must be NHWC with equal N and C"));
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
void validate_adaptive_pool(const TensorView<T, D>& big, const TensorView<U, D>& small, const char* op) {
  if (big.rank() != 4 || small.rank() != 4)
    throw ValueError(
        detail::str("ddp: ", op, ": input ", big.shape(), " and output ", small.shape(), " must both be NHWC"));
  if (big.dim(0) == 0)
    throw ValueError(detail::str("ddp: ", op, ": batch of zero images (x has shape ", big.shape(), ")"));
  if (big.dim(0) != small.dim(0) || big.dim(3) != small.dim(3) || small.dim(1) < 1 || small.dim(2) < 1)
    throw ValueError(detail::str("ddp: ", op, ": output ", small.shape(), " must have the input's N and C (input ",
                                 big.shape(), ") and H_out, W_out >= 1"));
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
template <class T, Device D>
struct LinearForwardArgs {
  TensorView<const T, D> x;     // (N, in)
  TensorView<const T, D> w;     // (out, in)
  TensorView<const T, D> bias;  // (out), optional
  TensorView<T, D> y;           // (N, out)
};

template <class T, Device D>
struct LinearBackwardArgs {
  TensorView<const T, D> x;   // (N, in)
  TensorView<const T, D> w;   // (out, in)
  TensorView<const T, D> dy;  // (N, out)
  TensorView<T, D> dx;        // (N, in), optional; overwritten
  TensorView<T, D> dw;        // (out, in), optional; overwritten
  TensorView<T, D> dbias;     // (out), optional; overwritten
};

template <class T, Device D>
void validate_linear_xw(const TensorView<const T, D>& x, const TensorView<const T, D>& w, const char* op) {
  if (x.rank() != 2 || w.rank() != 2)
    throw ValueError(detail::str("ddp: ", op, ": x ", x.shape(), " must be (N, in) and w ", w.shape(),
                                 " (out, in); flatten NHWC activations to (N, H*W*C) first"));
  if (x.dim(0) == 0)
    throw ValueError(detail::str("ddp: ", op, ": batch of zero samples (x has shape ", x.shape(), ")"));
  if (x.dim(1) != w.dim(1))
    throw ValueError(detail::str("ddp: ", op, ": input has ", x.dim(1), " features but the weight ", w.shape(),
                                 " expects ", w.dim(1)));
}

template <class T, Device D>
void validate(const LinearForwardArgs<T, D>& a) {
  validate_linear_xw(a.x, a.w, "linear_forward");
  expect_shape(a.y, Shape{a.x.dim(0), a.w.dim(0)}, "output y", "linear_forward");
  if (!a.bias.empty()) expect_shape(a.bias, Shape{a.w.dim(0)}, "bias", "linear_forward");
}

template <class T, Device D>
void validate(const LinearBackwardArgs<T, D>& a) {
  validate_linear_xw(a.x, a.w, "linear_backward");
  expect_shape(a.dy, Shape{a.x.dim(0), a.w.dim(0)}, "output gradient dy", "linear_backward");
  if (!a.dx.empty()) expect_shape(a.dx, a.x.shape(), "input gradient dx", "linear_backward");
  if (!a.dw.empty()) expect_shape(a.dw, a.w.shape(), "weight gradient dw", "linear_backward");
  if (!a.dbias.empty()) expect_shape(a.dbias, Shape{a.w.dim(0)}, "bias gradient dbias", "linear_backward");
}

// ---- transformer modules (issue 19): layer_norm, embedding, dropout ----
// The per-row statistics LayerNorm keeps for backward: float for float and the 16-bit types, double for double.
template <class T>
using LayerNormStat = std::conditional_t<std::is_same_v<T, double>, double, float>;

// torch.nn.LayerNorm over the last dimension of rows of C elements (the module flattens any leading dims):
//   mean = sum x / C, var = sum (x - mean)^2 / C (biased), rstd = 1 / sqrt(var + eps)
//   y = ((x - mean) rstd) * weight + bias
template <class T, Device D>
struct LayerNormForwardArgs {
  TensorView<const T, D> x;              // (M, C)
  TensorView<const T, D> weight;         // (C), optional (elementwise_affine=False: 1)
  TensorView<const T, D> bias;           // (C), optional (0)
  TensorView<T, D> y;                    // (M, C); overwritten
  TensorView<LayerNormStat<T>, D> mean;  // (M); overwritten
  TensorView<LayerNormStat<T>, D> rstd;  // (M); overwritten
  double eps = 1e-5;
};

// With xhat = (x - mean) rstd and g = dy * weight (dy when no weight):
//   dx = rstd (g - mean_row(g) - xhat mean_row(g xhat)),  dweight = sum_rows dy xhat,  dbias = sum_rows dy
template <class T, Device D>
struct LayerNormBackwardArgs {
  TensorView<const T, D> x;                    // (M, C), the forward input
  TensorView<const T, D> weight;               // (C), optional
  TensorView<const LayerNormStat<T>, D> mean;  // (M), from the forward
  TensorView<const LayerNormStat<T>, D> rstd;  // (M), from the forward
  TensorView<const T, D> dy;                   // (M, C)
  TensorView<T, D> dx;                         // (M, C), optional; overwritten
  TensorView<T, D> dweight;                    // (C), optional; overwritten
  TensorView<T, D> dbias;                      // (C), optional; overwritten
};

template <class T, Device D>
void validate_layer_norm_x(const TensorView<const T, D>& x, const TensorView<const T, D>& weight, const char* op) {
  if (x.rank() != 2 || x.dim(0) == 0 || x.dim(1) == 0)
    throw ValueError(detail::str("ddp: ", op, ": x ", x.shape(),
                                 " must be (M, C) with M, C >= 1; flatten the leading dimensions first"));
  if (!weight.empty()) expect_shape(weight, Shape{x.dim(1)}, "weight", op);
}

template <class T, Device D>
void validate(const LayerNormForwardArgs<T, D>& a) {
  const char* op = "layer_norm_forward";
  validate_layer_norm_x(a.x, a.weight, op);
  if (!a.bias.empty()) expect_shape(a.bias, Shape{a.x.dim(1)}, "bias", op);
  expect_shape(a.y, a.x.shape(), "output y", op);
  expect_shape(a.mean, Shape{a.x.dim(0)}, "mean", op);
  expect_shape(a.rstd, Shape{a.x.dim(0)}, "rstd", op);
  if (!(a.eps > 0.0)) throw ValueError(detail::str("ddp: ", op, ": eps must be > 0, got ", a.eps));
}

template <class T, Device D>
void validate(const LayerNormBackwardArgs<T, D>& a) {
  const char* op = "layer_norm_backward";
  validate_layer_norm_x(a.x, a.weight, op);
  expect_shape(a.mean, Shape{a.x.dim(0)}, "mean", op);
  expect_shape(a.rstd, Shape{a.x.dim(0)}, "rstd", op);
  expect_shape(a.dy, a.x.shape(), "output gradient dy", op);
  if (!a.dx.empty()) expect_shape(a.dx, a.x.shape(), "input gradient dx", op);
  if (!a.dweight.empty()) expect_shape(a.dweight, Shape{a.x.dim(1)}, "weight gradient dweight", op);
  if (!a.dbias.empty()) expect_shape(a.dbias, Shape{a.x.dim(1)}, "bias gradient dbias", op);
}

// torch.nn.Embedding: y[n] = weight[ids[n]]; backward dweight[v] = sum over n with ids[n] == v of dy[n].
// The kernels check every id (a ValueError naming the op) unless ids_checked says the caller already has:
// nn::Embedding checks host ids itself, to name the module and the position in its (B, T) ids, and its backward
// passes the ids its forward checked (unchanged: the caller keeps them alive and untouched until backward). The
// CPU then scans the ids once per call instead of twice, and the CUDA backward skips its read-back and stream
// synchronisation. A caller that sets the flag on unchecked ids gets no error: on the CPU, reads or writes outside
// weight/dweight; on CUDA, zero rows for bad ids in forward and bad positions left out of dweight.
template <class T, Device D>
struct EmbeddingForwardArgs {
  TensorView<const std::int64_t, D> ids;  // (N), each in [0, V)
  TensorView<const T, D> weight;          // (V, C)
  TensorView<T, D> y;                     // (N, C); overwritten
  bool ids_checked = false;               // every id is known to be in [0, V): the kernel does not check
};

template <class T, Device D>
struct EmbeddingBackwardArgs {
  TensorView<const std::int64_t, D> ids;  // (N), each in [0, V)
  TensorView<const T, D> dy;              // (N, C)
  TensorView<T, D> dweight;               // (V, C); overwritten (rows of unused ids are 0)
  bool ids_checked = false;               // every id is known to be in [0, V): the kernel does not check
};

template <class T, Device D>
void validate_embedding(const TensorView<const std::int64_t, D>& ids, const TensorView<const T, D>& rows,
                        const char* rows_name, const Shape& weight, const char* op) {
  if (weight.rank() != 2 || weight[0] == 0 || weight[1] == 0)
    throw ValueError(detail::str("ddp: ", op, ": weight ", weight, " must be (V, C) with V, C >= 1"));
  if (ids.rank() != 1 || ids.dim(0) == 0)
    throw ValueError(detail::str("ddp: ", op, ": ids ", ids.shape(), " must be (N) with N >= 1; flatten them first"));
  expect_shape(rows, Shape{ids.dim(0), weight[1]}, rows_name, op);
}

template <class T, Device D>
void validate(const EmbeddingForwardArgs<T, D>& a) {
  validate_embedding(a.ids, TensorView<const T, D>(a.y), "output y", a.weight.shape(), "embedding_forward");
}

template <class T, Device D>
void validate(const EmbeddingBackwardArgs<T, D>& a) {
  validate_embedding(a.ids, a.dy, "output gradient dy", a.dweight.shape(), "embedding_backward");
}

// Index of the first of n host ids outside [0, num), or -1 when all are in range.
inline std::int64_t first_id_out_of_range(const std::int64_t* ids, std::int64_t n, std::int64_t num) {
  for (std::int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= num) return i;
  return -1;
}

// The error for a bad token id: `who` is the op or the module (Module::where()), `index` the id's flat index in
// ids of shape `ids_shape`, printed as a position in that shape.
inline ValueError embedding_id_out_of_range(std::string_view who, std::int64_t id, std::int64_t index,
                                            const Shape& ids_shape, std::int64_t num) {
  std::int64_t pos[Shape::kMaxRank] = {};
  for (int d = ids_shape.rank() - 1; d >= 0; --d) {
    pos[d] = index % ids_shape[d];
    index /= ids_shape[d];
  }
  std::string at = "(";
  for (int d = 0; d < ids_shape.rank(); ++d) at += detail::str(d ? ", " : "", pos[d]);
  at += ")";
  return ValueError(detail::str("ddp: ", who, ": token id ", id, " at position ", at, " of ids ", ids_shape,
                                " is out of range [0, ", num, "); ids must be below num_embeddings (", num,
                                "): check the vocabulary size against the data"));
}

// Inverted dropout (torch.nn.Dropout in training): y = keep ? x / (1 - p) : 0, keep with probability 1 - p.
// The mask is a function of (seed, rank, stream, step) and the element index (kernels/elementwise.hpp,
// DropoutMask): element i uses word i % 4 of block (step << 32) + i / 4 of Generator(seed, rank, stream)
// (tensor/random.hpp) and is dropped when that word's unit value (w + 0.5) / 2^32 is below p.
template <class T, Device D>
struct DropoutForwardArgs {
  TensorView<const T, D> x;
  TensorView<T, D> y;                // same shape as x; overwritten (may alias x)
  TensorView<std::uint8_t, D> mask;  // same shape as x; overwritten: 1 kept, 0 dropped
  double p = 0.5;                    // in [0, 1]
  std::uint64_t seed = 0;
  std::uint32_t rank = 0;
  std::uint32_t stream = 0;
  std::uint64_t step = 0;  // below 2^32
};

// dx = mask ? dy / (1 - p) : 0.
template <class T, Device D>
struct DropoutBackwardArgs {
  TensorView<const T, D> dy;
  TensorView<const std::uint8_t, D> mask;  // same shape as dy, from the forward
  TensorView<T, D> dx;                     // same shape as dy; overwritten (may alias dy)
  double p = 0.5;
};

inline void validate_dropout_p(double p, const char* op) {
  if (!(p >= 0.0 && p <= 1.0)) throw ValueError(detail::str("ddp: ", op, ": p must be in [0, 1], got ", p));
}

// What one step's mask can draw (kernels/elementwise.hpp, DropoutMask): numel elements, at most 2^32 Philox blocks
// of 4, and a step below 2^32 (the counter's 32-bit words).
inline void validate_dropout_draw(std::int64_t numel, std::uint64_t step, const char* op) {
  if (numel > (std::int64_t{1} << 34))
    throw ValueError(detail::str("ddp: ", op, ": ", numel, " elements exceed the 2^34 one step's mask can draw"));
  if (step >> 32) throw ValueError(detail::str("ddp: ", op, ": step ", step, " must be below 2^32"));
}

template <class T, Device D>
void validate(const DropoutForwardArgs<T, D>& a) {
  const char* op = "dropout_forward";
  validate_dropout_p(a.p, op);
  expect_shape(a.y, a.x.shape(), "output y", op);
  expect_shape(a.mask, a.x.shape(), "mask", op);
  validate_dropout_draw(a.x.numel(), a.step, op);
}

template <class T, Device D>
void validate(const DropoutBackwardArgs<T, D>& a) {
  const char* op = "dropout_backward";
  validate_dropout_p(a.p, op);
  expect_shape(a.mask, a.dy.shape(), "mask", op);
  expect_shape(a.dx, a.dy.shape(), "input gradient dx", op);
}

// ---- losses (mean reduction); each returns the loss and optionally writes d(loss)/d(input) ----
// Cross-entropy with label smoothing s over C classes, PyTorch's formula:
//   loss = mean_i [ (1 - s) (-log p_i[y_i]) + (s / C) sum_c (-log p_i[c]) ],  p_i = softmax(logits_i)
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
    throw ValueError(detail::str("ddp: ", op, ": logits must be (N, C), got shape ", a.logits.shape()));
  if (a.logits.dim(0) == 0)
    throw ValueError(detail::str("ddp: ", op, ": batch of zero samples (logits ", a.logits.shape(), ")"));
  expect_shape(a.labels, Shape{a.logits.dim(0)}, "labels", op);
  if (!a.dlogits.empty()) expect_shape(a.dlogits, a.logits.shape(), "dlogits", op);
  if (!(a.label_smoothing >= 0.0 && a.label_smoothing <= 1.0))
    throw ValueError(detail::str("ddp: ", op, ": label_smoothing must be in [0, 1], got ", a.label_smoothing));
}

// Labels live on the device; the kernel checks each one and throws this error for the first bad one.
inline ValueError label_out_of_range(std::int64_t label, std::int64_t index, std::int64_t classes) {
  return ValueError(detail::str("ddp: cross_entropy: label ", label, " of sample ", index, " is out of range for ",
                                classes, " classes (labels must be in [0, ", classes - 1,
                                "]); check the dataset's labels against --num-classes"));
}

template <class T, Device D>
void validate(const MseArgs<T, D>& a) {
  if (a.x.numel() == 0) throw ValueError(detail::str("ddp: mse: empty input (x has shape ", a.x.shape(), ")"));
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
  bool first_step = true;            // true: the buffer is initialised to g (PyTorch's "buf is None")
  double lr = 0.1;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

// The hyper-parameter checks shared by SgdArgs and MultiSgdArgs (kernels/fused_args.hpp); `op` names the kernel.
inline void validate_sgd_hyperparameters(const char* op, double lr, double momentum, double dampening,
                                         double weight_decay, bool nesterov) {
  if (lr < 0.0 || momentum < 0.0 || weight_decay < 0.0)
    throw ValueError(detail::str("ddp: ", op, ": lr (", lr, "), momentum (", momentum, ") and weight_decay (",
                                 weight_decay, ") must be >= 0"));
  if (nesterov && (momentum <= 0.0 || dampening != 0.0))
    throw ValueError(detail::str("ddp: ", op, ": nesterov momentum requires momentum > 0 and dampening 0, got momentum ",
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
