// GPU smoke test: the CUDA runtime works and a templated kernel from a .cu file runs.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <ddp/ddp.hpp>
#include <vector>

#include "support/gpu.hpp"

template <class T>
__global__ void add_one_kernel(T* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += T(1);
}

TEST_CASE("gpu: a kernel runs and its result comes back") {
  if (ddp::test::skip_without_gpu()) return;
  const int n = 1000;
  std::vector<float> host(n, 41.0f);
  float* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemcpy(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  add_one_kernel<float><<<(n + 255) / 256, 256>>>(dev, n);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaMemcpy(host.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  cudaFree(dev);
  for (float v : host) CHECK(v == 42.0f);
}
