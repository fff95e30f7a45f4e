// Which dataset indices each rank visits per epoch: DistributedSampler (PyTorch's semantics,
// padded) and EvalSampler (every sample exactly once across ranks, unpadded).
// SPDX-License-Identifier: MIT
//
// DistributedSampler, torch.utils.data.DistributedSampler's arithmetic (N = dataset size,
// R = num_replicas):
//   num_samples = ceil(N / R)            (drop_last: floor(N / R), the tail is dropped)
//   total_size  = num_samples * R
//   indices     = shuffle ? permutation(N, seed + epoch) : [0, 1, ..., N-1]
//   padding     = the list's head, repeated as often as needed, up to total_size entries
//                 (drop_last: truncated to total_size instead)
//   rank r gets indices[r], indices[r + R], indices[r + 2R], ...  (num_samples of them)
// Example, N = 10, R = 4, no shuffle: the padded list is 0 1 2 3 4 5 6 7 8 9 0 1, so rank 0 gets
// {0, 4, 8}, rank 1 {1, 5, 9}, rank 2 {2, 6, 0}, rank 3 {3, 7, 1}. With drop_last: rank 0 {0, 4},
// rank 3 {3, 7}; 8 and 9 are skipped.
//
// The shuffle is OUR permutation, not torch.randperm's (the same seed gives another order): an
// unbiased Fisher-Yates shuffle on ddp's Philox generator,
//   g = Generator(seed + epoch, /*rank*/ 0, kStreamShuffle);  p = [0, 1, ..., N-1]
//   for i = N-1 down to 1:  j = g.uniform_int(i + 1); swap(p[i], p[j])
// Every rank computes the same permutation (rank 0's stream on purpose), so the strided split is a
// partition.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/tensor/random.hpp"

namespace ddp::data {

// The permutation of the file comment.
inline std::vector<std::int64_t> permutation(std::size_t n, std::uint64_t seed) {
  std::vector<std::int64_t> p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::int64_t>(i);
  Generator g(seed, 0, kStreamShuffle);
  for (std::size_t i = n; i > 1; --i) {
    const auto j = static_cast<std::size_t>(g.uniform_int(i));  // j in [0, i-1]
    std::swap(p[i - 1], p[j]);
  }
  return p;
}

// What a loader needs from a sampler: this rank's indices for the current epoch. Not thread-safe;
// call set_epoch between epochs from the training thread.
class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual void set_epoch(std::uint64_t epoch) = 0;
  virtual std::uint64_t epoch() const = 0;
  virtual std::size_t size() const = 0;
  virtual std::vector<std::int64_t> indices() const = 0;  // this rank's indices, in visiting order
};

struct SamplerOptions {
  int num_replicas = 1;  // world size (WORLD_SIZE)
  int rank = 0;          // global rank (RANK), in [0, num_replicas)
  bool shuffle = true;
  std::uint64_t seed = 0;  // must be equal on every rank
  // drop the tail instead of padding, so no sample is seen twice in an epoch
  bool drop_last = false;
};

namespace detail {
inline void check_replicas(const char* who, std::size_t n, int num_replicas, int rank) {
  (void)n;
  if (num_replicas < 1)
    throw ValueError(ddp::detail::str("ddp: ", who, ": num_replicas is ", num_replicas,
                                      " but must be >= 1; pass the world size (WORLD_SIZE)"));
  if (rank < 0 || rank >= num_replicas)
    throw ValueError(
        ddp::detail::str("ddp: ", who, ": rank ", rank, " is outside [0, ", num_replicas,
                         "); pass the global rank (RANK) and the world size (WORLD_SIZE)"));
}
}  // namespace detail

class DistributedSampler : public Sampler {
 public:
  // Throws ValueError for num_replicas < 1 or a rank outside [0, num_replicas).
  DistributedSampler(std::size_t dataset_size, const SamplerOptions& options)
      : n_(dataset_size), o_(options) {
    detail::check_replicas("DistributedSampler", n_, o_.num_replicas, o_.rank);
    const auto r = static_cast<std::size_t>(o_.num_replicas);
    num_samples_ = o_.drop_last ? n_ / r : (n_ + r - 1) / r;
    total_size_ = num_samples_ * r;
  }

  void set_epoch(std::uint64_t epoch) override { epoch_ = epoch; }
  std::uint64_t epoch() const override { return epoch_; }
  std::size_t size() const override { return num_samples_; }
  std::size_t num_samples() const { return num_samples_; }
  std::size_t total_size() const { return total_size_; }
  std::size_t dataset_size() const { return n_; }
  const SamplerOptions& options() const { return o_; }

  // All ranks' indices before the strided split, padded or truncated to total_size.
  std::vector<std::int64_t> global_indices() const {
    std::vector<std::int64_t> all =
        o_.shuffle ? permutation(n_, o_.seed + epoch_) : permutation_identity();
    if (total_size_ <= n_) {
      all.resize(total_size_);
    } else {
      all.reserve(total_size_);
      // repeat from the head
      for (std::size_t i = n_; i < total_size_; ++i) all.push_back(all[(i - n_) % n_]);
    }
    return all;
  }

  std::vector<std::int64_t> indices() const override {
    const auto all = global_indices();
    std::vector<std::int64_t> mine;
    mine.reserve(num_samples_);
    for (std::size_t i = static_cast<std::size_t>(o_.rank); i < total_size_;
         i += static_cast<std::size_t>(o_.num_replicas))
      mine.push_back(all[i]);
    return mine;
  }

 private:
  std::vector<std::int64_t> permutation_identity() const {
    std::vector<std::int64_t> p(n_);
    for (std::size_t i = 0; i < n_; ++i) p[i] = static_cast<std::int64_t>(i);
    return p;
  }

  std::size_t n_;
  SamplerOptions o_;
  std::size_t num_samples_ = 0;
  std::size_t total_size_ = 0;
  std::uint64_t epoch_ = 0;
};

// Evaluation: rank r gets r, r + R, r + 2R, ... < N, in order; no padding, no shuffle, so every
// sample is seen once and metrics summed over ranks are exact. Ranks may differ in count by one
// (N = 10, R = 4: 3, 3, 2, 2): per-rank loops must not assume equal batch counts.
class EvalSampler : public Sampler {
 public:
  EvalSampler(std::size_t dataset_size, int num_replicas, int rank)
      : n_(dataset_size), num_replicas_(num_replicas), rank_(rank) {
    detail::check_replicas("EvalSampler", n_, num_replicas, rank);
  }
  // kept for the interface; order is fixed
  void set_epoch(std::uint64_t epoch) override { epoch_ = epoch; }
  std::uint64_t epoch() const override { return epoch_; }
  std::size_t size() const override {
    const auto r = static_cast<std::size_t>(rank_), w = static_cast<std::size_t>(num_replicas_);
    return n_ > r ? (n_ - r + w - 1) / w : 0;
  }
  std::vector<std::int64_t> indices() const override {
    std::vector<std::int64_t> mine;
    mine.reserve(size());
    for (std::size_t i = static_cast<std::size_t>(rank_); i < n_;
         i += static_cast<std::size_t>(num_replicas_))
      mine.push_back(static_cast<std::int64_t>(i));
    return mine;
  }

 private:
  std::size_t n_;
  int num_replicas_;
  int rank_;
  std::uint64_t epoch_ = 0;
};

}  // namespace ddp::data
