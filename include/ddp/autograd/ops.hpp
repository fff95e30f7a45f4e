// Differentiable ops on Var<T, D> (autograd/var.hpp): each computes its value with Kernels<D>
// (existing kernels, or the functors of kernels/broadcast.hpp through Kernels<D>::for_each_index)
// and records its backward.
// SPDX-License-Identifier: MIT
//
// Semantics follow PyTorch's: binary element-wise ops broadcast numpy-style (a (3, 1) and b (4,)
// give (3, 4); the gradient of a broadcast operand sums over the dimensions it was expanded along);
// dims may be negative; linear's weight is (out, in). Errors name the op and both shapes. Shapes
// have rank <= 5 (Shape::kMaxRank). The one device-specific piece is matmul's GEMM
// (detail::Gemm<D>: kernels/cpu/gemm.hpp on the CPU, cuBLAS in autograd/cuda/gemm.cuh on the GPU).
// The ops live in one header per family (ops_*.hpp); this one includes them all.
#pragma once

#include "ddp/autograd/ops_conv.hpp"
#include "ddp/autograd/ops_core.hpp"
#include "ddp/autograd/ops_elementwise.hpp"
#include "ddp/autograd/ops_loss.hpp"
#include "ddp/autograd/ops_matmul.hpp"
#include "ddp/autograd/ops_reduce.hpp"
#include "ddp/autograd/ops_shape.hpp"
#include "ddp/autograd/ops_transformer.hpp"
