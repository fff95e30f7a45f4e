// data: DistributedSampler (PyTorch's padding/striding semantics, our shuffle) and EvalSampler.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ddp/data/distributed_sampler.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

using ddp::data::DistributedSampler;
using ddp::data::EvalSampler;
using V = std::vector<std::int64_t>;

TEST_SUITE("data") {
  TEST_CASE("sampler: the worked example (N=10, R=4) pads from the head and strides") {
    std::vector<V> want = {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}};
    for (int r = 0; r < 4; ++r) {
      DistributedSampler s(10, {.num_replicas = 4, .rank = r, .shuffle = false});
      CHECK(s.num_samples() == 3);
      CHECK(s.total_size() == 12);
      CHECK(s.size() == 3);
      CHECK(s.indices() == want[static_cast<std::size_t>(r)]);
    }
    DistributedSampler d(10, {.num_replicas = 4, .rank = 3, .shuffle = false, .drop_last = true});
    CHECK(d.num_samples() == 2);
    CHECK(d.indices() == V{3, 7});
  }

  TEST_CASE("sampler: padding repeats the whole list when it exceeds N") {
    // N = 2, R = 7: num_samples 1, total 7, list 0 1 0 1 0 1 0.
    V all;
    for (int r = 0; r < 7; ++r) {
      DistributedSampler s(2, {.num_replicas = 7, .rank = r, .shuffle = false});
      auto i = s.indices();
      REQUIRE(i.size() == 1);
      all.push_back(i[0]);
    }
    CHECK(all == V{0, 1, 0, 1, 0, 1, 0});
    DistributedSampler d(2, {.num_replicas = 7, .rank = 0, .drop_last = true});
    CHECK(d.size() == 0);
    CHECK(d.indices().empty());
    DistributedSampler e(0, {.num_replicas = 3, .rank = 1});
    CHECK(e.indices().empty());
  }

  TEST_CASE("sampler: with shuffle, ranks are disjoint, cover everything, and padding counts are right") {
    for (std::size_t n : {1u, 7u, 100u, 101u, 1000u}) {
      for (int world : {1, 2, 3, 8}) {
        for (bool drop : {false, true}) {
          std::map<std::int64_t, int> count;
          std::size_t total = 0;
          for (int r = 0; r < world; ++r) {
            DistributedSampler s(n, {.num_replicas = world, .rank = r, .seed = 5, .drop_last = drop});
            s.set_epoch(3);
            auto idx = s.indices();
            CHECK(idx.size() == s.num_samples());
            for (auto i : idx) {
              CHECK(i >= 0);
              CHECK(i < static_cast<std::int64_t>(n));
              ++count[i];
            }
            total += idx.size();
          }
          const auto w = static_cast<std::size_t>(world);
          const std::size_t expect_total = drop ? (n / w) * w : ((n + w - 1) / w) * w;
          CHECK(total == expect_total);
          std::size_t repeated = 0;
          for (auto& [i, c] : count) repeated += static_cast<std::size_t>(c - 1);
          if (drop) {
            CHECK(repeated == 0);  // no sample twice
            CHECK(count.size() == expect_total);
          } else {
            CHECK(count.size() == n);             // union == all
            CHECK(repeated == expect_total - n);  // exactly the padding
          }
        }
      }
    }
  }

  TEST_CASE("sampler: the shuffle is deterministic per (seed, epoch), differs across epochs and seeds") {
    DistributedSampler a(50, {.num_replicas = 2, .rank = 1, .seed = 42});
    DistributedSampler b(50, {.num_replicas = 2, .rank = 1, .seed = 42});
    a.set_epoch(1);
    b.set_epoch(1);
    CHECK(a.indices() == b.indices());
    CHECK(a.epoch() == 1);
    auto e1 = a.indices();
    a.set_epoch(2);
    CHECK(a.indices() != e1);
    DistributedSampler c(50, {.num_replicas = 2, .rank = 1, .seed = 43});
    c.set_epoch(1);
    CHECK(c.indices() != e1);
    // Seed s at epoch e is the permutation of seed s + e (documented).
    CHECK(a.global_indices() == ddp::data::permutation(50, 44));
    // A permutation really is one.
    auto p = ddp::data::permutation(1000, 7);
    auto sorted = p;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 0; i < sorted.size(); ++i) CHECK(sorted[i] == static_cast<std::int64_t>(i));
    CHECK(p != sorted);
  }

  TEST_CASE("sampler: Fisher-Yates over Philox gives a uniform distribution of positions") {
    // Over 6000 seeds, element 0 lands in each of 6 slots ~1000 times (chi-square, 5 dof, p = 0.001: 20.5).
    std::vector<int> where(6, 0);
    for (std::uint64_t seed = 0; seed < 6000; ++seed) {
      auto p = ddp::data::permutation(6, seed);
      for (std::size_t k = 0; k < 6; ++k)
        if (p[k] == 0) ++where[k];
    }
    double chi2 = 0;
    for (int c : where) chi2 += (c - 1000.0) * (c - 1000.0) / 1000.0;
    CHECK(chi2 < 20.5);
  }

  TEST_CASE("sampler: pinned first elements of the documented permutation") {
    // Regression pin: changing the generator or the shuffle changes every run's data order.
    CHECK(ddp::data::permutation(10, 0) == V{9, 1, 4, 5, 3, 6, 0, 8, 7, 2});
    CHECK(ddp::data::permutation(1, 0) == V{0});
    CHECK(ddp::data::permutation(0, 0).empty());
  }

  TEST_CASE("sampler: matches torch.utils.data.DistributedSampler without shuffle") {
    if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
      MESSAGE("skipped: /usr/bin/python3 cannot import torch");
      return;
    }
    const std::string out =
        (std::filesystem::temp_directory_path() / ("ddp_sampler_ref_" + std::to_string(::getpid()) + ".json")).string();
    const std::string py =
        "import json, torch\n"
        "from torch.utils.data import DistributedSampler\n"
        "res = {}\n"
        "for n in [1, 5, 10, 17, 64]:\n"
        "  for w in [1, 2, 3, 4, 7, 20]:\n"
        "    for drop in [0, 1]:\n"
        "      res[f'{n},{w},{drop}'] = [list(DistributedSampler(range(n), num_replicas=w, rank=r, shuffle=False,"
        " drop_last=bool(drop))) for r in range(w)]\n"
        "print(json.dumps(res))\n";
    const std::string script = out + ".py";
    std::ofstream(script) << py;
    REQUIRE(std::system(("/usr/bin/python3 " + script + " > " + out).c_str()) == 0);
    std::ifstream in(out);
    auto j = nlohmann::json::parse(in);
    int cases = 0;
    for (auto it = j.begin(); it != j.end(); ++it) {
      std::size_t n = 0;
      int w = 0, drop = 0;
      REQUIRE(std::sscanf(it.key().c_str(), "%zu,%d,%d", &n, &w, &drop) == 3);
      for (int r = 0; r < w; ++r) {
        DistributedSampler s(n, {.num_replicas = w, .rank = r, .shuffle = false, .drop_last = drop != 0});
        CHECK_MESSAGE(s.indices() == it.value()[static_cast<std::size_t>(r)].get<V>(), it.key(), " rank ", r);
        ++cases;
      }
    }
    CHECK(cases > 100);
    std::filesystem::remove(out);
    std::filesystem::remove(script);
  }

  TEST_CASE("sampler: bad world size or rank is a ValueError naming RANK/WORLD_SIZE") {
    CHECK_THROWS_WITH_AS(DistributedSampler(10, {.num_replicas = 2, .rank = 2}),
                         "ddp: DistributedSampler: rank 2 is outside [0, 2); pass the global rank (RANK) and the world "
                         "size (WORLD_SIZE)",
                         ddp::ValueError);
    CHECK_THROWS_WITH_AS(
        DistributedSampler(10, {.num_replicas = 0, .rank = 0}),
        "ddp: DistributedSampler: num_replicas is 0 but must be >= 1; pass the world size (WORLD_SIZE)",
        ddp::ValueError);
    CHECK_THROWS_WITH_AS(EvalSampler(10, 2, -1),
                         "ddp: EvalSampler: rank -1 is outside [0, 2); pass the global rank (RANK) and the world size "
                         "(WORLD_SIZE)",
                         ddp::ValueError);
  }

  TEST_CASE("eval sampler: every sample exactly once across ranks, unpadded") {
    for (std::size_t n : {0u, 1u, 9u, 10u, 11u, 103u}) {
      for (int w : {1, 2, 4, 16}) {
        std::vector<int> seen(n, 0);
        for (int r = 0; r < w; ++r) {
          EvalSampler s(n, w, r);
          s.set_epoch(5);
          auto idx = s.indices();
          CHECK(idx.size() == s.size());
          CHECK(std::is_sorted(idx.begin(), idx.end()));
          for (auto i : idx) ++seen[static_cast<std::size_t>(i)];
        }
        for (int c : seen) CHECK(c == 1);
      }
    }
    CHECK(EvalSampler(10, 4, 0).indices() == V{0, 4, 8});
    CHECK(EvalSampler(10, 4, 3).indices() == V{3, 7});
  }
}
