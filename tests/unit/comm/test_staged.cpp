// StagedCommunicator's bookkeeping over real tcp communicators (ranks as threads) and a fake device whose
// streams are threads running their work in order, as a GPU does: every op's result reaches the device
// buffer, the op runs after the stream's earlier work and before its later work while the call returns at
// once, the copies made are only the ones each op needs, failures and timeouts fail the Work and release
// the stream, pinned blocks are reused, groups and destruction with ops in flight.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "comm_harness.hpp"
#include "support/rank_processes.hpp"
#include "ddp/comm/staging/staged_communicator.hpp"
#include "ddp/store/file_store.hpp"

using namespace ddp;
using namespace std::chrono_literals;

namespace {

// A device whose memory is host memory and whose streams are threads (one per stream handle, created on
// first use) that run the enqueued work in order. Copies of a FakeDevice share one state.
class FakeDevice {
 public:
  using Event = int;
  struct Pinned {
    std::vector<std::byte> mem;
    std::byte* data() noexcept { return mem.data(); }
    std::size_t bytes() const noexcept { return mem.size(); }
  };

  struct Counters {
    std::int64_t d2h = 0, h2d = 0, holds = 0, pinned_allocs = 0, events = 0, bound_threads = 0;
  };

  explicit FakeDevice(bool memory_wait = true) { st_->memory_wait = memory_wait; }

  Pinned alloc_pinned(std::size_t n) {
    std::lock_guard l(st_->mu);
    ++st_->counters.pinned_allocs;
    return Pinned{std::vector<std::byte>(n)};
  }
  Event create_event() {
    std::lock_guard l(st_->mu);
    ++st_->counters.events;
    st_->recorded.push_back(0);
    st_->reached.push_back(0);
    return static_cast<int>(st_->recorded.size() - 1);
  }
  void destroy_event(Event) noexcept {}
  void copy_to_host(void* host, const void* dev, std::size_t n, void* s) {
    count(&Counters::d2h);
    launch(s, [=] { std::memcpy(host, dev, n); });
  }
  void copy_to_device(void* dev, const void* host, std::size_t n, void* s) {
    count(&Counters::h2d);
    launch(s, [=] { std::memcpy(dev, host, n); });
  }
  void record(Event e, void* s) {
    std::int64_t gen = 0;
    {
      std::lock_guard l(st_->mu);
      gen = ++st_->recorded[static_cast<std::size_t>(e)];
    }
    launch(s, [st = st_.get(), e, gen] {
      std::lock_guard l(st->mu);
      st->reached[static_cast<std::size_t>(e)] = gen;
    });
  }
  bool query(Event e) {
    std::lock_guard l(st_->mu);
    return st_->reached[static_cast<std::size_t>(e)] >= st_->recorded[static_cast<std::size_t>(e)];
  }
  // As the CUDA device: a memory wait on the gate's word (cuStreamWaitValue32 with CU_STREAM_WAIT_VALUE_GEQ:
  // until (int32_t)(*word - generation) >= 0), or, with memory_wait false, a "host function" that waits.
  void hold(void* s, comm::staging::Gate& g) {
    count(&Counters::holds);
    if (!st_->memory_wait) {
      launch(s, [&g] { comm::staging::Gate::wait_fn(&g); });
      return;
    }
    if (!g.word()) {
      std::lock_guard l(st_->mu);
      g.attach(&st_->words.emplace_back(0xdeadbeefu));  // attach sets the word itself
    }
    launch(s, [word = g.word(), want = g.generation()] {
      while (static_cast<std::int32_t>(std::atomic_ref<std::uint32_t>(*word).load(std::memory_order_acquire) -
                                       want) < 0)
        std::this_thread::sleep_for(std::chrono::microseconds(10));
    });
  }
  void bind_thread() { count(&Counters::bound_threads); }

  // ---- the test's side ----
  // A "kernel" on stream s.
  void launch(void* s, std::function<void()> f) { runner(s).push(std::move(f)); }
  // Blocks the host until s has run everything enqueued so far.
  void sync(void* s) {
    std::latch done(1);
    launch(s, [&] { done.count_down(); });
    done.wait();
  }
  Counters counters() {
    std::lock_guard l(st_->mu);
    return st_->counters;
  }

