// PrefetchRing's bookkeeping (tensor/prefetch.hpp) on a fake GPU with a copy stream and a compute stream whose
// work runs only when the test or a host wait advances them: the ring order of its calls and the events each side
// waits for, batches arriving intact under a fast and a slow copy engine (a mutant backend that skips one of the
// three waits shows that each schedule catches what it guards against), the last partial batch, larger batches
// (new buffers), full and empty rings, discard(), and the CPU prefetcher (views of the host batch, no look-ahead).
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <ddp/core/error.hpp>
#include <ddp/core/str.hpp>
#include <ddp/tensor/prefetch.hpp>
#include <ddp/tensor/tensor.hpp>

namespace prefetch_test {

using ddp::Cpu;
using ddp::Tensor;

// A record's id is the fake device's count of records so far; a wait made after record #n passes once the
// event's stream has executed record #n (cudaStreamWaitEvent waits for the record before the call).
struct Event {
  std::uint64_t recorded = 0;  // the last record enqueued (0: never recorded)
  std::uint64_t reached = 0;   // the last record its stream executed
};

struct Op {
  std::function<void()> run;    // a copy, a record or the test's compute work
  const Event* wait = nullptr;  // a barrier: runs once wait->reached >= target
  std::uint64_t target = 0;
};

// Device memory stays allocated until the fake GPU is gone: CUDA's caching allocator hands a freed block to other
// work only in stream order, so compute work enqueued before a slot got larger buffers still reads the old ones.
inline std::vector<std::shared_ptr<void>>& device_blocks() {
  static std::vector<std::shared_ptr<void>> blocks;
  return blocks;
}

// What a mutant backend leaves out (Skip::None: the real bookkeeping).
enum class Skip { None, HostWait, CopyWait, ComputeWait };

struct Gpu {
  std::deque<Op> copy, compute;
  std::vector<std::string> log;  // the backend's calls, in host order
  std::uint64_t records = 0;
  bool copies_first = true;  // which stream a host wait advances first (the copy engine fast or slow)
  Skip skip = Skip::None;
  ~Gpu() { device_blocks().clear(); }

  static bool run_one(std::deque<Op>& q) {
    if (q.empty() || (q.front().wait && q.front().wait->reached < q.front().target)) return false;
    Op op = std::move(q.front());
    q.pop_front();
    if (op.run) op.run();
    return true;
  }
  bool advance() { return copies_first ? run_one(copy) || run_one(compute) : run_one(compute) || run_one(copy); }
  // One op at a time, the preferred stream first, until done(): the other stream moves as little as possible.
  template <class F>
  void run_until(F done) {
    while (!done()) REQUIRE_MESSAGE(advance(), "deadlock: neither fake stream can advance");
  }
  void run_copies() {
    while (run_one(copy)) {
    }
  }
  void run_compute() {
    while (run_one(compute)) {
    }
  }
  void drain() {
    run_until([&] { return copy.empty() && compute.empty(); });
  }
  void record(std::deque<Op>& q, Event& e) {
    const std::uint64_t id = ++records;
    e.recorded = id;
    q.push_back({.run = [&e, id] { e.reached = std::max(e.reached, id); }});
  }
};

template <class T>
struct HostMem {  // staging memory; a std::vector so that ASan sees a DMA out of a freed buffer
  HostMem() = default;
  explicit HostMem(std::size_t n) : v(n) {}
  T* data() { return v.data(); }
  std::vector<T> v;
};

template <class T>
struct DevMem {  // filled with a value no batch has, so that a read before the upload shows
  DevMem() = default;
  explicit DevMem(ddp::Shape s) {
    auto v = std::make_shared<std::vector<T>>(static_cast<std::size_t>(s.numel()), T(-7));
    p = v->data();
    device_blocks().push_back(std::move(v));
  }
  T* data() { return p; }
  T* p = nullptr;
};

struct Backend {
  using device = Cpu;
  using Event = prefetch_test::Event;
  template <class T>
  using HostBuffer = HostMem<T>;
  template <class T>
  using DeviceBuffer = DevMem<T>;
  Gpu* gpu = nullptr;

