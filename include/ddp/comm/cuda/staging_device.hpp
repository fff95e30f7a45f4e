// CudaStagingDevice: the CUDA runtime side of StagedCommunicator (comm/staging/staged_communicator.hpp), and
// make_staged_cuda, which wraps a host-memory communicator for device tensors on one GPU. Host API only:
// compiled by any C++ compiler against cudart, no nvcc needed.
// SPDX-License-Identifier: MIT
//
//   auto host = std::make_unique<ddp::comm::TcpCommunicator>(info, store, opts);
//   auto comm = ddp::comm::make_staged_cuda(std::move(host), /*device=*/info.local_rank, opts);
//   comm->all_reduce(d_grad.view(), {.op = ReduceOp::Avg, .stream = exec.stream});   // as with nccl
// make_communicator (comm/factory.hpp) does this for tcp/gloo and mpi when CommOptions::cuda_device >= 0.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

#include "ddp/comm/checks.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/comm/cuda/device_guard.hpp"
#include "ddp/comm/staging/staged_communicator.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/core/cuda_check.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/tensor/cuda/pinned.hpp"

namespace ddp::comm {

// The device ops StagedCommunicator needs, on CUDA device `device` (see that file for the contract).
class CudaStagingDevice {
 public:
  using Event = cudaEvent_t;
  using Pinned = PinnedBuffer<std::byte>;  // cudaMallocHost'd, freed with cudaFreeHost

  explicit CudaStagingDevice(int device) : device_(device) {}
  int device() const noexcept { return device_; }

  Pinned alloc_pinned(std::size_t bytes) {
    CudaDeviceGuard g(device_);
    return Pinned(bytes);
  }
  Event create_event() {
    CudaDeviceGuard g(device_);
    cudaEvent_t e = nullptr;
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void destroy_event(Event e) noexcept { DDP_CUDA_CHECK_NOTHROW(cudaEventDestroy(e)); }
  void copy_to_host(void* host, const void* dev, std::size_t bytes, void* stream) {
    DDP_CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream)));
  }
  void copy_to_device(void* dev, const void* host, std::size_t bytes, void* stream) {
    DDP_CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)));
  }
  void record(Event e, void* stream) { DDP_CUDA_CHECK(cudaEventRecord(e, static_cast<cudaStream_t>(stream))); }
  bool query(Event e) {
    const cudaError_t r = cudaEventQuery(e);
    if (r == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not sticky: keep it from being reported by the next call
      return false;
    }
    DDP_CUDA_CHECK(r);
    return true;
  }
  // The stream's later work waits until the gate opens: a host function that waits, calling no CUDA API.
  void hold(void* stream, staging::Gate& gate) {
    DDP_CUDA_CHECK(cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), &staging::Gate::wait_fn, &gate));
  }
  void bind_thread() { DDP_CUDA_CHECK(cudaSetDevice(device_)); }

  // `device` if this process can use it, else a ConfigError naming what to check.
  static int usable(int device, int rank, int size, std::string_view backend) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      n = 0;
    }
    if (device < 0 || device >= n)
      throw ConfigError(ddp::detail::str(who(rank, size), ": --backend ", backend, " with CUDA tensors needs CUDA device ",
                                         device, ", but ", n, " device(s) are visible; check CUDA_VISIBLE_DEVICES "
                                         "and the device chosen for this rank (CommOptions::cuda_device)."));
    return device;
  }

 private:
  int device_;
};

static_assert(staging::DeviceOps<CudaStagingDevice>);

using CudaStagedCommunicator = StagedCommunicator<CudaStagingDevice>;

// `host` (tcp or mpi, owned from now on) staged for device tensors on CUDA device `device`. ConfigError
// if the device is not visible or `host` reaches device memory itself.
inline std::unique_ptr<Communicator> make_staged_cuda(std::unique_ptr<Communicator> host, int device,
                                                      const CommOptions& opts = {}) {
  if (!host) throw ConfigError("ddp: make_staged_cuda needs a communicator to wrap, got nullptr");
  CudaStagingDevice dev(CudaStagingDevice::usable(device, host->rank(), host->size(), host->backend()));
  return std::make_unique<CudaStagedCommunicator>(std::move(host), dev, opts);
}

}  // namespace ddp::comm
