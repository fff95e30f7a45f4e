// DataLoader with several worker threads (num_workers, for decoding ImageFolder JPEGs in parallel): batches
// arrive in order with the same content as with one worker, at most `prefetch` batches ahead, and a failing
// batch still ends the epoch after the earlier batches, whichever worker hit it.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <ddp/data/distributed_sampler.hpp>
#include <ddp/data/loader.hpp>

using namespace ddp;
using namespace ddp::data;

namespace {

// Image i holds i + 1000 * epoch; label i % 5; get_into sleeps so that workers overlap; throws at throw_at.
class SlowDataset : public Dataset {
 public:
  explicit SlowDataset(std::size_t n, std::int64_t throw_at = -1) : n_(n), throw_at_(throw_at) {}
  std::size_t size() const override { return n_; }
  ImageShape image_shape() const override { return {.height = 1, .width = 2, .channels = 3}; }
  std::int64_t num_classes() const override { return 5; }
  std::int64_t get_into(std::size_t index, std::uint64_t epoch, std::span<float> image) const override {
    const int now = in_flight.fetch_add(1) + 1;
    int seen = max_in_flight.load();
    while (now > seen && !max_in_flight.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    in_flight.fetch_sub(1);
    calls.fetch_add(1);
    if (static_cast<std::int64_t>(index) == throw_at_)
      throw IoError("ddp: sample " + std::to_string(index) + " is broken");
    for (auto& v : image) v = static_cast<float>(index) + 1000.0f * static_cast<float>(epoch);
    return static_cast<std::int64_t>(index % 5);
  }
  mutable std::atomic<int> calls{0}, in_flight{0}, max_in_flight{0};

 private:
  std::size_t n_;
  std::int64_t throw_at_;
};

}  // namespace

TEST_CASE("loader num_workers: same batches in the same order as one worker, workers overlap") {
  SlowDataset ds(103);
  for (std::size_t workers : {1u, 3u, 8u}) {
    DistributedSampler sampler(103, {.num_replicas = 1, .rank = 0, .seed = 5});
    DataLoader loader(ds, sampler, {.batch_size = 4, .prefetch = 4, .num_workers = workers});
    for (std::uint64_t epoch : {0u, 1u}) {
      loader.start_epoch(epoch);
      std::vector<std::int64_t> seen;
      std::size_t step = 0;
      while (auto b = loader.next()) {
        CHECK(b->step == step++);
        for (std::size_t k = 0; k < b->size(); ++k) {
          CHECK(b->images.data()[k * 6] == static_cast<float>(b->indices[k]) + 1000.0f * static_cast<float>(epoch));
          CHECK(b->labels.data()[k] == b->indices[k] % 5);
        }
        seen.insert(seen.end(), b->indices.begin(), b->indices.end());
      }
      CHECK(step == 26);
      CHECK(seen == sampler.indices());
    }
  }
  CHECK(ds.max_in_flight.load() > 1);  // several workers did decode at the same time
  DistributedSampler sampler(103, {.shuffle = false});
  CHECK_THROWS_AS(DataLoader(ds, sampler, {.batch_size = 4, .num_workers = 0}), ValueError);
}

TEST_CASE("loader num_workers: bounded to prefetch batches ahead; an error after the earlier batches") {
  {
    SlowDataset ds(1000);
    DistributedSampler sampler(1000, {.shuffle = false});
    DataLoader loader(ds, sampler, {.batch_size = 10, .prefetch = 3, .num_workers = 6});
    loader.start_epoch(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // 3 batches of 10 x 0.3 ms are long done
    CHECK(ds.calls.load() == 30);
    CHECK(loader.next()->indices.front() == 0);
  }  // destructor joins the six workers
  SlowDataset bad(40, /*throw_at*/ 21);
  DistributedSampler sampler(40, {.shuffle = false});
  DataLoader loader(bad, sampler, {.batch_size = 4, .prefetch = 8, .num_workers = 4});
  loader.start_epoch(0);
  for (std::int64_t b = 0; b < 5; ++b) {  // batches 0..4 hold 0..19; batch 5 holds 20..23
    auto batch = loader.next();
    REQUIRE(batch.has_value());
    CHECK(batch->indices.front() == 4 * b);
  }
  CHECK_THROWS_WITH_AS(loader.next(), "ddp: sample 21 is broken", IoError);
  CHECK_FALSE(loader.next().has_value());
  loader.start_epoch(1);  // a new epoch after a failure starts clean (and fails at the same batch)
  CHECK(loader.next()->indices.front() == 0);
}
