// The umbrella header: #include <ddp/ddp.hpp> gives the whole library that this build has.
// SPDX-License-Identifier: MIT
//
// Optional parts (CUDA kernels, NCCL, MPI) appear only when the including target links ddp::cuda,
// ddp::nccl or ddp::mpi, which define DDP_WITH_*; CUDA kernels (.cuh) only when nvcc compiles the file.
#pragma once

// defines: DDP_VERSION_*, version_string()
#include "ddp/version.hpp"
// defines: DDP_HOST_DEVICE, DDP_WITH_*, BuildConfig
#include "ddp/config.hpp"
// defines: Error, ConfigError, ValueError, IoError, StoreError, CommError, TimeoutError, CudaError
#include "ddp/core/error.hpp"
// defines: DDP_CHECK, DDP_CHECK_EQ/NE/LT/LE/GT/GE, DDP_CHECK_AS
#include "ddp/core/check.hpp"
// defines: log::Level, log::init, log::set_rank, DDP_LOG_INFO/WARN/...
#include "ddp/core/log.hpp"
// defines: detail::str, detail::join
#include "ddp/core/str.hpp"
// defines: store::Store, store::Bytes
#include "ddp/store/store.hpp"
// defines: store::HashStore
#include "ddp/store/hash_store.hpp"
