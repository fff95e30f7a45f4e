// Test support for tests/interop/torchvision_resnet: running the PyTorch side, layout conversion, relative-error comparison.
// SPDX-License-Identifier: MIT
#pragma once

#include <sys/wait.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include <ddp/tensor/tensor.hpp>
#include <ddp/train/safetensors.hpp>

namespace ddp::test {

// Runs `/usr/bin/python3 tests/interop/torchvision_resnet/resnet_reference.py <args>`; returns its exit code.
inline int run_reference(const std::string& args) {
  const std::string cmd = std::string(DDP_TEST_PYTHON) + " " + DDP_MODEL_TEST_DIR + "/resnet_reference.py " + args;
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}
// Exits the test program with 77 (ctest: skipped) when the reference script says torch is missing.
inline void run_reference_or_skip(const std::string& args) {
  const int code = run_reference(args);
  if (code == 77) {
    std::printf("SKIP: resnet_reference.py could not run (torch/torchvision missing)\n");
    std::fflush(stdout);
    std::exit(77);
  }
  if (code != 0) throw std::runtime_error("resnet_reference.py " + args + " failed with exit code " + std::to_string(code));
}

// ||a - b||_2 / ||b||_2 (0 when both are zero).
inline double rel_error(const float* a, const float* b, std::size_t n) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    num += d * d;
    den += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

// NCHW (N, C, H, W) -> NHWC tensor.
inline Tensor<float, Cpu> nchw_to_nhwc(const train::TensorEntry& e) {
  const auto v = e.as<float>();
  const std::int64_t n = e.shape[0], c = e.shape[1], h = e.shape[2], w = e.shape[3];
  Tensor<float, Cpu> out(Shape{n, h, w, c});
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t ch = 0; ch < c; ++ch)
      for (std::int64_t y = 0; y < h; ++y)
        for (std::int64_t x = 0; x < w; ++x)
          out.data()[((i * h + y) * w + x) * c + ch] = v[static_cast<std::size_t>(((i * c + ch) * h + y) * w + x)];
  return out;
}

}  // namespace ddp::test
