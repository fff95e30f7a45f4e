// The CUDA runtime layer: caching allocator statistics, copies both ways, pinned buffers, streams and events, and
// the batch prefetcher (pinned slots uploaded on a copy stream; its bookkeeping: test_prefetch.cpp, on the CPU).
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include <ddp/kernels/cuda/kernels.cuh>
#include <ddp/tensor/cuda/allocator.hpp>
#include <ddp/tensor/cuda/copy.hpp>
#include <ddp/tensor/cuda/pinned.hpp>
#include <ddp/tensor/cuda/prefetcher.hpp>
#include <ddp/tensor/cuda/stream.hpp>
#include <ddp/tensor/tensor.hpp>

#include "support/gpu.hpp"

using ddp::Cpu;
using ddp::Cuda;
using ddp::Tensor;

TEST_SUITE("tensor_cuda") {
  TEST_CASE("cuda_device_count never throws") { CHECK(ddp::cuda_device_count() >= 0); }

  TEST_CASE("allocator: current and peak bytes follow allocations; freed blocks are reused") {
    if (ddp::test::skip_without_gpu()) return;
    DDP_CUDA_CHECK(cudaDeviceSynchronize());
    ddp::reset_peak_cuda_memory();
    const auto before = ddp::cuda_memory_stats();
    constexpr std::int64_t kFloats = std::int64_t{3} << 20;  // 12 MiB
    {
      Tensor<float, Cuda> a({kFloats});
      Tensor<float, Cuda> b({kFloats});
      DDP_CUDA_CHECK(cudaDeviceSynchronize());
      const auto during = ddp::cuda_memory_stats();
      CHECK(during.current_bytes >= before.current_bytes + 2 * kFloats * sizeof(float));
      CHECK(during.peak_bytes >= during.current_bytes);
    }
    DDP_CUDA_CHECK(cudaDeviceSynchronize());
    const auto after = ddp::cuda_memory_stats();
    CHECK(after.current_bytes == before.current_bytes);
    CHECK(after.peak_bytes >= before.current_bytes + 2 * kFloats * sizeof(float));
    CHECK(after.reserved_bytes >= 2 * kFloats * sizeof(float));  // cached, not returned to the driver
    ddp::reset_peak_cuda_memory();
    CHECK(ddp::cuda_memory_stats().peak_bytes == after.current_bytes);
  }

  TEST_CASE("allocator: a repeated allocation pattern is served from the cache (no cudaMalloc, no host wait)") {
    if (ddp::test::skip_without_gpu()) return;
    ddp::Stream side;  // outlives every tensor recorded on it
    auto round = [&side] {
      Tensor<float, Cuda> a({std::int64_t{3} << 20}), b({1000}), c({std::int64_t{1} << 18});
      ddp::cuda_record_stream(b.data() + 10, side.exec().stream);  // also used on another stream
    };
    round();
    const auto warm = ddp::cuda_memory_stats();
    for (int i = 0; i < 3; ++i) round();
    DDP_CUDA_CHECK(cudaDeviceSynchronize());
    round();
    const auto after = ddp::cuda_memory_stats();
    CHECK(after.device_mallocs == warm.device_mallocs);
    CHECK(after.current_bytes == warm.current_bytes);
  }

  TEST_CASE("allocator: out of memory is a CudaError naming the size and the fix") {
    if (ddp::test::skip_without_gpu()) return;
    auto huge = [] { return Tensor<float, Cuda>(ddp::Shape{std::int64_t{1} << 38}); };  // 1 TiB
    CHECK_THROWS_WITH_AS(huge(), doctest::Contains("ddp: out of GPU memory allocating 1099511627776 bytes (1048576 MiB)"),
                         ddp::CudaError);
    Tensor<float, Cuda> ok({16});  // the pool still works afterwards
    CHECK_FALSE(ok.empty());
  }

  TEST_CASE("copies: host -> device -> device -> host round trip on a stream, from pinned memory too") {
    if (ddp::test::skip_without_gpu()) return;
    ddp::Stream stream;
    auto ex = stream.exec();
    std::vector<float> values(1000);
    std::iota(values.begin(), values.end(), -10.0f);
    auto host = Tensor<float, Cpu>::from({10, 100}, values);
    auto dev = ddp::to<Cuda>(host.cview(), ex);
    auto dev2 = ddp::to<Cuda>(dev.cview(), ex);
    ddp::kernels::Kernels<Cuda>::scale(ex, 2.0f, dev2.view());
    auto back = ddp::to<Cpu>(dev2.cview(), ex);
    for (std::int64_t i = 0; i < back.numel(); ++i) REQUIRE(back.data()[i] == 2.0f * values[static_cast<std::size_t>(i)]);

    ddp::PinnedBuffer<float> pinned(1000);
    auto pv = pinned.view({10, 100});
    ddp::copy(dev.cview(), pv, ex);
    for (std::int64_t i = 0; i < pv.numel(); ++i) REQUIRE(pv[i] == values[static_cast<std::size_t>(i)]);
    CHECK_THROWS_WITH_AS(ddp::copy(dev.cview(), Tensor<float, Cpu>({5}).view(), ex),
                         "ddp: copy (device to host): source shape (10, 100) differs from destination shape (5); "
                         "reshape one of the views",
                         ddp::ValueError);
  }

  TEST_CASE("events order a second stream after the first without a host wait") {
    if (ddp::test::skip_without_gpu()) return;
    ddp::Stream compute, comm;
    Tensor<float, Cuda> t({1 << 20});
    ddp::kernels::Kernels<Cuda>::fill(compute.exec(), t.view(), 3.0f);
    ddp::Event ready;
    ready.record(compute.exec());
    ready.wait(comm.exec());
    ddp::kernels::Kernels<Cuda>::scale(comm.exec(), 2.0f, t.view());
    auto comm_exec = comm.exec();
    auto host = ddp::to<Cpu>(t.cview(), comm_exec);
    CHECK(ready.query());
    for (std::int64_t i = 0; i < host.numel(); i += 4099) REQUIRE(host.data()[i] == 6.0f);
  }

  TEST_CASE("Prefetcher<Cuda>: uploads equal the host batches, several in flight, a partial last batch") {
    if (ddp::test::skip_without_gpu()) return;
    // Batch `id`: x (rows, 1024) floats and y (rows) int64, values unique to the batch.
    auto batch = [](int id, std::int64_t rows) {
      std::pair<Tensor<float, Cpu>, Tensor<std::int64_t, Cpu>> b{Tensor<float, Cpu>({rows, 1024}),
                                                                 Tensor<std::int64_t, Cpu>({rows})};
      for (std::int64_t i = 0; i < b.first.numel(); ++i) b.first.data()[i] = static_cast<float>(id * 1000 + i % 1000);
      for (std::int64_t i = 0; i < rows; ++i) b.second.data()[i] = id * 100000 + i;
      return b;
    };
    auto same = [](const Tensor<float, Cpu>& a, const Tensor<float, Cpu>& b, float scale) {
      if (!(a.shape() == b.shape())) return false;
      for (std::int64_t i = 0; i < a.numel(); ++i)
        if (a.data()[i] != scale * b.data()[i]) return false;
      return true;
    };
    ddp::Stream compute;
    auto ex = compute.exec();
    ddp::Prefetcher<Cuda, float, std::int64_t> uploads(ex, 3);

    // Three batches staged at once, the last one partial: each pop gives its own.
    const std::vector<std::int64_t> rows{64, 64, 17};
    std::vector<std::pair<Tensor<float, Cpu>, Tensor<std::int64_t, Cpu>>> host;
    for (int id = 0; id < 3; ++id) host.push_back(batch(id, rows[static_cast<std::size_t>(id)]));
    for (const auto& b : host) uploads.push(b.first.cview(), b.second.cview());
    CHECK(uploads.staged() == 3);
    CHECK_THROWS_AS(uploads.push(host[0].first.cview(), host[0].second.cview()), ddp::ValueError);  // full
    for (const auto& b : host) {
      const auto [x, y] = uploads.pop();
      CHECK(same(ddp::to<Cpu>(x, ex), b.first, 1.0f));
      const auto labels = ddp::to<Cpu>(y, ex);
      REQUIRE(labels.shape() == b.second.shape());
      for (std::int64_t i = 0; i < labels.numel(); ++i) REQUIRE(labels.data()[i] == b.second.data()[i]);
    }

    // A feed over 12 batches (the last partial) whose steps never wait on the host: the host runs ahead while
    // every step scales its batch on the compute stream, so uploads and steps overlap as much as they can.
    // The first epoch may grow the slot that held the 17-row batch; the second allocates nothing.
    std::size_t allocations = 0;
    for (int epoch = 0; epoch < 2; ++epoch) {
      if (epoch == 1) allocations = uploads.allocations();
      int next_id = 0;
      std::vector<Tensor<float, Cuda>> results;
      auto feed = ddp::prefetch_feed(
          uploads,
          [&]() -> std::optional<std::pair<Tensor<float, Cpu>, Tensor<std::int64_t, Cpu>>> {
            if (next_id == 12) return std::nullopt;
            const int id = next_id++;
            return batch(id, id == 11 ? 5 : 64);  // freed by the feed once uploaded
          },
          [](const auto& b) { return std::tuple(b.first.cview(), b.second.cview()); });
      while (const auto* item = feed.next()) {
        const auto& x = std::get<0>(item->input);
        Tensor<float, Cuda> out(x.shape());
        ddp::copy(x, out.view(), ex);
        for (int r = 0; r < 20; ++r) ddp::kernels::Kernels<Cuda>::scale(ex, 1.0f, out.view());  // a longer step
        ddp::kernels::Kernels<Cuda>::scale(ex, 2.0f, out.view());
        results.push_back(std::move(out));
      }
      REQUIRE(results.size() == 12);
      for (int id = 0; id < 12; ++id)
        CHECK(same(ddp::to<Cpu>(results[static_cast<std::size_t>(id)].cview(), ex), batch(id, id == 11 ? 5 : 64).first,
                   2.0f));
    }
    CHECK(uploads.allocations() == allocations);  // the steady state: every slot holds 64 rows
  }
}
