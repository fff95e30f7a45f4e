// Convolutions through cuDNN (docs/decisions/0052): forward, backward-data and backward-weight of
// conv2d.cuh's problem, NHWC activations and KRSC weights as they are, fp32 in memory.
// SPDX-License-Identifier: MIT
//
// Host code only (cuDNN is a host API): compiles without nvcc, so tests/gpu/cudnn checks its
// host-side logic without a GPU. Used by conv2d.cuh under DDP_WITH_CUDNN when the exec's ConvImpl
// is not Own.
//
// A Plan per convolution shape, made once per thread and kept: the descriptors (x and y as NHWC
// tensors, the weight as an NHWC filter, i.e. KRSC), the algorithm and its workspace size. The
// algorithm is the first acceptable entry of cuDNN's list, ranked by heuristics (ConvImpl::Cudnn,
// PyTorch's default) or by measured time (ConvImpl::CudnnFind, PyTorch's cudnn.benchmark).
// Acceptable (accepts()):
//   - status success and a workspace of at most kMaxWorkspaceBytes;
//   - deterministic when Exec<Cuda>::deterministic is set;
//   - a math type that fits the exec's Precision: Fp32 takes CUDNN_FMA_MATH only (no TF32: the
//     CPU's results to rounding); Tf32 and Bf16 take any but ALLOW_CONVERSION (it may convert fp32
//     operands to fp16, whose range fp32 data can exceed).
// On fp32 tensors Bf16 runs TF32 arithmetic: cuDNN computes bf16 products only from bf16 tensors,
// and TF32 is at least as accurate. Handles, one per thread and device as cuBLAS's, are bound to
// the exec's stream before each call and never destroyed (destroying them after the CUDA context
// is gone crashes some drivers). The workspace comes from the caching allocator on the exec's
// stream (no cudaMalloc after the first steps).
// bf16 activations (docs/decisions/0072): x, y, dx, dy as CUDNN_DATA_BFLOAT16, the weight as the
// caller's bf16 copy, FLOAT compute type; these plans run at Precision::Bf16 whatever the exec's
// (bf16 operands give exact products accumulated in fp32) and are keyed apart by data type. The
// legacy API has no mixed-type backward-filter, so their weight gradient is bf16.
// Shapes cuDNN's int descriptors cannot hold (a dimension or tensor of >= 2^31 elements) are not
// describable(); conv2d.cuh runs them on ddp's own kernels.
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/core/cuda_check.hpp"
#include "ddp/core/dtype.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/args.hpp"
#include "ddp/kernels/geometry.hpp"
#include "ddp/tensor/conv_impl.hpp"
#include "ddp/tensor/cuda/allocator.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/precision.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::kernels::cuda::cudnn {

// "ddp: expr failed: CUDNN_STATUS_X (cuDNN's description) at file:line[: hint]"
inline std::string error_text(const char* expr, cudnnStatus_t s, const char* file, int line,
                              std::string_view hint = {}) {
  return ddp::detail::str("ddp: ", expr, " failed: ", cudnnGetErrorString(s), " at ", file, ':',
                          line, hint.empty() ? "" : ": ", hint);
}

}  // namespace ddp::kernels::cuda::cudnn

