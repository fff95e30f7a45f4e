// train::Bookkeeper on 2 ranks with a fake clock: step and global_step numbering (0- and 1-based epochs, a resumed
// run), samples_per_sec and tokens_per_sec from the counts and the clock, step_ms and data_ms, rank 0's progress
// lines and metrics records only, the snapshot cadence and after_snapshot_hook, --trace's step numbering, the totals.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <ddp/train/bookkeeper.hpp>

#include "../../support/temp_dir.hpp"
#include "../parallel/parallel_test_util.hpp"  // run_ranks, check_all_ok

using namespace ddp;
using namespace std::chrono_literals;

namespace test_bookkeeper {

// Each rank's thread its own fake clock, advanced by the test only.
thread_local Clock::duration fake_elapsed{};
Clock::time_point fake_now() { return Clock::time_point{} + fake_elapsed; }

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// Sets after_snapshot_hook for one test and clears it after (it is the process's).
struct HookGuard {
  explicit HookGuard(std::function<void(comm::Communicator&, long)> f) { train::after_snapshot_hook() = std::move(f); }
  ~HookGuard() { train::after_snapshot_hook() = nullptr; }
  HookGuard(const HookGuard&) = delete;
  HookGuard& operator=(const HookGuard&) = delete;
};

}  // namespace test_bookkeeper

