// nccl backend on real GPUs: every collective on device buffers against a host-computed reference.
// World size 1 always; world size 2..4 as threads, one device each, when that many GPUs are visible
// (NCCL refuses two ranks on one device, so with one GPU only world size 1 runs).
// SPDX-License-Identifier: MIT
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/factory.hpp"
#include "ddp/comm/nccl/nccl_communicator.hpp"
#include "ddp/store/hash_store.hpp"
#include "support/gpu.hpp"

namespace {

using ddp::comm::NcclCommunicator;
using ddp::comm::ReduceOp;

// A device copy of a host vector, freed on scope exit.
template <class T>
struct DeviceVec {
  explicit DeviceVec(const std::vector<T>& h) : n(h.size()) {
    REQUIRE(cudaMalloc(&p, (n ? n : 1) * sizeof(T)) == cudaSuccess);
    if (n) REQUIRE(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~DeviceVec() { cudaFree(p); }
  std::vector<T> host() const {
    std::vector<T> h(n);
    if (n) REQUIRE(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
  ddp::TensorView<T, ddp::Cuda> view() const { return {p, ddp::Shape{static_cast<std::int64_t>(n)}}; }
  T* p = nullptr;
  std::size_t n;
};

std::vector<float> data_of(int rank, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>((static_cast<int>(i) * 7 + rank * 3) % 9 - 4);
  return v;
}

std::unique_ptr<NcclCommunicator> make(int rank, int n, ddp::store::Store& store) {
  auto c = ddp::comm::make_communicator("nccl", {.rank = rank, .world_size = n, .local_rank = rank,
                                                 .master_addr = "127.0.0.1"},
                                        store, {.timeout = std::chrono::seconds(20)});
  REQUIRE(c->backend() == "nccl");
  return std::unique_ptr<NcclCommunicator>(static_cast<NcclCommunicator*>(c.release()));
}

// Every collective of one rank of an n-rank job; returns the mismatches.
std::vector<std::string> run_rank(NcclCommunicator& c) {
  std::vector<std::string> bad;
  const int n = c.size(), r = c.rank();
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1001}, std::size_t{(3u << 20) / 4 + 1}}) {
    const std::string tag = "n=" + std::to_string(n) + " count=" + std::to_string(count) + " ";
    std::vector<std::vector<float>> all;
    for (int k = 0; k < n; ++k) all.push_back(data_of(k, count));
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product}) {
      std::vector<float> want = all[0];
      for (int k = 1; k < n; ++k) ddp::comm::reduce_into(want.data(), all[k].data(), count, ddp::DType::F32, op);
      if (op == ReduceOp::Avg) ddp::comm::divide_by(want.data(), count, ddp::DType::F32, n);
      DeviceVec<float> d(all[r]);
      c.all_reduce(d.view(), {.op = op}).wait();
      const auto got = d.host();
      bool ok = true;  // NCCL's float Avg multiplies by 1/n: compare with a tolerance
      for (std::size_t i = 0; i < count; ++i) ok = ok && std::abs(got[i] - want[i]) <= 1e-6f * (1 + std::abs(want[i]));
      if (!ok) bad.push_back(tag + "all_reduce " + std::string(ddp::comm::reduce_op_name(op)));
    }
    for (int root = 0; root < n; ++root) {
      DeviceVec<float> d(all[r]);
      c.broadcast(d.view(), {.root = root}).wait();
      if (d.host() != all[root]) bad.push_back(tag + "broadcast root " + std::to_string(root));
    }
    {
      DeviceVec<float> in(all[r]), out{std::vector<float>(count * static_cast<std::size_t>(n), -99.f)};
      c.all_gather(in.view(), out.view()).wait();
      std::vector<float> want;
      for (auto& a : all) want.insert(want.end(), a.begin(), a.end());
      if (out.host() != want) bad.push_back(tag + "all_gather");
    }
    {
      std::vector<std::vector<float>> big;
      for (int k = 0; k < n; ++k) big.push_back(data_of(k + 10, count * static_cast<std::size_t>(n)));
      DeviceVec<float> in(big[r]), out{std::vector<float>(count)}, a2a{std::vector<float>(count * static_cast<std::size_t>(n))};
      c.reduce_scatter(in.view(), out.view()).wait();
      c.all_to_all(in.view(), a2a.view()).wait();
      std::vector<float> want_rs(count, 0.f), want_a2a;
      for (int k = 0; k < n; ++k) {
        for (std::size_t i = 0; i < count; ++i) want_rs[i] += big[k][static_cast<std::size_t>(r) * count + i];
        want_a2a.insert(want_a2a.end(), big[k].begin() + static_cast<std::ptrdiff_t>(count) * r,
                        big[k].begin() + static_cast<std::ptrdiff_t>(count) * (r + 1));
      }
      if (out.host() != want_rs) bad.push_back(tag + "reduce_scatter");
      if (a2a.host() != want_a2a) bad.push_back(tag + "all_to_all");
    }
    c.barrier().wait();
  }
  return bad;
}

}  // namespace

