// kernels/op_profile.hpp: the op-class timeline's labels (exclusive time, nested scopes, phases) and the
// per-label sums, JSON and table that bench_resnet_gpu --profile prints; the device side only records events.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <ddp/kernels/op_profile.hpp>

namespace test_op_profile {
using ddp::kernels::kUnscoped;
using ddp::kernels::OpProfile;
using ddp::kernels::OpTimeline;
}  // namespace test_op_profile

TEST_SUITE("kernels") {
  TEST_CASE("op profile: a phase relabels the rest of its scope, a nested scope takes its time out of the outer") {
    using namespace test_op_profile;
    OpTimeline t;
    CHECK(!t.phase("orphan"));  // no scope open: nothing to record
    CHECK(t.begin("conv") == 0);
    CHECK(t.phase("fprop.cudnn"));
    CHECK(t.end() == 2);
    CHECK(t.begin("bn_forward", "stats") == 3);
    CHECK(t.begin("fill") == 4);  // nested
    CHECK(t.end() == 5);
    CHECK(t.phase("apply"));
    CHECK(t.end() == 7);
    REQUIRE(t.events() == 8);
    const std::vector<std::string> labels = {"conv",       "conv.fprop.cudnn", kUnscoped,          "bn_forward.stats",
                                             "fill",       "bn_forward.stats", "bn_forward.apply", kUnscoped};
    const std::vector<bool> calls = {true, true, false, true, true, false, true, false};
    for (std::size_t i = 0; i < t.events(); ++i) {
      CAPTURE(i);
      CHECK(t.label(i) == labels[i]);
      CHECK(t.starts_call(i) == calls[i]);
    }
    CHECK(t.open_scopes() == 0);
    CHECK_THROWS_AS(t.end(), ddp::ValueError);
  }

  TEST_CASE("op profile: sums per label over steps, most time first, in JSON and a table") {
    using namespace test_op_profile;
    OpTimeline t;
    // Two steps of: conv fprop on cuDNN (with its pre-phase stretch), then a fill, with unscoped gaps between.
    for (int step = 0; step < 2; ++step) {
      t.begin("conv");
      t.phase("fprop.cudnn");
      t.end();
      t.begin("fill");
      t.end();
    }
    REQUIRE(t.events() == 10);
    // conv, conv.fprop.cudnn, gap, fill, gap (between steps), conv, conv.fprop.cudnn, gap, fill: 9 intervals
    const std::vector<double> gaps = {0.25, 8.0, 0.5, 1.0, 2.0, 0.25, 6.0, 0.5, 3.0};
    OpProfile p;
    p.add(t, gaps, 2);
    CHECK(p.steps() == 2);
    CHECK(p.total_ms() == doctest::Approx(21.5));
    const auto e = p.entries();
    REQUIRE(e.size() == 4);
    CHECK(e[0].label == "conv.fprop.cudnn");
    CHECK(e[0].ms == doctest::Approx(14.0));
    CHECK(e[0].calls == 2);
    CHECK(e[1].label == "fill");
    CHECK(e[1].ms == doctest::Approx(4.0));
    CHECK(e[1].calls == 2);
    CHECK(e[2].label == kUnscoped);
    CHECK(e[2].ms == doctest::Approx(3.0));
    CHECK(e[2].calls == 0);
    CHECK(e[3].label == "conv");
    CHECK(e[3].ms == doctest::Approx(0.5));
    CHECK(p.json() ==
          "{\"steps\":2,\"ms_per_step\":10.75,\"classes\":{"
          "\"conv.fprop.cudnn\":{\"ms_per_step\":7,\"calls_per_step\":1,\"share\":0.651163},"
          "\"fill\":{\"ms_per_step\":2,\"calls_per_step\":1,\"share\":0.186047},"
          "\"(unscoped)\":{\"ms_per_step\":1.5,\"calls_per_step\":0,\"share\":0.139535},"
          "\"conv\":{\"ms_per_step\":0.25,\"calls_per_step\":1,\"share\":0.0232558}}}");
    const std::string table = p.table();
    CHECK(table.find("conv.fprop.cudnn                         7.000         1.0   65.1%\n") != std::string::npos);
    CHECK(table.find("total                                   10.750\n") != std::string::npos);
    // A second stretch adds to the same labels.
    OpTimeline t2;
    t2.begin("fill");
    t2.end();
    p.add(t2, std::vector<double>{1.0}, 1);
    CHECK(p.steps() == 3);
    CHECK(p.entries()[1].ms == doctest::Approx(5.0));
    CHECK(p.entries()[1].calls == 3);
  }

  TEST_CASE("op profile: a time count that does not match the events is refused") {
    using namespace test_op_profile;
    OpTimeline t;
    t.begin("add");
    t.end();
    OpProfile p;
    CHECK_THROWS_WITH_AS(p.add(t, std::vector<double>{1.0, 2.0}, 1),
                         "ddp: OpProfile::add: 2 times for 2 events (expected one per pair of consecutive events)",
                         ddp::ValueError);
    p.add(OpTimeline{}, std::vector<double>{}, 1);  // nothing recorded: nothing added
    CHECK(p.steps() == 0);
  }
}
