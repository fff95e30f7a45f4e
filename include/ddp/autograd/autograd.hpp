// Reverse-mode autodiff over ddp's tensors: Var<T, D> and the tape (var.hpp), differentiable ops
// (ops.hpp).
// SPDX-License-Identifier: MIT
//
// The layer sits above kernels/ and tensor/ and below nn/: write a model's forward with ops, call
// backward() on the scalar loss, read each leaf's grad() (or let Var::parameter hand it to an
// nn::Parameter). See docs/decisions/0071 and docs/GUIDE.md, "Writing forward with ops (autograd)".
#pragma once

#include "ddp/autograd/ops.hpp"
#include "ddp/autograd/var.hpp"