TEST_CASE("nccl: world size 1 on device 0 runs every collective, bf16 too, and rejects host memory") {
  if (ddp::test::skip_without_gpu()) return;
  ddp::store::HashStore store(std::chrono::seconds(5));
  auto c = make(0, 1, store);
  CHECK(run_rank(*c).empty());
  std::vector<ddp::bfloat16> h(33, ddp::bfloat16(1.5f));
  DeviceVec<ddp::bfloat16> d(h);
  c->all_reduce(d.view(), {.op = ReduceOp::Sum}).wait();
  CHECK(static_cast<float>(d.host()[32]) == 1.5f);
  std::vector<float> host(4, 1.f);
  CHECK_THROWS_WITH_AS(c->all_reduce(std::span(host)),
                       "ddp[rank 0/1]: all_reduce got host memory, but the nccl backend reaches CUDA device memory "
                       "only; pass a TensorView<T, Cuda> over device memory, or use a communicator made for host memory "
                       "(--backend tcp without CommOptions::cuda_device).",
                       ddp::ValueError);
}

TEST_CASE("nccl: an op on .stream runs after the stream's earlier work and before its later work, host-free") {
  if (ddp::test::skip_without_gpu()) return;
  ddp::store::HashStore store(std::chrono::seconds(5));
  auto c = make(0, 1, store);
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  const std::size_t n = std::size_t{16} << 20;  // 64 MiB: a copy long enough to lose a race against
  std::vector<float> h(n, 3.0f), back(n, 0.0f);
  DeviceVec<float> in{std::vector<float>(n, 0.0f)}, out{std::vector<float>(n, -99.0f)};
  // All three are enqueued on s; the all-gather must read what the first copy writes, and the last copy
  // must read what the all-gather writes, without a host wait in between.
  REQUIRE(cudaMemcpyAsync(in.p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice, s) == cudaSuccess);
  ddp::comm::Work w = c->all_gather(in.view(), out.view(), {.stream = s});
  REQUIRE(cudaMemcpyAsync(back.data(), out.p, n * sizeof(float), cudaMemcpyDeviceToHost, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(std::all_of(back.begin(), back.end(), [](float x) { return x == 3.0f; }));
  w.wait();
  CHECK(w.is_completed());
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("nccl: world size 2..4 as threads, one GPU each, when that many GPUs are visible") {
  if (ddp::test::skip_without_gpu()) return;
  int devices = 0;
  REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  if (devices < 2) {
    MESSAGE("only " << devices << " GPU visible: NCCL needs one device per rank, multi-rank case not run");
    return;
  }
  for (int n = 2; n <= std::min(devices, 4); ++n) {
    ddp::store::HashStore store(std::chrono::seconds(20));
    std::vector<std::vector<std::string>> bad(static_cast<std::size_t>(n));
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r)
      ts.emplace_back([&, r] {
        try {
          REQUIRE(cudaSetDevice(r) == cudaSuccess);
          auto c = make(r, n, store);
          bad[static_cast<std::size_t>(r)] = run_rank(*c);
        } catch (...) {
          errors[static_cast<std::size_t>(r)] = std::current_exception();
        }
      });
    for (auto& t : ts) t.join();
    for (int r = 0; r < n; ++r) {
      CHECK_MESSAGE(!errors[static_cast<std::size_t>(r)], "rank ", r, " threw");
      CHECK_MESSAGE(bad[static_cast<std::size_t>(r)].empty(), "rank ", r, ": ", bad[static_cast<std::size_t>(r)].size(),
                    " mismatches");
    }
  }
}
