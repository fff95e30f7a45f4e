// StreamOrdered: the extra interface of a communicator whose device-memory collectives are ordered by CUDA
// streams instead of by the host (the nccl backend).
// SPDX-License-Identifier: MIT
//
// DistributedDataParallel on CUDA (parallel/cuda/reducer.cuh) finds it with dynamic_cast and uses it to
// keep the host out of the gradient path:
//   comm.set_caller_stream_handle(my_stream);       // the next op waits (on the GPU) for my_stream's work
//   Work w = comm.device_all_reduce(Buffer::of(span, MemoryKind::Cuda), {.op = ReduceOp::Avg});
//                                                    // returns at once; the op runs on op_stream_handle()
//   cudaEventRecord(ev, op_stream_handle()); cudaStreamWaitEvent(my_stream, ev)   // my_stream waits for it
// Streams travel as void* (cudaStream_t) so that this header needs no CUDA headers.
#pragma once

#include "ddp/comm/types.hpp"
#include "ddp/comm/work.hpp"

namespace ddp::comm {

class StreamOrdered {
 public:
  virtual ~StreamOrdered() = default;
  // Every later op waits, on the device, for the work enqueued so far on `stream` (a cudaStream_t).
  virtual void set_caller_stream_handle(void* stream) = 0;
  // The stream the ops run on, in issue order: an event recorded there right after an op is issued
  // completes when that op has.
  virtual void* op_stream_handle() const noexcept = 0;
  // The collectives on device memory (Buffer with MemoryKind::Cuda), as Communicator's span templates.
  virtual Work device_all_reduce(Buffer b, const AllreduceOptions& o) = 0;
  virtual Work device_broadcast(Buffer b, const BroadcastOptions& o) = 0;

 protected:
  StreamOrdered() = default;
  StreamOrdered(const StreamOrdered&) = default;
  StreamOrdered& operator=(const StreamOrdered&) = default;
};

}  // namespace ddp::comm
