// kernels/cuda/cudnn_conv.hpp without a GPU. cuDNN's descriptor calls are host code, so cuDNN itself is the outside
// reference here: for each geometry, the output size it derives from our descriptors must be conv_out_size's, and
// the strides it reports must be those of our NHWC activations and KRSC weights. The algorithm choice, the
// describable() bounds, the plan keys and the error texts are checked directly. GPU cases (numerics against the
// CPU) live in tests/unit/kernels/test_cuda_kernels.cu.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <ddp/kernels/args.hpp>
#include <ddp/kernels/cuda/cudnn_conv.hpp>
#include <ddp/kernels/geometry.hpp>
#include <ddp/tensor/conv_impl.hpp>


namespace {

namespace dnn = ddp::kernels::cuda::cudnn;
using ddp::Precision;
using ddp::kernels::ConvGeometry;
using ddp::kernels::Size2;

ConvGeometry geometry(std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c, std::int64_t k, std::int64_t r,
                      std::int64_t s, Size2 stride, Size2 pad, Size2 dil) {
  return {.n = n, .h = h, .w = w, .c = c, .k = k, .r = r, .s = s,
          .ho = ddp::kernels::conv_out_size(h, r, stride.h, pad.h, dil.h),
          .wo = ddp::kernels::conv_out_size(w, s, stride.w, pad.w, dil.w), .stride = stride, .pad = pad, .dil = dil};
}

// ResNet's conv shapes and the awkward ones of test_cuda_kernels.cu's conv case.
std::vector<ConvGeometry> geometries() {
  return {
      geometry(16, 224, 224, 3, 64, 7, 7, {2, 2}, {3, 3}, {1, 1}),   // stem
      geometry(16, 56, 56, 64, 64, 3, 3, {1, 1}, {1, 1}, {1, 1}),    // layer1 3x3
      geometry(16, 56, 56, 128, 128, 3, 3, {2, 2}, {1, 1}, {1, 1}),  // layer2's first 3x3, stride 2
      geometry(16, 56, 56, 256, 512, 1, 1, {2, 2}, {0, 0}, {1, 1}),  // downsample 1x1 stride 2
      geometry(2, 9, 11, 5, 7, 3, 3, {1, 1}, {1, 1}, {1, 1}),
      geometry(3, 17, 15, 3, 70, 7, 7, {2, 2}, {3, 3}, {1, 1}),
      geometry(1, 12, 13, 6, 9, 3, 3, {2, 1}, {2, 1}, {2, 1}),       // dilation, asymmetric stride and padding
      geometry(2, 8, 8, 4, 4, 5, 3, {3, 2}, {0, 2}, {1, 3}),
  };
}

dnn::AlgoChoice choice(int algo, cudnnStatus_t status, std::size_t ws, bool det, cudnnMathType_t math) {
  return {.algo = algo, .status = status, .workspace = ws, .deterministic = det, .math = math};
}

}  // namespace