#define DDP_CUDNN_CHECK(expr)                                                          \
  do {                                                                                 \
    if (const cudnnStatus_t ddp_s_ = (expr); ddp_s_ != CUDNN_STATUS_SUCCESS)           \
      throw ::ddp::CudaError(                                                          \
          ::ddp::kernels::cuda::cudnn::error_text(#expr, ddp_s_, __FILE__, __LINE__)); \
  } while (0)

namespace ddp::kernels::cuda::cudnn {

enum class Op : std::uint8_t { Forward, BackwardData, BackwardFilter };

inline constexpr std::string_view op_name(Op op) noexcept {
  switch (op) {
    case Op::Forward: return "forward";
    case Op::BackwardData: return "backward-data";
    case Op::BackwardFilter: return "backward-filter";
  }
  return "?";
}

// Cap on an algorithm's workspace (bytes). PyTorch lets cuDNN take what it asks and retries on
// out-of-memory; a fixed cap keeps a plan the same from run to run. 1 GiB covers ResNet-50's
// fastest algorithms at batch 256 and is small beside an H100's 80 GB.
inline constexpr std::size_t kMaxWorkspaceBytes = std::size_t{1} << 30;

// One entry of cuDNN's algorithm list, whichever of the three perf structs it came from.
struct AlgoChoice {
  int algo = -1;
  cudnnStatus_t status = CUDNN_STATUS_NOT_SUPPORTED;
  float time_ms = -1.f;       // measured (Find) or -1 (heuristics)
  std::size_t workspace = 0;  // bytes
  bool deterministic = false;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

template <class Perf>
AlgoChoice to_choice(const Perf& p) {
  return {.algo = static_cast<int>(p.algo),
          .status = p.status,
          .time_ms = p.time,
          .workspace = p.memory,
          .deterministic = p.determinism == CUDNN_DETERMINISTIC,
          .math = p.mathType};
}

// The descriptor's math type at p: Fp32 forbids tensor cores; the others allow TF32.
inline cudnnMathType_t requested_math(Precision p) {
  require_conv_precision(p);  // fp16: refused as by ddp's kernels
  return p == Precision::Fp32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
}

// Whether an algorithm's math type computes at precision p (see the header comment).
inline bool math_fits(cudnnMathType_t m, Precision p) {
  if (p == Precision::Fp32) return m == CUDNN_FMA_MATH;
  return m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

inline bool accepts(const AlgoChoice& a, Precision p, bool deterministic,
                    std::size_t max_workspace) {
  return a.status == CUDNN_STATUS_SUCCESS && a.workspace <= max_workspace &&
         (!deterministic || a.deterministic) && math_fits(a.math, p);
}

// The first acceptable entry in cuDNN's order, or algo -1 when there is none.
inline AlgoChoice choose(std::span<const AlgoChoice> ranked, Precision p, bool deterministic,
                         std::size_t max_workspace = kMaxWorkspaceBytes) {
  for (const AlgoChoice& a : ranked)
    if (accepts(a, p, deterministic, max_workspace)) return a;
  return {};
}

// Whether cuDNN's int descriptors can hold g: every dimension and tensor size below 2^31.
inline bool describable(const ConvGeometry& g) {
  const std::int64_t limit = INT_MAX;
  for (std::int64_t v : {g.n, g.h, g.w, g.c, g.k, g.r, g.s, g.ho, g.wo, g.stride.h, g.stride.w,
                         g.pad.h, g.pad.w, g.dil.h, g.dil.w})
    if (v < 0 || v > limit) return false;
  return g.n * g.h * g.w * g.c <= limit && g.n * g.ho * g.wo * g.k <= limit &&
         g.k * g.r * g.s * g.c <= limit;
}

// RAII for one cuDNN descriptor type.
template <class H, cudnnStatus_t (*Create)(H*), cudnnStatus_t (*Destroy)(H)>
class Descriptor {
 public:
  Descriptor() { DDP_CUDNN_CHECK(Create(&h_)); }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() {
    if (h_) (void)Destroy(h_);
  }
  H get() const noexcept { return h_; }

 private:
  H h_ = nullptr;
};
using TensorDesc =
    Descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDesc =
    Descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvDesc = Descriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                            cudnnDestroyConvolutionDescriptor>;

// callers check describable() first
inline int to_int(std::int64_t v) { return static_cast<int>(v); }

// cuDNN's name for the element type E of x, y and w in memory (float or bfloat16).
template <class E>
inline constexpr cudnnDataType_t data_type = CUDNN_DATA_FLOAT;
template <>
inline constexpr cudnnDataType_t data_type<bfloat16> = CUDNN_DATA_BFLOAT16;

// The exec's precision for fp32 tensors, Bf16 for bf16 ones.
inline Precision plan_precision(Precision p, cudnnDataType_t dt) {
  return dt == CUDNN_DATA_BFLOAT16 ? Precision::Bf16 : p;
}

// Descriptors of g (describable(g) must hold): x (n, c, h, w) and y (n, k, ho, wo) in NHWC, the
// weight (k, c, r, s) as an NHWC filter (our KRSC), all of type dt; bias (1, k, 1, 1) in float.
// The convolution computes in float whatever dt.
struct Descriptors {
  TensorDesc x, y, bias;
  FilterDesc w;
  ConvDesc conv;
  Descriptors(const ConvGeometry& g, Precision p, cudnnDataType_t dt = CUDNN_DATA_FLOAT) {
    DDP_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x.get(), CUDNN_TENSOR_NHWC, dt, to_int(g.n),
                                               to_int(g.c), to_int(g.h), to_int(g.w)));
    DDP_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y.get(), CUDNN_TENSOR_NHWC, dt, to_int(g.n),
                                               to_int(g.k), to_int(g.ho), to_int(g.wo)));
    DDP_CUDNN_CHECK(cudnnSetTensor4dDescriptor(bias.get(), CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 1,
                                               to_int(g.k), 1, 1));
    DDP_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w.get(), dt, CUDNN_TENSOR_NHWC, to_int(g.k),
                                               to_int(g.c), to_int(g.r), to_int(g.s)));
    // Cross-correlation (no kernel flip), as every framework's "convolution" and our CPU kernel.
    DDP_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        conv.get(), to_int(g.pad.h), to_int(g.pad.w), to_int(g.stride.h), to_int(g.stride.w),
        to_int(g.dil.h), to_int(g.dil.w), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    DDP_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.get(), requested_math(p)));
  }
};

