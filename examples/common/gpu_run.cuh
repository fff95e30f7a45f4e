// run_on_gpu: how every example's train_cuda.cu starts its training loop on the GPU main.cpp chose.
// SPDX-License-Identifier: MIT
//
// The device made current, one blocking compute stream (it orders with the caching allocator's
// frees on the legacy default stream), Exec<Cuda> at the asked precision, the loop run with that
// exec, then a wait for the stream so that everything it queued has finished when the example
// returns. The log line names the device and precision.
#pragma once

#include <cuda_runtime.h>

#include <ddp/core/cuda_check.hpp>
#include <ddp/core/log.hpp>
#include <ddp/tensor/cuda/stream.hpp>
#include <ddp/tensor/precision.hpp>

namespace ddp_example {

// train(exec) -> int (the example's exit code). `note` is appended to the log line (e.g. "
// (deterministic)").
template <class Train>
int run_on_gpu(int device, ddp::Precision precision, bool deterministic, const char* note,
               Train&& train) {
  DDP_CUDA_CHECK(cudaSetDevice(device));
  ddp::Stream stream;
  ddp::Exec<ddp::Cuda> exec = stream.exec(precision, deterministic);
  DDP_LOG_INFO("training on cuda:", device, " at precision ", ddp::precision_name(precision), note);
  const int rc = train(exec);
  stream.synchronize();
  return rc;
}

}  // namespace ddp_example