TEST_SUITE("train") {
  TEST_CASE("Bookkeeper: 2 ranks x 3 epochs x 4 steps of 8 samples, 10 ms data wait + 90 ms compute per step") {
    using test_bookkeeper::fake_elapsed;
    test::TempDir dir("ddp_bookkeeper_");
    const std::string metrics = dir.file("m.jsonl");
    std::vector<std::string> out(2);
    std::vector<train::RunTotals> totals(2);
    std::vector<std::vector<long>> saved(2);
    std::mutex m;
    std::set<std::pair<int, long>> hooked;  // (rank, epoch)
    test_bookkeeper::HookGuard guard([&](comm::Communicator& c, long epoch) {
      std::lock_guard lock(m);
      hooked.insert({c.rank(), epoch});
    });
    auto errors = test::run_ranks(2, [&](comm::TcpCommunicator& c) {
      fake_elapsed = {};
      Exec<Cpu> exec;
      std::ostringstream progress;
      train::Bookkeeper<Cpu> book(c, exec,
                                  {.steps_per_epoch = 4, .first_epoch = 0, .last_epoch = 2, .save_every = 2,
                                   .log_every = 2, .metrics_file = metrics, .live = false, .out = &progress,
                                   .now = &test_bookkeeper::fake_now});
      const parallel::StepTrace no_comm;  // before any synchronised step: no comm_ms fields
      for (long epoch = 0; epoch <= 2; ++epoch) {
        book.start_epoch(epoch);
        for (int k = 0; k < 4; ++k) {
          fake_elapsed += 10ms;
          book.got_batch();
          fake_elapsed += 90ms;
          book.end_step({.loss = 0.5, .lr = 0.1, .samples = 8, .grad_norm = k == 0 ? 2.0 : -1.0}, no_comm);
        }
        const double secs = book.end_epoch(epoch, [&] { saved[static_cast<std::size_t>(c.rank())].push_back(epoch); });
        CHECK(secs == doctest::Approx(0.4));
      }
      totals[static_cast<std::size_t>(c.rank())] = book.finish();
      out[static_cast<std::size_t>(c.rank())] = progress.str();
    });
    test::check_all_ok(errors);

    // Snapshots after epochs 0 (0 % 2) and 2 (the last), on both ranks, each followed by the hook on both ranks.
    CHECK(saved[0] == std::vector<long>{0, 2});
    CHECK(saved[1] == std::vector<long>{0, 2});
    CHECK(hooked == std::set<std::pair<int, long>>{{0, 0}, {1, 0}, {0, 2}, {1, 2}});

    // samples_per_sec: 2 ranks x 8 samples per 0.1 s = 160 at every step; 12 steps, 192 samples in 1.2 s.
    for (const auto& t : totals) {
      CHECK(t.steps == 12);
      CHECK(t.samples == 192.0);
      CHECK(t.seconds == doctest::Approx(1.2));
      CHECK(t.samples_per_sec() == doctest::Approx(160.0));
      CHECK(t.tokens_per_sec() == 0.0);
    }

    // Rank 0 prints every 2nd step (the 4th is also the epoch's last); the ETA from 0.1 s per step of 12.
    CHECK(out[1].empty());
    std::vector<std::string> lines;
    std::istringstream in(out[0]);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    REQUIRE(lines.size() == 6);
    CHECK(lines[0] == "epoch 0 step 2/4 loss 0.5000 samples/s 160.0 lr 0.1 eta 0:01");
    CHECK(lines[5] == "epoch 2 step 4/4 loss 0.5000 samples/s 160.0 lr 0.1 eta 0:00");

    // Rank 0's records only: step 1-based in the epoch, global_step over the run, the step's timings.
    const auto records = test_bookkeeper::read_lines(metrics);
    REQUIRE(records.size() == 12);
    for (std::size_t i = 0; i < records.size(); ++i) {
      const auto& r = records[i];
      INFO("record ", i, ": ", r.dump());
      CHECK(r["epoch"] == static_cast<long>(i / 4));
      CHECK(r["step"] == static_cast<long>(i % 4 + 1));
      CHECK(r["global_step"] == static_cast<long>(i + 1));
      CHECK(r["samples_per_sec"].get<double>() == doctest::Approx(160.0));
      CHECK(r["step_ms"].get<double>() == doctest::Approx(100.0));
      CHECK(r["data_ms"].get<double>() == doctest::Approx(10.0));
      CHECK(r["lr"].get<double>() == doctest::Approx(0.1));
      CHECK(r.contains("grad_norm") == (i % 4 == 0));
      CHECK(!r.contains("comm_ms"));
      CHECK(!r.contains("tokens_per_sec"));
    }
  }

  TEST_CASE("Bookkeeper: epochs from 1, resumed at epoch 3 of 4: global steps continue, tokens/s, extra fields") {
    using test_bookkeeper::fake_elapsed;
    test::TempDir dir("ddp_bookkeeper_");
    const std::string metrics = dir.file("m.jsonl"), trace = dir.file("trace.json");
    std::vector<std::vector<long>> saved(2);
    std::vector<train::RunTotals> totals(2);
    auto errors = test::run_ranks(2, [&](comm::TcpCommunicator& c) {
      fake_elapsed = {};
      Exec<Cpu> exec;
      std::ostringstream progress;
      // Epochs 1..4, epochs 1 and 2 done before: this run trains epochs 3 and 4 (5 steps each), no data_ms; the
      // trace covers global steps 12..13 (epoch 3's steps 2 and 3).
      train::Bookkeeper<Cpu> book(c, exec,
                                  {.steps_per_epoch = 5, .first_epoch = 3, .last_epoch = 4, .epoch_base = 1,
                                   .save_every = 3, .progress_lines = false, .data_ms = false,
                                   .metrics_file = metrics, .trace = {.path = trace, .first = 12, .last = 13},
                                   .live = false, .out = &progress, .now = &test_bookkeeper::fake_now});
      const parallel::StepTrace no_comm;
      for (long epoch = 3; epoch <= 4; ++epoch) {
        book.start_epoch(epoch);
        for (int k = 0; k < 5; ++k) {
          CHECK(book.got_batch() == (epoch - 1) * 5 + k + 1);
          fake_elapsed += 250ms;
          // 4 samples of 16 tokens per rank.
          book.end_step({.loss = 1.0, .lr = 3e-4, .samples = 4, .tokens = 64, .extra = {{"skipped", false}}}, no_comm);
        }
        book.end_epoch(epoch, [&] { saved[static_cast<std::size_t>(c.rank())].push_back(epoch); });
      }
      totals[static_cast<std::size_t>(c.rank())] = book.finish();
      CHECK(progress.str().empty());  // no plain lines, not live
    });
    test::check_all_ok(errors);
    // Epoch 3 (3 % 3) and 4 (the last).
    CHECK(saved[0] == std::vector<long>{3, 4});
    CHECK(totals[0].tokens == 2.0 * 10 * 64);
    CHECK(totals[0].tokens_per_sec() == doctest::Approx(2.0 * 64 / 0.25));

    const auto records = test_bookkeeper::read_lines(metrics);
    REQUIRE(records.size() == 10);
    CHECK(records.front()["global_step"] == 11);
    CHECK(records.back()["global_step"] == 20);
    CHECK(records.back()["step"] == 5);
    for (const auto& r : records) {
      CHECK(r["samples_per_sec"].get<double>() == doctest::Approx(2.0 * 4 / 0.25));
      CHECK(r["tokens_per_sec"].get<double>() == doctest::Approx(2.0 * 64 / 0.25));
      CHECK(r["skipped"] == false);
      CHECK(!r.contains("data_ms"));
      CHECK(!r.contains("grad_norm"));
    }

    // The trace's steps are the same global steps: "step 12" and "step 13" on both ranks, nothing else.
    std::ifstream in(trace);
    REQUIRE(in.good());
    const auto doc = nlohmann::json::parse(in);
    std::set<std::pair<int, std::string>> steps;
    for (const auto& e : doc["traceEvents"])
      if (e.value("cat", "") == "step") steps.insert({e["pid"].get<int>(), e["name"].get<std::string>()});
    CHECK(steps == std::set<std::pair<int, std::string>>{{0, "step 12"}, {0, "step 13"}, {1, "step 12"}, {1, "step 13"}});
  }

  TEST_CASE("Bookkeeper::snapshot_due: every save_every-th epoch and the last") {
    std::vector<long> due;
    auto errors = test::run_ranks(1, [&](comm::TcpCommunicator& c) {
      Exec<Cpu> exec;
      train::Bookkeeper<Cpu> book(c, exec, {.steps_per_epoch = 1, .first_epoch = 0, .last_epoch = 7, .save_every = 3,
                                            .live = false});
      for (long e = 0; e <= 7; ++e)
        if (book.snapshot_due(e)) due.push_back(e);
    });
    test::check_all_ok(errors);
    CHECK(due == std::vector<long>{0, 3, 6, 7});
  }
}
