// Kernels<D>: the one trait through which modules call every op on device D (primary template only).
// SPDX-License-Identifier: MIT
//
// Kernels<Cpu> (kernels/cpu/kernels.hpp) and Kernels<Cuda> (kernels/cuda/kernels.cuh, compiled by nvcc)
// list the same static members with the same Args structs (kernels/args.hpp), so a module is written
// once: `Kernels<D>::conv2d_forward(exec_, Conv2dForwardArgs<T, D>{...})`. Using a device whose
// specialisation was not included stops at the static_assert below with what to do.
#pragma once

#include "ddp/config.hpp"
#include "ddp/kernels/args.hpp"
#include "ddp/kernels/elementwise.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels {

template <Device D>
struct Kernels {
  static_assert(ddp::detail::dependent_false<D>,
                "ddp: Kernels<Cuda> is defined in <ddp/kernels/cuda/kernels.cuh>, which only nvcc compiles: put this "
                "code in a .cu file, include <ddp/ddp.hpp> (or that header) and link ddp::cuda. For CPU code include "
                "<ddp/kernels/cpu/kernels.hpp> and use Kernels<Cpu>.");
};

}  // namespace ddp::kernels

namespace ddp {
using kernels::Kernels;
}