// The current CUDA device (handles and plans are kept per device).
inline int current_device() {
  int device = 0;
  DDP_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

// This thread's cuDNN handle for `device` (the current one), bound to e's stream.
inline cudnnHandle_t handle(const Exec<Cuda>& e, int device = current_device()) {
  thread_local std::map<int, cudnnHandle_t> handles;
  cudnnHandle_t& h = handles[device];
  if (!h) {
    if (const cudnnStatus_t s = cudnnCreate(&h); s != CUDNN_STATUS_SUCCESS) {
      h = nullptr;
      throw CudaError(error_text(
          "cudnnCreate(&handle)", s, __FILE__, __LINE__,
          ddp::detail::str("cuDNN ", cudnnGetVersion(), " could not start on CUDA device ", device,
                           " (no usable GPU or driver?); --conv own runs ddp's "
                           "own convolution kernels instead")));
    }
  }
  DDP_CUDNN_CHECK(cudnnSetStream(h, cuda_stream(e)));
  return h;
}

// A plan's key: op, geometry, how the algorithm is chosen, device, tensors' data type.
using PlanKey = std::array<std::int64_t, 21>;
inline PlanKey plan_key(Op op, const ConvGeometry& g, Precision p, bool find, bool deterministic,
                        int device, cudnnDataType_t dt = CUDNN_DATA_FLOAT) {
  return {static_cast<std::int64_t>(op),
          g.n,
          g.h,
          g.w,
          g.c,
          g.k,
          g.r,
          g.s,
          g.ho,
          g.wo,
          g.stride.h,
          g.stride.w,
          g.pad.h,
          g.pad.w,
          g.dil.h,
          g.dil.w,
          static_cast<std::int64_t>(p),
          find ? 1 : 0,
          deterministic ? 1 : 0,
          device,
          static_cast<std::int64_t>(dt)};
}

struct Plan {
  Descriptors d;
  AlgoChoice algo;             // algo -1: cuDNN offered none acceptable
  std::size_t candidates = 0;  // how many it offered
  Plan(const ConvGeometry& g, Precision p, cudnnDataType_t dt) : d(g, p, dt) {}
};

namespace detail {

inline std::string geometry_text(const ConvGeometry& g) {
  return ddp::detail::str("x (", g.n, ", ", g.h, ", ", g.w, ", ", g.c, ") NHWC, weight (", g.k,
                          ", ", g.r, ", ", g.s, ", ", g.c, ") KRSC, stride ", g.stride.h, "x",
                          g.stride.w, ", padding ", g.pad.h, "x", g.pad.w, ", dilation ", g.dil.h,
                          "x", g.dil.w);
}

// max_count(h, &n) sizes cuDNN's list, query(n, &got, perf) fills it.
template <class Perf, class MaxCount, class Query>
std::vector<AlgoChoice> list_of(cudnnHandle_t h, MaxCount max_count, Query query) {
  int count = 0, got = 0;
  DDP_CUDNN_CHECK(max_count(h, &count));
  std::vector<Perf> perf(static_cast<std::size_t>(std::max(count, 1)));
  DDP_CUDNN_CHECK(query(count, &got, perf.data()));
  std::vector<AlgoChoice> out;
  for (int i = 0; i < got; ++i) out.push_back(to_choice(perf[static_cast<std::size_t>(i)]));
  return out;
}

// Ranked by heuristics (find false) or timed runs (find true; cuDNN allocates its own scratch).
inline std::vector<AlgoChoice> ranked(cudnnHandle_t h, Op op, const Descriptors& d, bool find) {
  const auto x = d.x.get(), y = d.y.get();
  const auto w = d.w.get();
  const auto c = d.conv.get();
  switch (op) {
    case Op::Forward:
      return list_of<cudnnConvolutionFwdAlgoPerf_t>(
          h, cudnnGetConvolutionForwardAlgorithmMaxCount,
          [&](int n, int* got, cudnnConvolutionFwdAlgoPerf_t* p) {
            return find ? cudnnFindConvolutionForwardAlgorithm(h, x, w, c, y, n, got, p)
                        : cudnnGetConvolutionForwardAlgorithm_v7(h, x, w, c, y, n, got, p);
          });
    case Op::BackwardData:
      return list_of<cudnnConvolutionBwdDataAlgoPerf_t>(
          h, cudnnGetConvolutionBackwardDataAlgorithmMaxCount,
          [&](int n, int* got, cudnnConvolutionBwdDataAlgoPerf_t* p) {
            return find ? cudnnFindConvolutionBackwardDataAlgorithm(h, w, y, c, x, n, got, p)
                        : cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w, y, c, x, n, got, p);
          });
    case Op::BackwardFilter:
      return list_of<cudnnConvolutionBwdFilterAlgoPerf_t>(
          h, cudnnGetConvolutionBackwardFilterAlgorithmMaxCount,
          [&](int n, int* got, cudnnConvolutionBwdFilterAlgoPerf_t* p) {
            return find ? cudnnFindConvolutionBackwardFilterAlgorithm(h, x, y, c, w, n, got, p)
                        : cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x, y, c, w, n, got, p);
          });
  }
  return {};
}

}  // namespace detail

