// Reducer<T, D>: the gradient all-reduce engine behind DistributedDataParallel: the bucket schedule, written
// once (parallel/bucket_schedule.hpp), over the device's transport (parallel/transport.hpp for the CPU,
// parallel/cuda/transport.cuh for CUDA under nvcc).
// SPDX-License-Identifier: MIT
//
// Example: resnet18 (1000 classes, 62 parameters) with the default caps -> 3 buckets: {fc.bias, fc.weight}
// (2.0 MiB >= 1 MiB) is all-reduced while layer4 still runs backward, the next 12 tensors (27.5 MiB, within
// layer4) while layers 3..1 run, the last 48 (15.1 MiB) after conv1.
#pragma once

#include "ddp/parallel/bucket_schedule.hpp"
#include "ddp/parallel/transport.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::parallel {

// Constructed as Reducer<T, D>(parameters, ReducerOptions, communicator).
template <class T, Device D>
using Reducer = BucketSchedule<T, D, Transport<T, D>>;

}  // namespace ddp::parallel