 private:
  class Runner {
   public:
    Runner() : thread_([this] { loop(); }) {}
    ~Runner() {
      {
        std::lock_guard l(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      thread_.join();
    }
    void push(std::function<void()> f) {
      {
        std::lock_guard l(mu_);
        work_.push_back(std::move(f));
      }
      cv_.notify_all();
    }

   private:
    void loop() {
      std::unique_lock l(mu_);
      for (;;) {
        cv_.wait(l, [&] { return stop_ || !work_.empty(); });
        if (work_.empty()) return;
        auto f = std::move(work_.front());
        work_.pop_front();
        l.unlock();
        f();
        l.lock();
      }
    }
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> work_;
    bool stop_ = false;
    std::thread thread_;  // last: starts after the members it uses
  };
  struct State {
    std::mutex mu;
    Counters counters;
    std::vector<std::int64_t> recorded, reached;
    std::map<void*, std::unique_ptr<Runner>> streams;
    bool memory_wait = true;
    std::deque<std::uint32_t> words;  // the gates' words (a deque: stable addresses)
  };
  Runner& runner(void* s) {
    std::lock_guard l(st_->mu);
    auto& r = st_->streams[s];
    if (!r) r = std::make_unique<Runner>();
    return *r;
  }
  void count(std::int64_t Counters::*c) {
    std::lock_guard l(st_->mu);
    ++(st_->counters.*c);
  }
  std::shared_ptr<State> st_ = std::make_shared<State>();
};

static_assert(comm::staging::DeviceOps<FakeDevice>);
using Staged = comm::StagedCommunicator<FakeDevice>;

void* stream(std::uintptr_t id) { return reinterpret_cast<void*>(id); }  // any handle; 0 is the legacy stream

template <class T>
TensorView<T, Cuda> dev(std::vector<T>& v) { return TensorView<T, Cuda>(v.data(), Shape{static_cast<std::int64_t>(v.size())}); }
template <class T>
TensorView<const T, Cuda> cdev(const std::vector<T>& v) {
  return TensorView<const T, Cuda>(v.data(), Shape{static_cast<std::int64_t>(v.size())});
}

constexpr comm::CommOptions kOpts{.timeout = 5000ms, .shutdown_timeout = 2000ms};

// body(comm, device) on ranks 0..n-1 (threads), each with its own fake device and a StagedCommunicator over
// its own TcpCommunicator. Returns each rank's exception.
std::vector<std::exception_ptr> run_staged(int n, const std::function<void(Staged&, FakeDevice&)>& body,
                                           comm::CommOptions opts = kOpts, bool memory_wait = true) {
  return test::run_threads(n, [&](int r, store::Store& store) {
    FakeDevice device(memory_wait);
    Staged c(std::make_unique<comm::TcpCommunicator>(test::local_rank_info(r, n), store, opts), device, opts);
    body(c, device);
  });
}

constexpr const char* kRankProcesses = "staged: ranks as processes (run_rank_processes), several ops in flight";

void check_no_errors(const std::vector<std::exception_ptr>& errors) {
  for (const auto& e : errors) CHECK_MESSAGE(!e, test::message(e));
}

}  // namespace

TEST_SUITE("comm") {
  // The GPU tests whose ranks share a GPU run them as processes (support/rank_processes.hpp); this case runs the
  // same helper on the CPU so that CI checks it: each process a rank with its own fake device and tcp over a
  // FileStore, several ops in flight on one stream.
  TEST_CASE(kRankProcesses) {
    if (const auto me = test::as_rank_processes(kRankProcesses, 3)) {
      store::FileStore store(me->store_path, 20000ms);
      FakeDevice d;
      Staged c(std::make_unique<comm::TcpCommunicator>(test::local_rank_info(me->rank, me->world), store, kOpts), d,
               kOpts);
      void* s = stream(3);
      std::vector<float> a(5000, static_cast<float>(me->rank + 1)), b(77, static_cast<float>(me->rank));
      std::vector<comm::Work> w;
      for (int i = 0; i < 4; ++i)
        w.push_back(c.all_reduce(dev(i % 2 ? b : a), {.op = comm::ReduceOp::Sum, .stream = s}));
      for (auto& x : w) x.wait();
      const float n = static_cast<float>(me->world), ranks = n * (n + 1) / 2;
      CHECK(a[4999] == ranks * n);           // two sums of (rank + 1): the second sums n copies of the first
      CHECK(b[0] == (n * (n - 1) / 2) * n);  // likewise for rank
    }
  }

  TEST_CASE("staged: every op's result reaches device memory, world sizes 1-3") {
    for (int n = 1; n <= 3; ++n) {
      CAPTURE(n);
      check_no_errors(run_staged(n, [n](Staged& c, FakeDevice& d) {
        CHECK(c.memory() == comm::MemoryKind::Cuda);
        CHECK(c.backend() == "tcp");
        const int r = c.rank();
        void* s = stream(7);
        const std::size_t k = 1001;  // odd, not a multiple of any world size
        std::vector<float> a(k), b(k, static_cast<float>(r == 1 ? 5 : -1)), red(k), g(k * static_cast<std::size_t>(n));
        for (std::size_t i = 0; i < k; ++i) a[i] = static_cast<float>(r + 1) * static_cast<float>(i % 13);
        for (std::size_t i = 0; i < k; ++i) red[i] = static_cast<float>(r + 1);
        const std::vector<std::int64_t> mine(k, r + 10);
        std::vector<std::int64_t> gathered(k * static_cast<std::size_t>(n));
        std::vector<float> rs_in(k * static_cast<std::size_t>(n)), rs_out(k);
        for (std::size_t i = 0; i < rs_in.size(); ++i) rs_in[i] = static_cast<float>(i % 5 + static_cast<std::size_t>(r));
        std::vector<std::int32_t> a2a_in(static_cast<std::size_t>(n) * 3), a2a_out(a2a_in.size());
        for (std::size_t i = 0; i < a2a_in.size(); ++i) a2a_in[i] = static_cast<std::int32_t>(100 * r + static_cast<int>(i));

        // All issued without waiting, on one stream; the Works are waited at the end.
        std::vector<comm::Work> works;
        works.push_back(c.all_reduce(dev(a), {.op = comm::ReduceOp::Sum, .stream = s}));
        works.push_back(c.broadcast(dev(b), {.root = n > 1 ? 1 : 0, .stream = s}));
        works.push_back(c.reduce(dev(red), {.op = comm::ReduceOp::Max, .root = 0, .stream = s}));
        works.push_back(c.all_gather(cdev(mine), dev(gathered), {.stream = s}));
        works.push_back(c.reduce_scatter(cdev(rs_in), dev(rs_out), {.op = comm::ReduceOp::Avg, .stream = s}));
        works.push_back(c.all_to_all(cdev(a2a_in), dev(a2a_out), {.stream = s}));
        works.push_back(c.barrier({.stream = s}));
        for (auto& w : works) w.wait();
        // Work::wait() means the device copies are done: the host may read the buffers now.
        const float sum_ranks = static_cast<float>(n * (n + 1)) / 2.0f;
        for (std::size_t i = 0; i < k; ++i) REQUIRE(a[i] == sum_ranks * static_cast<float>(i % 13));
        CHECK(b[k - 1] == static_cast<float>(n > 1 ? 5 : -1));
        CHECK(red[3] == static_cast<float>(r == 0 ? n : r + 1));  // non-roots keep their data
        for (int j = 0; j < n; ++j) CHECK(gathered[static_cast<std::size_t>(j) * k + 5] == j + 10);
        for (std::size_t i = 0; i < k; ++i) {
          const std::size_t gi = static_cast<std::size_t>(r) * k + i;
          float want = 0;
          for (int j = 0; j < n; ++j) want += static_cast<float>(gi % 5 + static_cast<std::size_t>(j));
          REQUIRE(rs_out[i] == want / static_cast<float>(n));
        }
        for (int j = 0; j < n; ++j)
          for (int e = 0; e < 3; ++e)
            CHECK(a2a_out[static_cast<std::size_t>(j * 3 + e)] == 100 * j + r * 3 + e);
        // Copies: each op moves only what it reads and writes; barrier none, broadcast's root no H2D,
        // reduce's non-roots no H2D.
        const auto cnt = d.counters();
        const int root = n > 1 ? 1 : 0;
        CHECK(cnt.d2h == 5 + (r == root ? 1 : 0));
        CHECK(cnt.h2d == 4 + (r != root ? 1 : 0) + (r == 0 ? 1 : 0));
        CHECK(cnt.holds == 7);
        CHECK(cnt.bound_threads == 1);
      }));
    }
  }

  TEST_CASE("staged: send and recv move only what they need; a const buffer is never written") {
    check_no_errors(run_staged(2, [](Staged& c, FakeDevice& d) {
      void* s = stream(3);
      if (c.rank() == 0) {
        const std::vector<double> v{1.5, 2.5, 3.5};
        c.send(cdev(v), 1, {.tag = 4, .stream = s});
        auto cnt = d.counters();
        CHECK(cnt.d2h == 1);
        CHECK(cnt.h2d == 0);
        std::vector<double> back(3);
        c.recv(dev(back), 1, {.tag = 5, .stream = s});
        CHECK(back == std::vector<double>{3.0, 5.0, 7.0});
        cnt = d.counters();
        CHECK(cnt.d2h == 1);  // recv reads nothing from the device
        CHECK(cnt.h2d == 1);
      } else {
        std::vector<double> got(3);
        comm::Work w = c.irecv(dev(got), 0, {.tag = 4, .stream = s});
        w.wait();
        for (double& x : got) x *= 2;
        c.send(dev(got), 0, {.tag = 5, .stream = s});
      }
    }));
  }

  TEST_CASE("staged: the op runs after the stream's earlier work and before its later work; the call never blocks") {
    check_no_errors(run_staged(2, [](Staged& c, FakeDevice& d) {
      void* s = stream(9);
      std::vector<float> buf(4, 0.0f);
      std::latch go(1);
      // A slow "kernel" writes the input: the op must see its values, not the zeros there at the call.
      d.launch(s, [&] {
        go.wait();
        std::fill(buf.begin(), buf.end(), static_cast<float>(c.rank() + 1));
      });
      const auto t0 = std::chrono::steady_clock::now();
      comm::Work w = c.all_reduce(dev(buf), {.op = comm::ReduceOp::Sum, .stream = s});
      std::vector<float> seen;
      d.launch(s, [&] { seen = buf; });  // later work on the stream sees the result
      CHECK(std::chrono::steady_clock::now() - t0 < 100ms);
      std::this_thread::sleep_for(30ms);
      CHECK_FALSE(w.is_completed());  // the stream has not even reached the op
      go.count_down();
      w.wait();
      d.sync(s);
      CHECK(seen == std::vector<float>(4, 3.0f));
    }));
  }

  TEST_CASE("staged: ops on two streams, each in its stream's order") {
    check_no_errors(run_staged(2, [](Staged& c, FakeDevice& d) {
      void* s1 = stream(1);
      void* s2 = stream(2);
      std::vector<float> x(8, 1.0f), y(8, 10.0f);
      d.launch(s1, [&] { x.assign(8, 2.0f); });
      comm::Work wx = c.all_reduce(dev(x), {.stream = s1});
      comm::Work wy = c.all_reduce(dev(y), {.stream = s2});
      d.launch(s1, [&] { for (float& v : x) v += 1.0f; });
      wx.wait();
      wy.wait();
      d.sync(s1);
      d.sync(s2);
      CHECK(x == std::vector<float>(8, 5.0f));
      CHECK(y == std::vector<float>(8, 20.0f));
    }));
  }

  TEST_CASE("staged: pinned blocks are reused; the steady state allocates none") {
    // Both holds: the memory wait (a reused block's gate waits for its next generation) and the host function.
    for (const bool memory_wait : {true, false}) {
      CAPTURE(memory_wait);
      check_no_errors(run_staged(2, [](Staged& c, FakeDevice& d) {
        void* s = stream(5);
        std::vector<float> b1(300), b2(70000), b3(5);
        auto step = [&](std::latch* busy) {
          std::vector<comm::Work> w;
          w.push_back(c.all_reduce(dev(b1), {.op = comm::ReduceOp::Avg, .stream = s}));
          w.push_back(c.all_reduce(dev(b2), {.op = comm::ReduceOp::Avg, .stream = s}));
          w.push_back(c.broadcast(dev(b3), {.stream = s}));
          if (busy) busy->count_down();
          for (auto& x : w) x.wait();
        };
        // Warm-up with the stream busy until all three ops are issued, so that their blocks are in use together:
        // the most a step can need, whatever the timing (otherwise the warm step may reuse b1's block for b3 and a
        // later, less lucky step allocate a third).
        std::latch busy(1);
        d.launch(s, [&] { busy.wait(); });
        step(&busy);
        const auto warm = c.stats();
        const auto events = d.counters().events;
        CHECK(warm.pinned_allocs >= 1);
        for (int i = 0; i < 5; ++i) step(nullptr);
        const auto after = c.stats();
        CHECK(after.pinned_allocs == warm.pinned_allocs);
        CHECK(after.pinned_bytes == warm.pinned_bytes);
        CHECK(after.reuses >= warm.reuses + 15);
        CHECK(d.counters().pinned_allocs == warm.pinned_allocs);
        CHECK(d.counters().events == events);  // events travel with their block
      }, kOpts, memory_wait));
    }
  }

  TEST_CASE("staged: a failed inner op fails the Work with its error, releases the stream, and breaks the communicator") {
    auto errors = run_staged(2, [](Staged& c, FakeDevice& d) {
      void* s = stream(4);
      std::vector<float> v(c.rank() == 1 ? 5 : 4, 1.0f);
      comm::Work w = c.all_reduce(dev(v), {.stream = s});
      bool later_ran = false;
      d.launch(s, [&] { later_ran = true; });
      CHECK_THROWS_WITH_AS(w.wait(), doctest::Contains("all_reduce #1"), CommError);
      d.sync(s);  // the stream was released
      CHECK(later_ran);
      // The next call fails at once, quoting the first failure, and holds no stream.
      const auto holds = d.counters().holds;
      comm::Work next = c.barrier({.stream = s});
      CHECK(next.is_completed());
      CHECK_THROWS_WITH_AS(next.wait(), doctest::Contains("barrier #2 was not run: this communicator failed earlier"),
                           CommError);
      CHECK(d.counters().holds == holds);
      throw std::runtime_error("done");
    }, {.timeout = 2000ms, .shutdown_timeout = 1000ms});
    for (const auto& e : errors) CHECK(test::message(e) == "done");
  }

  TEST_CASE("staged: a stream that never reaches the op is a TimeoutError within the op's timeout, not a hang") {
    check_no_errors(run_staged(1, [](Staged& c, FakeDevice& d) {
      void* s = stream(6);
      std::latch stuck(1);
      d.launch(s, [&] { stuck.wait(); });
      std::vector<float> v(4, 1.0f);
      const auto t0 = std::chrono::steady_clock::now();
      comm::Work w = c.all_reduce(dev(v), {.timeout = 150ms, .stream = s});
      CHECK_THROWS_WITH_AS(w.wait(), doctest::Contains("all_reduce #1 (F32 x 4) timed out after 150 ms before it started"),
                           TimeoutError);
      CHECK(std::chrono::steady_clock::now() - t0 < 2s);
      CHECK_THROWS_WITH_AS(c.all_reduce(dev(v), {.stream = s}).wait(), doctest::Contains("failed earlier"), CommError);
      stuck.count_down();
      d.sync(s);  // the hold was opened: the stream runs on
    }));
  }

  TEST_CASE("staged: a group over the inner communicator's group") {
    check_no_errors(run_staged(3, [](Staged& c, FakeDevice&) {
      std::vector<float> v(6, static_cast<float>(c.rank()));
      c.all_reduce(dev(v), {.stream = stream(2)}).wait();  // ordered before the group's creation
      auto g = c.new_group({0, 2});
      if (c.rank() == 1) {
        CHECK(g == nullptr);
        return;
      }
      REQUIRE(g != nullptr);
      CHECK(g->memory() == comm::MemoryKind::Cuda);
      std::vector<float> w(3, static_cast<float>(c.rank()));
      g->all_reduce(dev(w), {.stream = stream(2)}).wait();
      CHECK(w == std::vector<float>(3, 2.0f));
    }));
  }

  TEST_CASE("staged: destruction with ops in flight completes them; argument and setup errors") {
    check_no_errors(run_staged(2, [](Staged& c, FakeDevice&) {
      std::vector<float> host(3, 1.0f);
      CHECK_THROWS_WITH_AS(c.all_reduce(std::span(host)),
                           doctest::Contains("all_reduce got host memory, but the tcp backend reaches CUDA device memory"),
                           ValueError);
    }));
    std::vector<std::vector<float>> bufs(2, std::vector<float>(20000, 1.0f));
    std::vector<comm::Work> works(2);
    check_no_errors(run_staged(2, [&](Staged& c, FakeDevice&) {
      works[static_cast<std::size_t>(c.rank())] = c.all_reduce(dev(bufs[static_cast<std::size_t>(c.rank())]),
                                                               {.stream = stream(1)});
    }));  // destroyed right after the call
    for (auto& w : works) {
      CHECK(w.is_completed());
      CHECK_NOTHROW(w.wait());
    }
    CHECK(bufs[0][19999] == 2.0f);
    CHECK(bufs[1][0] == 2.0f);

    store::HashStore store(std::chrono::seconds(5));
    FakeDevice d;
    auto staged = std::make_unique<Staged>(
        std::make_unique<comm::TcpCommunicator>(env::LaunchInfo{.rank = 0, .world_size = 1, .master_addr = "127.0.0.1"},
                                                store, kOpts),
        d, kOpts);
    CHECK_THROWS_WITH_AS(Staged(std::move(staged), d, kOpts),
                         doctest::Contains("the tcp backend reaches CUDA device memory itself; use it directly"),
                         ConfigError);
  }
}