// This thread's plan for (op, g, dt) on h's device, made on first use and kept, also when no
// algorithm is acceptable (then algo.algo is -1).
inline const Plan& find_plan(const Exec<Cuda>& e, cudnnHandle_t h, Op op, const ConvGeometry& g,
                             int device, cudnnDataType_t dt) {
  thread_local std::map<PlanKey, std::unique_ptr<Plan>> plans;
  const bool find = e.conv == ConvImpl::CudnnFind;
  const Precision precision = plan_precision(e.precision, dt);
  std::unique_ptr<Plan>& slot =
      plans[plan_key(op, g, precision, find, e.deterministic, device, dt)];
  if (slot) return *slot;
  auto p = std::make_unique<Plan>(g, precision, dt);
  const std::vector<AlgoChoice> list = detail::ranked(h, op, p->d, find);
  p->algo = choose(list, precision, e.deterministic);
  p->candidates = list.size();
  // The math type the algorithm was ranked under (cuDNN's advice for the _v7 and Find lists).
  if (p->algo.algo >= 0)
    DDP_CUDNN_CHECK(cudnnSetConvolutionMathType(p->d.conv.get(), p->algo.math));
  slot = std::move(p);
  return *slot;
}

// The same, throwing when there is no acceptable algorithm.
inline const Plan& plan(const Exec<Cuda>& e, cudnnHandle_t h, Op op, const ConvGeometry& g,
                        int device, cudnnDataType_t dt = CUDNN_DATA_FLOAT) {
  const Plan& p = find_plan(e, h, op, g, device, dt);
  const Precision precision = plan_precision(e.precision, dt);
  if (p.algo.algo < 0)
    throw CudaError(ddp::detail::str(
        "ddp: cuDNN ", cudnnGetVersion(), " offers no ", op_name(op), " algorithm for conv2d with ",
        detail::geometry_text(g), dt == CUDNN_DATA_BFLOAT16 ? " on bf16 tensors" : "",
        " at precision ", precision_name(precision), e.deterministic ? ", deterministic" : "",
        " and a workspace of at most ", kMaxWorkspaceBytes >> 20, " MiB (", p.candidates,
        " candidates); --conv own runs ddp's own kernels"));
  return p;
}

