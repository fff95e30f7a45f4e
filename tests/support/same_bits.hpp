// Bitwise equality of two host tensors: the determinism and same-result checks.
// SPDX-License-Identifier: MIT
#pragma once

#include <cstring>

#include <ddp/tensor/tensor.hpp>

namespace ddp::test {

// Same shape and the same bytes. An empty tensor (a ResNet's dx: the stem computes none) has null data, and memcmp
// with a null pointer is undefined even for 0 bytes (UBSan reports it), so sizes are compared first.
template <class T>
bool same_bits(const Tensor<T, Cpu>& a, const Tensor<T, Cpu>& b) {
  return a.shape() == b.shape() && (a.bytes() == 0 || std::memcmp(a.data(), b.data(), a.bytes()) == 0);
}

}  // namespace ddp::test
