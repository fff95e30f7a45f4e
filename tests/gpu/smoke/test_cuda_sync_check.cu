// DDP_CUDA_SYNC_CHECK=1 on a GPU: a launch with an invalid configuration and a kernel that faults are each
// reported by the launch helper (kernels/cuda/launch.cuh) with the kernel's name (and functor) and the stream,
// at the launch instead of at some later synchronising call.
// SPDX-License-Identifier: MIT
//
// Its own executable (gpu_sync_check): the fault is sticky and ends this process's CUDA context, so it runs
// last, and compute-sanitizer (scripts/gpu_check.sh) is not pointed at it. The mode is read once per process:
// the variable is set before the first launch.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include <ddp/config.hpp>
#include <ddp/core/error.hpp>
#include <ddp/kernels/cuda/launch.cuh>
#include <ddp/tensor/cuda/stream.hpp>

#include "support/gpu.hpp"

namespace {

struct ProbeWrite {  // p[i] = 1
  float* p;
  DDP_HOST_DEVICE void operator()(std::size_t i) const { p[i] = 1.0f; }
};

std::string what_of(const auto& f) {
  try {
    f();
  } catch (const ddp::CudaError& e) {
    return e.what();
  }
  return "(no CudaError)";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_SUITE("gpu_sync_check") {
  TEST_CASE("type_name names a functor for the launch errors (host only)") {
    const std::string name(ddp::kernels::cuda::type_name<ProbeWrite>());
    INFO(name);
    CHECK(name.ends_with("ProbeWrite"));  // "(anonymous namespace)::ProbeWrite" or similar
    CHECK_FALSE(has(name, "type_name"));
    CHECK(std::string(ddp::kernels::cuda::type_name<std::pair<int, float>>()) == "std::pair<int, float>");
  }

  TEST_CASE(
      "DDP_CUDA_SYNC_CHECK=1: a bad launch and a faulting kernel throw at their launch, naming kernel and stream") {
    if (ddp::test::skip_without_gpu()) return;
    REQUIRE(setenv("DDP_CUDA_SYNC_CHECK", "1", 1) == 0);
    REQUIRE(ddp::kernels::cuda::sync_check_enabled());
    namespace kc = ddp::kernels::cuda;
    ddp::Stream stream;
    const ddp::Exec<ddp::Cuda> exec = stream.exec();
    const std::string stream_text = kc::detail::stream_name(stream.get());
    constexpr std::size_t n = 1 << 20;
    float* dev = nullptr;
    REQUIRE(cudaMalloc(&dev, n * sizeof(float)) == cudaSuccess);

    // A correct launch passes the check.
    CHECK_NOTHROW(kc::for_each_index(exec, n, ProbeWrite{dev}));

    // An invalid configuration (2048 threads per block; the limit is 1024): not sticky.
    const std::string bad_launch = what_of([&] {
      kc::for_each_index_kernel<ProbeWrite><<<1, 2048, 0, stream.get()>>>(n, ProbeWrite{dev});
      kc::check_launch("for_each_index_kernel", stream.get(), kc::type_name<ProbeWrite>());
    });
    INFO(bad_launch);
    CHECK(has(bad_launch, "ddp: launch of kernel for_each_index_kernel<"));
    CHECK(has(bad_launch, "ProbeWrite"));
    CHECK(has(bad_launch, "on stream " + stream_text));
    // The runtime's own name for the error, whichever it gives: CUDA 13.0 on an H200 says
    // cudaErrorInvalidValue (first GPU run, 2026-11-27), earlier runtimes cudaErrorInvalidConfiguration.
    CHECK((has(bad_launch, "cudaErrorInvalidConfiguration") || has(bad_launch, "cudaErrorInvalidValue")));
    CHECK_NOTHROW(kc::for_each_index(exec, n, ProbeWrite{dev}));  // the context is still usable
    cudaFree(dev);

    // A write to an unmapped address faults inside the kernel; the launch helper's wait reports it. Sticky:
    // nothing on the GPU may follow in this process.
    const std::string fault =
        what_of([&] { kc::for_each_index(exec, n, ProbeWrite{reinterpret_cast<float*>(std::uintptr_t{16})}); });
    INFO(fault);
    CHECK(has(fault, "ddp: kernel for_each_index_kernel<"));
    CHECK(has(fault, "ProbeWrite"));
    CHECK(has(fault, "on stream " + stream_text));
    CHECK(has(fault, "cudaErrorIllegalAddress"));
    CHECK(has(fault, "found by DDP_CUDA_SYNC_CHECK=1"));
  }
}
