// DataLoader: batches of a Dataset in a Sampler's order, assembled ahead on background threads.
// SPDX-License-Identifier: MIT
//
//   DataLoader loader(dataset, sampler, {.batch_size = 32, .prefetch = 2});
//   for (std::uint64_t epoch = start; epoch < epochs; ++epoch) {
//     loader.start_epoch(epoch);                  // sampler.set_epoch(epoch), workers start
//     while (auto batch = loader.next()) step(batch->images, batch->labels);
//   }
// start_epoch() cuts this rank's indices into batches of batch_size (the last one smaller unless
// drop_last; 10 indices, batch_size 4: 4, 4, 2, or 4, 4) and starts `num_workers` threads that
// take batch numbers in order and assemble them (make_batch). At most `prefetch` batches are ahead
// of the consumer (queued or being assembled; a worker blocks otherwise), so memory is bounded by
// prefetch + 1 batches and num_workers > prefetch leaves workers idle. next() returns the batches
// in order, waiting if needed, and nullopt at the end of the epoch. If a worker throws (a corrupt
// file, a bad index), the batches before the failed one are delivered, then next() rethrows on the
// calling thread. start_epoch() during an epoch and the destructor stop the workers (each finishes
// at most its current batch) and join them: never a detached thread.
// Thread-safety: one consumer thread calls start_epoch/next; Dataset::get_into runs on the
// workers, concurrently when num_workers > 1, and must allow that.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/data/dataset.hpp"
#include "ddp/data/distributed_sampler.hpp"

namespace ddp::data {

struct LoaderOptions {
  std::size_t batch_size = 32;
  bool drop_last = false;  // drop a final batch smaller than batch_size
  // batches assembled ahead; 0 = synchronous, no thread (assembled in next())
  std::size_t prefetch = 2;
  // threads assembling batches (with prefetch > 0); torch's num_workers
  std::size_t num_workers = 1;
};

class DataLoader {
 public:
  // The dataset and sampler must outlive the loader; ValueError for batch_size or num_workers 0.
  DataLoader(const Dataset& dataset, Sampler& sampler, const LoaderOptions& options)
      : dataset_(&dataset), sampler_(&sampler), o_(options) {
    if (o_.batch_size == 0)
      throw ValueError("ddp: DataLoader: batch_size must be >= 1, got 0; check --batch_size");
    if (o_.num_workers == 0)
      throw ValueError("ddp: DataLoader: num_workers must be >= 1 (prefetch 0 = no thread)");
  }
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;
  ~DataLoader() { stop(); }

  // Batches per epoch for the sampler's current size.
  std::size_t num_batches() const {
    const std::size_t n = sampler_->size();
    return o_.drop_last ? n / o_.batch_size : (n + o_.batch_size - 1) / o_.batch_size;
  }
  std::uint64_t epoch() const { return epoch_; }

  // Sets the sampler's epoch and starts this epoch's batches (stopping any unfinished epoch).
  void start_epoch(std::uint64_t epoch) {
    stop();
    epoch_ = epoch;
    sampler_->set_epoch(epoch);
    indices_ = sampler_->indices();
    total_ = num_batches();
    next_ = 0;
    consumed_ = 0;
    stop_ = false;
    error_ = nullptr;
    error_at_ = total_;
    done_.clear();
    started_ = true;
    if (o_.prefetch > 0)
      for (std::size_t w = 0; w < o_.num_workers; ++w) workers_.emplace_back([this] { run(); });
  }

  // The next batch of the epoch, or nullopt when it is over. Rethrows the worker's exception
  // (once). Throws ValueError when no epoch was started.
  std::optional<Batch> next() {
    if (!started_) throw ValueError("ddp: DataLoader::next() called before start_epoch(epoch)");
    if (o_.prefetch == 0) {
      if (consumed_ == total_) return std::nullopt;
      return make(consumed_++);
    }
    std::unique_lock<std::mutex> lock(mu_);
    ready_.wait(lock, [&] { return consumed_ >= error_at_ || done_.count(consumed_) != 0; });
    if (auto it = done_.find(consumed_); it != done_.end()) {
      Batch b = std::move(it->second);
      done_.erase(it);
      ++consumed_;
      space_.notify_all();
      return b;
    }
    if (error_) {
      auto e = std::exchange(error_, nullptr);
      consumed_ = error_at_ = total_;  // the epoch ends with the error
      std::rethrow_exception(e);
    }
    return std::nullopt;
  }

 private:
  Batch make(std::size_t b) const {
    const std::size_t begin = b * o_.batch_size;
    const std::size_t end = std::min(begin + o_.batch_size, indices_.size());
    return make_batch(
        *dataset_, std::span<const std::int64_t>(indices_.data() + begin, end - begin), epoch_, b);
  }

  void run() {
    for (;;) {
      std::size_t b = 0;
      {
        std::unique_lock<std::mutex> lock(mu_);
        space_.wait(lock,
                    [&] { return stop_ || next_ >= error_at_ || next_ < consumed_ + o_.prefetch; });
        if (stop_ || next_ >= error_at_) return;  // stopped, every batch taken, or a failure before
        b = next_++;
      }
      // The exception is published only after its catch block has ended, so the worker holds no
      // reference to it any more and the consumer alone owns (and frees) the exception object.
      std::exception_ptr failure;
      try {
        Batch batch = make(b);
        std::lock_guard<std::mutex> lock(mu_);
        done_.emplace(b, std::move(batch));
      } catch (...) {
        failure = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu_);
      // the earliest failed batch wins; batches before it are delivered
      if (failure && b < error_at_) {
        error_ = std::move(failure);
        error_at_ = b;
      }
      ready_.notify_one();
      if (failure) {
        space_.notify_all();  // idle workers see next_ >= error_at_ and end
        return;
      }
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    space_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  const Dataset* dataset_;
  Sampler* sampler_;
  LoaderOptions o_;
  std::uint64_t epoch_ = 0;
  std::vector<std::int64_t> indices_;  // this epoch's indices for this rank
  std::size_t total_ = 0;              // batches in this epoch
  bool started_ = false;

  std::mutex mu_;                  // guards everything below
  std::condition_variable ready_;  // a batch, an error or the end is available
  std::condition_variable space_;  // a batch may be started (fewer than prefetch ahead), or stop_
  std::map<std::size_t, Batch> done_;  // assembled batches not yet consumed, by batch number
  std::size_t next_ = 0;               // next batch number a worker takes
  std::size_t consumed_ = 0;           // batches returned by next()
  // the failed batch (error_ set), else total_: the end of the epoch
  std::size_t error_at_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> workers_;
};

}  // namespace ddp::data