  void upload(void* dst, const void* src, std::size_t bytes) {
    gpu->log.push_back(ddp::detail::str("copy: upload ", bytes, " B"));
    gpu->copy.push_back({.run = [=] { std::memcpy(dst, src, bytes); }});
  }
  void record_upload(Event& e) {
    gpu->record(gpu->copy, e);
    gpu->log.push_back(ddp::detail::str("copy: record #", e.recorded));
  }
  void copy_wait(const Event& e) {
    gpu->log.push_back(ddp::detail::str("copy: wait for #", e.recorded));
    if (gpu->skip != Skip::CopyWait) gpu->copy.push_back({.wait = &e, .target = e.recorded});
  }
  void record_compute(Event& e) {
    gpu->record(gpu->compute, e);
    gpu->log.push_back(ddp::detail::str("compute: record #", e.recorded));
  }
  void compute_wait(const Event& e) {
    gpu->log.push_back(ddp::detail::str("compute: wait for #", e.recorded));
    if (gpu->skip != Skip::ComputeWait) gpu->compute.push_back({.wait = &e, .target = e.recorded});
  }
  void host_wait(const Event& e) {
    gpu->log.push_back(ddp::detail::str("host: wait for #", e.recorded));
    if (gpu->skip != Skip::HostWait) gpu->run_until([&] { return e.reached >= e.recorded; });
  }
  void finish() noexcept {  // the fake device finishes everything (CUDA's waits for the copy stream only)
    while (gpu->advance()) {
    }
  }
};

using Ring = ddp::PrefetchRing<Backend, float, std::int64_t>;

// Batch `id` of `rows` rows: x (rows, 3) floats, y (rows) int64, values unique to the batch.
struct HostBatch {
  Tensor<float, Cpu> x;
  Tensor<std::int64_t, Cpu> y;
  int id = 0;
};
inline HostBatch host_batch(int id, std::int64_t rows) {
  HostBatch b{.x = Tensor<float, Cpu>({rows, 3}), .y = Tensor<std::int64_t, Cpu>({rows}), .id = id};
  for (std::int64_t i = 0; i < b.x.numel(); ++i) b.x.data()[i] = static_cast<float>(id * 1000 + i) + 0.5f;
  for (std::int64_t i = 0; i < rows; ++i) b.y.data()[i] = id * 100 + i;
  return b;
}
inline auto fields(const HostBatch& b) { return std::tuple(b.x.cview(), b.y.cview()); }

// Feeds batches of these row counts through `ring` as a training loop does: each step is compute-stream work that
// compares the step's device tensors with its host batch when the fake device runs it. After each step the fake
// device runs the copy stream (copies_first: a fast copy engine, the host far ahead of the compute stream) or the
// compute stream (a slow copy engine). Returns the number of steps whose tensors differed from their batch.
inline int run_epoch(Gpu& gpu, Ring& ring, const std::vector<std::int64_t>& rows) {
  int mismatches = 0, steps = 0, next_id = 0;
  auto feed = ddp::prefetch_feed(
      ring,
      [&]() -> std::optional<HostBatch> {
        if (next_id == static_cast<int>(rows.size())) return std::nullopt;
        const int id = next_id++;
        return host_batch(id, rows[static_cast<std::size_t>(id)]);
      },
      fields);
  while (const auto* item = feed.next()) {
    const auto& [x, y] = item->input;
    CHECK(x.shape() == item->host.x.shape());
    CHECK(y.shape() == item->host.y.shape());
    std::vector<float> want_x(item->host.x.data(), item->host.x.data() + item->host.x.numel());
    std::vector<std::int64_t> want_y(item->host.y.data(), item->host.y.data() + item->host.y.numel());
    gpu.compute.push_back({.run = [&mismatches, &steps, x, y, want_x, want_y] {
      ++steps;
      mismatches +=
          !std::equal(want_x.begin(), want_x.end(), x.data()) || !std::equal(want_y.begin(), want_y.end(), y.data());
    }});
    if (gpu.copies_first)
      gpu.run_copies();
    else
      gpu.run_compute();
  }
  gpu.drain();
  CHECK(steps == static_cast<int>(rows.size()));
  return mismatches;
}

}  // namespace prefetch_test