// Whether op of conv g on type dt has an acceptable algorithm (makes and keeps the plan).
inline bool has_algorithm(const Exec<Cuda>& e, Op op, const ConvGeometry& g, cudnnDataType_t dt) {
  const int device = current_device();
  return find_plan(e, handle(e, device), op, g, device, dt).algo.algo >= 0;
}

// A workspace of `bytes` from ddp's caching allocator, reused in the order of e's stream.
inline Tensor<float, Cuda> workspace(const Exec<Cuda>& e, std::size_t bytes) {
  if (bytes == 0) return {};
  const CudaAllocStream on_stream(e);
  return Tensor<float, Cuda>(
      Shape{static_cast<std::int64_t>((bytes + sizeof(float) - 1) / sizeof(float))});
}

// call(handle, plan, workspace) issues the cuDNN call with the plan's algorithm.
template <class Call>
void run(const Exec<Cuda>& e, Op op, const ConvGeometry& g, cudnnDataType_t dt, Call&& call) {
  const int device = current_device();
  const cudnnHandle_t h = handle(e, device);
  const Plan& p = plan(e, h, op, g, device, dt);
  Tensor<float, Cuda> ws = workspace(e, p.algo.workspace);
  call(h, p, static_cast<void*>(ws.data()));
}

// cuDNN's alpha and beta (y = alpha op(...) + beta y)
inline constexpr float kOne = 1.f, kZero = 0.f;

// y = conv(x, w) (+ bias when bias != nullptr; fp32 tensors only: cudnnAddTensor adds in y's type).
// E: float, or bfloat16 with w the bf16 copy of the weight.
template <class E>
void forward(const Exec<Cuda>& e, const ConvGeometry& g, const E* x, const E* w, const float* bias,
             E* y) {
  run(e, Op::Forward, g, data_type<E>, [&](cudnnHandle_t h, const Plan& p, void* ws) {
    DDP_CUDNN_CHECK(cudnnConvolutionForward(h, &kOne, p.d.x.get(), x, p.d.w.get(), w,
                                            p.d.conv.get(),
                                            static_cast<cudnnConvolutionFwdAlgo_t>(p.algo.algo), ws,
                                            p.algo.workspace, &kZero, p.d.y.get(), y));
    if (bias)
      DDP_CUDNN_CHECK(cudnnAddTensor(h, &kOne, p.d.bias.get(), bias, &kOne, p.d.y.get(), y));
  });
}

// dx = conv's gradient with respect to x, from dy and w; with `accumulate`, dx += it (beta = 1:
// cuDNN blends in its float compute type and stores once).
template <class E>
void backward_data(const Exec<Cuda>& e, const ConvGeometry& g, const E* dy, const E* w, E* dx,
                   bool accumulate = false) {
  run(e, Op::BackwardData, g, data_type<E>, [&](cudnnHandle_t h, const Plan& p, void* ws) {
    DDP_CUDNN_CHECK(cudnnConvolutionBackwardData(
        h, &kOne, p.d.w.get(), w, p.d.y.get(), dy, p.d.conv.get(),
        static_cast<cudnnConvolutionBwdDataAlgo_t>(p.algo.algo), ws, p.algo.workspace,
        accumulate ? &kOne : &kZero, p.d.x.get(), dx));
  });
}

// dw = d conv / d w from x and dy, of x's type (overwritten, not accumulated).
template <class E>
void backward_filter(const Exec<Cuda>& e, const ConvGeometry& g, const E* x, const E* dy, E* dw) {
  run(e, Op::BackwardFilter, g, data_type<E>, [&](cudnnHandle_t h, const Plan& p, void* ws) {
    DDP_CUDNN_CHECK(
        cudnnConvolutionBackwardFilter(h, &kOne, p.d.x.get(), x, p.d.y.get(), dy, p.d.conv.get(),
                                       static_cast<cudnnConvolutionBwdFilterAlgo_t>(p.algo.algo),
                                       ws, p.algo.workspace, &kZero, p.d.w.get(), dw));
  });
}

}  // namespace ddp::kernels::cuda::cudnn
