// CudaStagingDevice: the CUDA runtime side of StagedCommunicator
// (comm/staging/staged_communicator.hpp), and make_staged_cuda, which wraps a host-memory
// communicator for device tensors on one GPU. Host API only: compiled by any C++ compiler against
// cudart, no nvcc needed.
// SPDX-License-Identifier: MIT
//
//   auto host = std::make_unique<ddp::comm::TcpCommunicator>(info, store, opts);
//   auto comm = ddp::comm::make_staged_cuda(std::move(host), /*device=*/info.local_rank, opts);
//   comm->all_reduce(d_grad.view(), {.op = ReduceOp::Avg, .stream = exec.stream});   // as with
//     nccl
// make_communicator (comm/factory.hpp) does this for tcp/gloo and mpi when CommOptions::cuda_device
// >= 0.
#pragma once

// CUresult and the cuStreamWaitValue32 flags only: the function comes through cudart
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <string_view>

#include "ddp/comm/checks.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/comm/staging/staged_communicator.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/core/cuda_check.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/log.hpp"
#include "ddp/core/str.hpp"
#include "ddp/tensor/cuda/current_device.hpp"
#include "ddp/tensor/cuda/pinned.hpp"

namespace ddp::comm {

namespace detail {

// The gates' words: 32-bit slots in pinned pages (a stream waits on one with cuStreamWaitValue32),
// handed out once and freed with the device ops (after every gate that uses them), and the driver's
// cuStreamWaitValue32, found through cudaGetDriverEntryPointByVersion (no link against libcuda);
// null where there is none or where DDP_STAGING_MEMORY_WAIT=1 is not set.
class StagingWords {
 public:
  using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

  StagingWords() {
    if (!requested()) return;  // host functions, the verified hold (see staged_communicator.hpp)
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t r = cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000,
                                                           cudaEnableDefault, &found);
#else
    const cudaError_t r =
        cudaGetDriverEntryPoint("cuStreamWaitValue32", &fn, cudaEnableDefault, &found);
#endif
    if (r == cudaSuccess && found == cudaDriverEntryPointSuccess && fn) {
      wait_value32_.store(reinterpret_cast<WaitValue32>(fn));
      DDP_LOG_INFO(
          "staging: DDP_STAGING_MEMORY_WAIT=1: streams wait for staged ops with "
          "cuStreamWaitValue32");
    } else {
      (void)cudaGetLastError();
      DDP_LOG_WARN(
          "staging: DDP_STAGING_MEMORY_WAIT=1, but the driver offers no cuStreamWaitValue32; host "
          "functions hold the streams");
    }
  }
  // DDP_STAGING_MEMORY_WAIT=1 asks for memory waits (read once).
  static bool requested() {
    static const bool on = [] {
      const char* v = std::getenv("DDP_STAGING_MEMORY_WAIT");
      return v && std::string_view(v) == "1";
    }();
    return on;
  }
  WaitValue32 wait_value32() const noexcept { return wait_value32_.load(); }
  void disable() noexcept { wait_value32_.store(nullptr); }

  std::uint32_t* take(int device) {
    std::lock_guard lock(mu_);
    if (pages_.empty() || used_ == kPerPage) {
      CudaDeviceGuard g(device);
      pages_.emplace_back(kPerPage);
      used_ = 0;
    }
    return pages_.back().data() + used_++;
  }

 private:
  static constexpr std::size_t kPerPage = 4096 / sizeof(std::uint32_t);
  std::atomic<WaitValue32> wait_value32_{nullptr};
  std::mutex mu_;
  std::deque<PinnedBuffer<std::uint32_t>> pages_;  // deque: growing it moves no page
  std::size_t used_ = 0;
};

}  // namespace detail

// The device ops StagedCommunicator needs, on CUDA device `device` (see that file for the
// contract).
class CudaStagingDevice {
 public:
  using Event = cudaEvent_t;
  using Pinned = PinnedBuffer<std::byte>;  // cudaMallocHost'd, freed with cudaFreeHost

  explicit CudaStagingDevice(int device)
      : device_(device), words_(std::make_shared<detail::StagingWords>()) {}
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
    DDP_CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost,
                                   static_cast<cudaStream_t>(stream)));
  }
  void copy_to_device(void* dev, const void* host, std::size_t bytes, void* stream) {
    DDP_CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice,
                                   static_cast<cudaStream_t>(stream)));
  }
  void record(Event e, void* stream) {
    DDP_CUDA_CHECK(cudaEventRecord(e, static_cast<cudaStream_t>(stream)));
  }
  bool query(Event e) {
    const cudaError_t r = cudaEventQuery(e);
    if (r == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not sticky: keep it from being reported by the next call
      return false;
    }
    DDP_CUDA_CHECK(r);
    return true;
  }
  // The stream's later work waits until the gate opens: a host function that waits, calling no CUDA
  // API, or with DDP_STAGING_MEMORY_WAIT=1 a stream memory wait on the gate's word, which the
  // gate's open() writes (staged_communicator.hpp says why both exist).
  void hold(void* stream, staging::Gate& gate) {
    const auto s = static_cast<cudaStream_t>(stream);
    if (const auto wait_value = words_->wait_value32()) {
      if (!gate.word()) gate.attach(words_->take(device_));
      void* dev_word = nullptr;
      DDP_CUDA_CHECK(cudaHostGetDevicePointer(&dev_word, gate.word(), 0));
      const CUresult r = wait_value(s, reinterpret_cast<CUdeviceptr>(dev_word), gate.generation(),
                                    CU_STREAM_WAIT_VALUE_GEQ);
      if (r == CUDA_SUCCESS) return;
      if (r != CUDA_ERROR_NOT_SUPPORTED)
        throw CudaError(
            ddp::detail::str("ddp: cuStreamWaitValue32 on the staging gate failed with CUresult ",
                             static_cast<int>(r), " (stream ", stream, ")"));
      words_->disable();  // this device takes no memory waits: host functions from now on
    }
    DDP_CUDA_CHECK(cudaLaunchHostFunc(s, &staging::Gate::wait_fn, &gate));
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
      throw ConfigError(
          ddp::detail::str(who(rank, size), ": --backend ", backend,
                           " with CUDA tensors needs CUDA device ", device, ", but ", n,
                           " device(s) are visible; check CUDA_VISIBLE_DEVICES "
                           "and the device chosen for this rank (CommOptions::cuda_device)."));
    return device;
  }

 private:
  int device_;
  // shared by the copies of these device ops (sub-communicators)
  std::shared_ptr<detail::StagingWords> words_;
};

static_assert(staging::DeviceOps<CudaStagingDevice>);

using CudaStagedCommunicator = StagedCommunicator<CudaStagingDevice>;

// `host` (tcp or mpi, owned from now on) staged for device tensors on CUDA device `device`.
// ConfigError if the device is not visible or `host` reaches device memory itself.
inline std::unique_ptr<Communicator> make_staged_cuda(std::unique_ptr<Communicator> host,
                                                      int device, const CommOptions& opts = {}) {
  if (!host) throw ConfigError("ddp: make_staged_cuda needs a communicator to wrap, got nullptr");
  CudaStagingDevice dev(
      CudaStagingDevice::usable(device, host->rank(), host->size(), host->backend()));
  return std::make_unique<CudaStagedCommunicator>(std::move(host), dev, opts);
}

}  // namespace ddp::comm