TEST_SUITE("prefetch") {
  using namespace prefetch_test;

  TEST_CASE("ring order: each push waits for its slot's last upload (host) and last use (copy stream); "
            "pop makes the compute stream wait for that batch's upload") {
    Gpu gpu;
    Ring ring(Backend{&gpu}, 2);
    CHECK(ring.lookahead() == 1);
    const HostBatch b0 = host_batch(0, 2), b1 = host_batch(1, 2), b2 = host_batch(2, 2), b3 = host_batch(3, 1);
    ring.push(fields(b0));  // slot 0, new buffers: the copy stream waits for the compute stream's work so far
    ring.pop();
    ring.push(fields(b1));  // slot 1, new buffers
    ring.pop();             // releases slot 0
    ring.push(fields(b2));  // slot 0 again
    ring.pop();             // releases slot 1
    ring.push(fields(b3));  // slot 1 again, a smaller batch: its buffers suffice
    ring.pop();
    const std::vector<std::string> want{  // one line per push or pop
        "compute: record #1", "copy: wait for #1", "copy: upload 24 B", "copy: upload 16 B", "copy: record #2",
        "compute: wait for #2",
        "compute: record #3", "copy: wait for #3", "copy: upload 24 B", "copy: upload 16 B", "copy: record #4",
        "compute: record #5", "compute: wait for #4",
        "host: wait for #2", "copy: wait for #5", "copy: upload 24 B", "copy: upload 16 B", "copy: record #6",
        "compute: record #7", "compute: wait for #6",
        "host: wait for #4", "copy: wait for #7", "copy: upload 12 B", "copy: upload 8 B", "copy: record #8",
        "compute: record #9", "compute: wait for #8"};
    CHECK(gpu.log == want);
    CHECK(ring.allocations() == 4);  // two tensors in each of two slots, never again
    gpu.drain();
  }

  TEST_CASE("batches arrive intact with a fast and a slow copy engine, 2 and 3 slots, a partial last batch") {
    for (const bool fast : {true, false})
      for (const std::size_t slots : {2u, 3u}) {
        CAPTURE(fast);
        CAPTURE(slots);
        Gpu gpu;
        gpu.copies_first = fast;
        Ring ring(Backend{&gpu}, slots);
        CHECK(run_epoch(gpu, ring, {4, 4, 4, 4, 4, 3}) == 0);
        CHECK(ring.allocations() == 2 * slots);
        CHECK(run_epoch(gpu, ring, {4, 4, 1}) == 0);  // a second epoch reuses the slots
        CHECK(ring.allocations() == 2 * slots);
      }
  }

  TEST_CASE("each wait matters: a backend that skips one corrupts a batch under the schedule that exposes it") {
    struct Case {
      Skip skip;
      bool fast;  // the schedule that exposes it
    };
    for (const Case c : {Case{Skip::CopyWait, true}, Case{Skip::ComputeWait, false}, Case{Skip::HostWait, false}}) {
      CAPTURE(static_cast<int>(c.skip));
      Gpu gpu;
      gpu.copies_first = c.fast;
      {
        Ring ring(Backend{&gpu}, 2);
        gpu.skip = c.skip;
        CHECK(run_epoch(gpu, ring, {4, 4, 4, 4, 4}) > 0);
      }
      Gpu ok;
      ok.copies_first = c.fast;
      Ring ring(Backend{&ok}, 2);
      CHECK(run_epoch(ok, ring, {4, 4, 4, 4, 4}) == 0);
    }
  }

  TEST_CASE("a larger batch gets new buffers in its slot, after the slot's last upload and use") {
    for (const bool fast : {true, false}) {
      Gpu gpu;
      gpu.copies_first = fast;
      Ring ring(Backend{&gpu}, 2);
      CHECK(run_epoch(gpu, ring, {1, 2, 3, 4, 2, 5}) == 0);
      CHECK(ring.allocations() == 2 * 5);  // each slot's first fill, then the batches of 3, 4 and 5 rows
      // The refill of a grown slot: host wait for its last upload, then the compute stream's record, then the
      // copy stream's wait for it, then the uploads.
      const auto& log = gpu.log;
      const auto at = std::find(log.begin(), log.end(), "host: wait for #2");
      REQUIRE(at != log.end());
      CHECK(*(at + 1) == "compute: record #6");  // batch 2 (3 rows) in slot 0 (1 row before)
      CHECK(*(at + 2) == "copy: wait for #6");
    }
  }

  TEST_CASE("a full ring and an empty ring are ValueErrors; fewer than 2 slots too") {
    Gpu gpu;
    CHECK_THROWS_WITH_AS(Ring(Backend{&gpu}, 1),
                         "ddp: Prefetcher: needs at least 2 slots (one batch in use, one uploading), got 1",
                         ddp::ValueError);
    Ring ring(Backend{&gpu}, 2);
    CHECK_THROWS_WITH_AS(ring.pop(), "ddp: Prefetcher::pop: no batch is staged; push() one first", ddp::ValueError);
    const HostBatch b = host_batch(0, 2);
    ring.push(fields(b));
    ring.push(fields(b));
    CHECK_THROWS_WITH_AS(ring.push(fields(b)),
                         "ddp: Prefetcher::push: all 2 slots hold batches (2 staged, 0 in use); pop() one before "
                         "pushing another, or give the prefetcher more slots",
                         ddp::ValueError);
    ring.pop();
    CHECK_THROWS_WITH_AS(ring.push(fields(b)),
                         "ddp: Prefetcher::push: all 2 slots hold batches (1 staged, 1 in use); pop() one before "
                         "pushing another, or give the prefetcher more slots",
                         ddp::ValueError);
    ring.release();
    ring.push(fields(b));  // the released slot
    CHECK(ring.staged() == 2);
    gpu.drain();
  }

  TEST_CASE("an epoch left early: the next feed discards its staged batches and starts with its own") {
    Gpu gpu;
    Ring ring(Backend{&gpu}, 3);
    int next_id = 0;
    auto source = [&]() -> std::optional<HostBatch> { return host_batch(next_id++, 2); };
    {
      auto feed = ddp::prefetch_feed(ring, source, fields);
      CHECK(feed.next()->host.id == 0);
      CHECK(ring.staged() == 2);  // batches 1 and 2 upload while batch 0 is in use
    }
    next_id = 10;
    auto feed = ddp::prefetch_feed(ring, source, fields);
    CHECK(ring.staged() == 0);
    const auto* item = feed.next();
    CHECK(item->host.id == 10);
    gpu.drain();
    CHECK(std::get<1>(item->input).data()[1] == 10 * 100 + 1);
  }

  TEST_CASE("the destructor waits for the uploads in flight") {
    Gpu gpu;
    gpu.copies_first = false;
    {
      Ring ring(Backend{&gpu}, 2);
      const HostBatch b = host_batch(0, 2);
      ring.push(fields(b));
      CHECK_FALSE(gpu.copy.empty());
    }
    CHECK(gpu.copy.empty());
  }

  TEST_CASE("Prefetcher<Cpu>: views of the host batch itself, fetched only when needed") {
    ddp::Prefetcher<Cpu, float, std::int64_t> uploads;
    CHECK(uploads.lookahead() == 0);
    int fetched = 0;
    auto feed = ddp::prefetch_feed(
        uploads,
        [&]() -> std::optional<HostBatch> {
          if (fetched == 3) return std::nullopt;
          ++fetched;
          return host_batch(fetched, fetched == 3 ? 1 : 2);
        },
        fields);
    for (int id = 1; id <= 3; ++id) {
      const auto* item = feed.next();
      REQUIRE(item != nullptr);
      CHECK(fetched == id);  // no look-ahead: the CPU loop fetches as it did before
      CHECK(std::get<0>(item->input).data() == item->host.x.data());  // no copy
      CHECK(std::get<1>(item->input).shape() == item->host.y.shape());
    }
    CHECK(feed.next() == nullptr);
    CHECK_THROWS_WITH_AS(uploads.pop(), "ddp: Prefetcher::pop: no batch is staged; push() one first", ddp::ValueError);
  }
}