TEST_SUITE("cudnn_host") {
  TEST_CASE("cuDNN derives our output size from our descriptors for every geometry") {
    for (const ConvGeometry& g : geometries()) {
      INFO("n", g.n, " h", g.h, " w", g.w, " c", g.c, " k", g.k, " r", g.r, " s", g.s, " stride ", g.stride.h, "x",
           g.stride.w, " pad ", g.pad.h, "x", g.pad.w, " dil ", g.dil.h, "x", g.dil.w);
      REQUIRE(dnn::describable(g));
      const dnn::Descriptors d(g, Precision::Tf32);
      int n = 0, k = 0, ho = 0, wo = 0;
      REQUIRE(cudnnGetConvolution2dForwardOutputDim(d.conv.get(), d.x.get(), d.w.get(), &n, &k, &ho, &wo) ==
              CUDNN_STATUS_SUCCESS);
      CHECK(n == g.n);
      CHECK(k == g.k);
      CHECK(ho == g.ho);
      CHECK(wo == g.wo);
    }
  }

  TEST_CASE("the descriptors lay x and y out as NHWC and the weight as KRSC, in fp32") {
    const ConvGeometry g = geometry(3, 17, 15, 5, 70, 7, 5, {2, 2}, {3, 2}, {1, 1});
    const dnn::Descriptors d(g, Precision::Fp32);
    auto check_nhwc = [](cudnnTensorDescriptor_t t, std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c) {
      cudnnDataType_t type{};
      int dims[4] = {}, strides[4] = {};  // cuDNN reports N, C, H, W order
      REQUIRE(cudnnGetTensor4dDescriptor(t, &type, &dims[0], &dims[1], &dims[2], &dims[3], &strides[0], &strides[1],
                                         &strides[2], &strides[3]) == CUDNN_STATUS_SUCCESS);
      CHECK(type == CUDNN_DATA_FLOAT);
      CHECK(dims[0] == n);
      CHECK(dims[1] == c);
      CHECK(dims[2] == h);
      CHECK(dims[3] == w);
      CHECK(strides[0] == h * w * c);  // our x[((img * h + hi) * w + wi) * c + ch]
      CHECK(strides[1] == 1);
      CHECK(strides[2] == w * c);
      CHECK(strides[3] == c);
    };
    check_nhwc(d.x.get(), g.n, g.h, g.w, g.c);
    check_nhwc(d.y.get(), g.n, g.ho, g.wo, g.k);
    check_nhwc(d.bias.get(), 1, 1, 1, g.k);

    cudnnDataType_t type{};
    cudnnTensorFormat_t format{};
    int k = 0, c = 0, r = 0, s = 0;
    REQUIRE(cudnnGetFilter4dDescriptor(d.w.get(), &type, &format, &k, &c, &r, &s) == CUDNN_STATUS_SUCCESS);
    CHECK(type == CUDNN_DATA_FLOAT);
    CHECK(format == CUDNN_TENSOR_NHWC);  // for filters: K, R, S, C in memory, our weight layout
    CHECK(k == g.k);
    CHECK(c == g.c);
    CHECK(r == g.r);
    CHECK(s == g.s);

    int ph = 0, pw = 0, sh = 0, sw = 0, dh = 0, dw = 0;
    cudnnConvolutionMode_t mode{};
    cudnnDataType_t compute{};
    REQUIRE(cudnnGetConvolution2dDescriptor(d.conv.get(), &ph, &pw, &sh, &sw, &dh, &dw, &mode, &compute) ==
            CUDNN_STATUS_SUCCESS);
    CHECK((ph == 3 && pw == 2 && sh == 2 && sw == 2 && dh == 1 && dw == 1));
    CHECK(mode == CUDNN_CROSS_CORRELATION);  // no kernel flip, as the CPU kernel
    CHECK(compute == CUDNN_DATA_FLOAT);      // fp32 accumulation at every precision
  }

  TEST_CASE("the descriptor's math type follows the precision; fp16 is refused as by ddp's kernels") {
    const ConvGeometry g = geometries()[1];
    for (const auto& [p, want] : {std::pair{Precision::Fp32, CUDNN_FMA_MATH}, std::pair{Precision::Tf32, CUDNN_TENSOR_OP_MATH},
                                  std::pair{Precision::Bf16, CUDNN_TENSOR_OP_MATH}}) {
      const dnn::Descriptors d(g, p);
      cudnnMathType_t m{};
      REQUIRE(cudnnGetConvolutionMathType(d.conv.get(), &m) == CUDNN_STATUS_SUCCESS);
      CHECK(m == want);
    }
    CHECK_THROWS_WITH_AS(dnn::Descriptors(g, Precision::Fp16),
                         "ddp: conv2d: fp16 arithmetic is not implemented for convolutions; use bf16 or tf32 "
                         "(--precision)",
                         ddp::ValueError);
  }

  TEST_CASE("choose takes cuDNN's first acceptable algorithm") {
    constexpr auto ok = CUDNN_STATUS_SUCCESS;
    const std::vector<dnn::AlgoChoice> list = {
        choice(6, CUDNN_STATUS_NOT_SUPPORTED, 0, true, CUDNN_TENSOR_OP_MATH),      // not supported for this shape
        choice(5, ok, std::size_t{3} << 30, true, CUDNN_TENSOR_OP_MATH),          // workspace over the cap
        choice(4, ok, 1 << 20, false, CUDNN_TENSOR_OP_MATH),                      // fast, not deterministic
        choice(3, ok, 1 << 20, true, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION),      // fp32 -> fp16 conversion
        choice(2, ok, 1 << 10, true, CUDNN_DEFAULT_MATH),
        choice(1, ok, 0, true, CUDNN_FMA_MATH),
    };
    CHECK(dnn::choose(list, Precision::Tf32, false).algo == 4);
    CHECK(dnn::choose(list, Precision::Bf16, false).algo == 4);
    CHECK(dnn::choose(list, Precision::Tf32, true).algo == 2);   // deterministic: skips 4; never 3
    CHECK(dnn::choose(list, Precision::Fp32, false).algo == 1);  // fp32: FMA math only (DEFAULT may use TF32)
    CHECK(dnn::choose(list, Precision::Tf32, false, std::size_t{4} << 30).algo == 5);  // a larger cap takes 5
    CHECK(dnn::choose(list, Precision::Tf32, true, 0).algo == 1);  // no workspace allowed
    CHECK(dnn::choose({}, Precision::Tf32, false).algo == -1);
    const std::vector<dnn::AlgoChoice> none = {choice(0, CUDNN_STATUS_ALLOC_FAILED, 0, true, CUDNN_FMA_MATH)};
    CHECK(dnn::choose(none, Precision::Fp32, false).algo == -1);  // Find's entries that could not allocate
  }

  TEST_CASE("to_choice reads each of cuDNN's three perf structs alike") {
    cudnnConvolutionBwdFilterAlgoPerf_t p{};
    p.algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
    p.status = CUDNN_STATUS_SUCCESS;
    p.time = 0.25f;
    p.memory = 4096;
    p.determinism = CUDNN_DETERMINISTIC;
    p.mathType = CUDNN_TENSOR_OP_MATH;
    const dnn::AlgoChoice a = dnn::to_choice(p);
    CHECK(a.algo == 1);
    CHECK(a.time_ms == 0.25f);
    CHECK(a.workspace == 4096);
    CHECK(a.deterministic);
    CHECK(a.math == CUDNN_TENSOR_OP_MATH);
    cudnnConvolutionFwdAlgoPerf_t f{};
    f.determinism = CUDNN_NON_DETERMINISTIC;
    CHECK_FALSE(dnn::to_choice(f).deterministic);
  }

  TEST_CASE("describable: cuDNN's int descriptors hold every size below 2^31, else ddp's kernels run") {
    CHECK(dnn::describable(geometry(256, 224, 224, 3, 64, 7, 7, {2, 2}, {3, 3}, {1, 1})));
    // 256 x 112 x 112 x 1024 = 3.3e9 output elements: past int.
    CHECK_FALSE(dnn::describable(geometry(256, 112, 112, 64, 1024, 1, 1, {1, 1}, {0, 0}, {1, 1})));
    ConvGeometry g = geometries()[1];
    g.n = std::int64_t{INT_MAX} + 1;
    CHECK_FALSE(dnn::describable(g));
    g = geometries()[1];
    g.k = 46341;  // k * r * s * c = 46341 * 9 * 64 > 2^31 - 1 in the weight alone
    CHECK_FALSE(dnn::describable(g));
  }

  TEST_CASE("bf16 activations: x, y and the weight in bf16, the bias and the arithmetic in fp32, at Bf16 precision") {
    const ConvGeometry g = geometries()[1];
    CHECK(dnn::data_type<float> == CUDNN_DATA_FLOAT);
    CHECK(dnn::data_type<ddp::bfloat16> == CUDNN_DATA_BFLOAT16);
    for (const Precision p : {Precision::Fp32, Precision::Tf32, Precision::Bf16}) {
      CHECK(dnn::plan_precision(p, CUDNN_DATA_BFLOAT16) == Precision::Bf16);  // the operands are bf16 already
      CHECK(dnn::plan_precision(p, CUDNN_DATA_FLOAT) == p);
    }
    const dnn::Descriptors d(g, Precision::Bf16, CUDNN_DATA_BFLOAT16);
    const auto tensor_type = [](cudnnTensorDescriptor_t t) {
      cudnnDataType_t type{};
      int v[8] = {};
      REQUIRE(cudnnGetTensor4dDescriptor(t, &type, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) ==
              CUDNN_STATUS_SUCCESS);
      return type;
    };
    CHECK(tensor_type(d.x.get()) == CUDNN_DATA_BFLOAT16);
    CHECK(tensor_type(d.y.get()) == CUDNN_DATA_BFLOAT16);
    CHECK(tensor_type(d.bias.get()) == CUDNN_DATA_FLOAT);
    cudnnDataType_t wtype{};
    cudnnTensorFormat_t format{};
    int k = 0, c = 0, r = 0, s = 0;
    REQUIRE(cudnnGetFilter4dDescriptor(d.w.get(), &wtype, &format, &k, &c, &r, &s) == CUDNN_STATUS_SUCCESS);
    CHECK(wtype == CUDNN_DATA_BFLOAT16);
    CHECK(format == CUDNN_TENSOR_NHWC);
    int ph = 0, pw = 0, sh = 0, sw = 0, dh = 0, dw = 0;
    cudnnConvolutionMode_t mode{};
    cudnnDataType_t compute{};
    REQUIRE(cudnnGetConvolution2dDescriptor(d.conv.get(), &ph, &pw, &sh, &sw, &dh, &dw, &mode, &compute) ==
            CUDNN_STATUS_SUCCESS);
    CHECK(compute == CUDNN_DATA_FLOAT);
    cudnnMathType_t m{};
    REQUIRE(cudnnGetConvolutionMathType(d.conv.get(), &m) == CUDNN_STATUS_SUCCESS);
    CHECK(m == CUDNN_TENSOR_OP_MATH);
  }

  TEST_CASE("plan keys tell apart every field a plan depends on") {
    const ConvGeometry g = geometries()[2];
    std::set<dnn::PlanKey> keys;
    keys.insert(dnn::plan_key(dnn::Op::Forward, g, Precision::Tf32, false, false, 0));
    keys.insert(dnn::plan_key(dnn::Op::BackwardData, g, Precision::Tf32, false, false, 0));
    keys.insert(dnn::plan_key(dnn::Op::BackwardFilter, g, Precision::Tf32, false, false, 0));
    keys.insert(dnn::plan_key(dnn::Op::Forward, g, Precision::Fp32, false, false, 0));
    keys.insert(dnn::plan_key(dnn::Op::Forward, g, Precision::Tf32, true, false, 0));
    keys.insert(dnn::plan_key(dnn::Op::Forward, g, Precision::Tf32, false, true, 0));
    keys.insert(dnn::plan_key(dnn::Op::Forward, g, Precision::Tf32, false, false, 1));
    keys.insert(dnn::plan_key(dnn::Op::Forward, g, Precision::Tf32, false, false, 0, CUDNN_DATA_BFLOAT16));
    for (auto field : {&ConvGeometry::n, &ConvGeometry::h, &ConvGeometry::w, &ConvGeometry::c, &ConvGeometry::k,
                       &ConvGeometry::r, &ConvGeometry::s, &ConvGeometry::ho, &ConvGeometry::wo}) {
      ConvGeometry h = g;
      h.*field += 1;
      keys.insert(dnn::plan_key(dnn::Op::Forward, h, Precision::Tf32, false, false, 0));
    }
    for (auto field : {&ConvGeometry::stride, &ConvGeometry::pad, &ConvGeometry::dil}) {
      ConvGeometry h = g, v = g;
      (h.*field).h += 1;
      (v.*field).w += 1;
      keys.insert(dnn::plan_key(dnn::Op::Forward, h, Precision::Tf32, false, false, 0));
      keys.insert(dnn::plan_key(dnn::Op::Forward, v, Precision::Tf32, false, false, 0));
    }
    CHECK(keys.size() == 8 + 9 + 6);
    CHECK(dnn::plan_key(dnn::Op::Forward, g, Precision::Tf32, false, false, 0) ==
          dnn::plan_key(dnn::Op::Forward, geometries()[2], Precision::Tf32, false, false, 0));
  }

  TEST_CASE("DDP_CUDNN_CHECK throws CudaError with cuDNN's status text and the place") {
    try {
      DDP_CUDNN_CHECK(CUDNN_STATUS_BAD_PARAM);
      FAIL("no throw");
    } catch (const ddp::CudaError& e) {
      const std::string w = e.what();
      CHECK(w.rfind("ddp: CUDNN_STATUS_BAD_PARAM failed: CUDNN_STATUS_BAD_PARAM", 0) == 0);
      CHECK(w.find("test_cudnn_host.cpp:") != std::string::npos);
    }
  }

  TEST_CASE("a program built with cuDNN takes every --conv mode, and auto means cuDNN") {
    CHECK(ddp::resolve_conv_impl(ddp::ConvImpl::Auto) == ddp::ConvImpl::Cudnn);
    for (ddp::ConvImpl c : {ddp::ConvImpl::Own, ddp::ConvImpl::Cudnn, ddp::ConvImpl::CudnnFind})
      CHECK(ddp::resolve_conv_impl(c) == c);
  }

  TEST_CASE("without a GPU the handle is an error, not a crash") {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) return;  // unit_kernels_cuda runs the real thing
    CHECK_THROWS_AS(dnn::handle(ddp::Exec<ddp::Cuda>{}), ddp::CudaError);
    // The ops reach the handle before touching any pointer.
    CHECK_THROWS_AS(dnn::forward<float>(ddp::Exec<ddp::Cuda>{}, geometries()[1], nullptr, nullptr, nullptr, nullptr),
                    ddp::CudaError);
    CHECK_THROWS_AS(dnn::backward_filter<float>(ddp::Exec<ddp::Cuda>{}, geometries()[1], nullptr, nullptr, nullptr),
                    ddp::CudaError);
    CHECK_THROWS_AS(dnn::has_algorithm(ddp::Exec<ddp::Cuda>{}, dnn::Op::Forward, geometries()[1], CUDNN_DATA_BFLOAT16),
                    ddp::CudaError);
  }
}
