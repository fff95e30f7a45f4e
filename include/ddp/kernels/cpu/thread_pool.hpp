// ThreadPool: a persistent pool of worker threads and parallel_for over index ranges, for CPU
// kernels.
// SPDX-License-Identifier: MIT
//
// How it works. ThreadPool(t) starts t - 1 workers; the calling thread is the t-th.
// parallel_for(exec, n, grain, f) cuts [0, n) into at most t contiguous chunks of at least `grain`
// indices and calls f(begin, end, chunk) once per chunk, chunk in [0, chunks); the caller runs
// chunk 0 and waits for the rest. Example: t = 2, n = 16 images, grain 1 -> f(0, 8, 0) on the
// caller, f(8, 16, 1) on the worker. Chunking is static and deterministic, so a kernel that reduces
// per-chunk partial sums in chunk order gives the same bits on every run with the same thread
// count. A parallel_for issued from inside a chunk runs inline on that thread (no nested fan-out,
// no deadlock). One parallel_for at a time per pool: calls from several user threads are serialised
// by a mutex. The first exception thrown by a chunk is rethrown to the caller after all chunks
// finished.
#pragma once

#include <sched.h>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cpu {

// Threads to use when --threads is not given: OMP_NUM_THREADS if set (the variable PyTorch and
// OpenBLAS honour), else the CPUs this process may run on (its affinity mask, which respects
// taskset and container cpusets), else hardware_concurrency(). `omp_num_threads` is the variable's
// value (nullptr when unset) so tests can inject it; a bad value is a ConfigError.
inline int default_num_threads(const char* omp_num_threads = std::getenv("OMP_NUM_THREADS")) {
  if (omp_num_threads && *omp_num_threads) {
    char* end = nullptr;
    const long v = std::strtol(omp_num_threads, &end, 10);
    if (*end != '\0' || v < 1 || v > 4096)
      throw ConfigError(detail::str(
          "ddp: OMP_NUM_THREADS=", detail::quoted(omp_num_threads),
          " is not a thread count (an integer from 1 to 4096); unset it or pass --threads N"));
    return static_cast<int>(v);
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

class ThreadPool {
 public:
  // threads >= 1 (the caller counts as one). Throws ValueError otherwise.
  explicit ThreadPool(int threads) : threads_(threads) {
    if (threads < 1 || threads > 4096)
      throw ValueError(detail::str("ddp: ThreadPool needs 1 to 4096 threads, got ", threads,
                                   "; check --threads"));
    workers_.reserve(static_cast<std::size_t>(threads - 1));
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }

  int threads() const noexcept { return threads_; }

  // Runs f(chunk) for chunk in [0, chunks) across the pool; blocks until all are done.
  void run(int chunks, const std::function<void(int)>& f) {
    if (chunks <= 0) return;
    if (chunks == 1 || threads_ == 1 || in_worker()) {
      for (int c = 0; c < chunks; ++c) f(c);
      return;
    }
    std::lock_guard<std::mutex> serial(run_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &f;
      chunks_ = chunks;
      next_ = 1;  // chunk 0 is the caller's
      pending_ = chunks;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    run_chunk(f, 0);
    for (;;) {  // the caller helps with chunks no worker has taken yet
      int c;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (next_ >= chunks_) break;
        c = next_++;
      }
      run_chunk(f, c);
    }
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return pending_ == 0; });
    job_ = nullptr;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  static bool& in_worker() {
    thread_local bool flag = false;
    return flag;
  }
  void run_chunk(const std::function<void(int)>& f, int c) {
    const bool was = in_worker();
    in_worker() = true;
    try {
      f(c);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
    in_worker() = was;
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_ == 0) done_.notify_all();
  }
  void worker_loop() {
    std::uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || (generation_ != seen && job_ && next_ < chunks_); });
      if (stop_) return;
      seen = generation_;
      while (job_ && next_ < chunks_) {
        const int c = next_++;
        const auto* f = job_;
        lock.unlock();
        run_chunk(*f, c);
        lock.lock();
      }
    }
  }

  int threads_;
  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // one run() at a time
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  int chunks_ = 0, next_ = 0, pending_ = 0;
  std::uint64_t generation_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
};

// Threads available to kernels run with `exec` (1 without a pool).
inline int num_threads(const Exec<Cpu>& exec) noexcept {
  return exec.pool ? exec.pool->threads() : 1;
}

// Calls f(begin, end, chunk) over [0, n) in at most num_threads(exec) chunks of >= grain indices
// each.
template <class F>
void parallel_for(const Exec<Cpu>& exec, std::int64_t n, std::int64_t grain, F&& f) {
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  const std::int64_t max_chunks = std::max<std::int64_t>(1, n / grain);
  const int chunks = static_cast<int>(std::min<std::int64_t>(num_threads(exec), max_chunks));
  if (chunks == 1) {
    f(std::int64_t{0}, n, 0);
    return;
  }
  exec.pool->run(chunks, [&](int c) {
    const std::int64_t begin = n * c / chunks, end = n * (c + 1) / chunks;
    f(begin, end, c);
  });
}

// f(i) for i in [0, n) in contiguous chunks of at least 16 Ki indices over the pool (f must not
// depend on the order): the CPU's runner of the element-wise functors (kernels/elementwise.hpp),
// what Kernels<Cpu>::for_each_index forwards to, as Kernels<Cuda>'s forwards to
// cuda::for_each_index.
template <class F>
void for_each_index(const Exec<Cpu>& exec, std::size_t n, F f) {
  parallel_for(exec, static_cast<std::int64_t>(n), 1 << 14,
               [&](std::int64_t b, std::int64_t e, int) {
                 for (auto i = static_cast<std::size_t>(b); i < static_cast<std::size_t>(e); ++i)
                   f(i);
               });
}

}  // namespace ddp::kernels::cpu
