// Tracing (core/trace.hpp, train/trace.hpp): spans only while a recorder is active on the thread, module spans
// nested as the model nests, Work completion times, the communication time of a DDP step, --trace-steps, lanes
// for overlapping all-reduces, and a 2-rank DDP run whose merged trace has every traced step's spans and buckets
// for both ranks and nothing of the other steps.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <ddp/comm/work.hpp>
#include <ddp/core/error.hpp>
#include <ddp/core/trace.hpp>
#include <ddp/nn/linear.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/relu.hpp>
#include <ddp/nn/sequential.hpp>
#include <ddp/parallel/ddp.hpp>
#include <ddp/tensor/random.hpp>
#include <ddp/train/trace.hpp>

#include "../../support/temp_dir.hpp"
#include "../parallel/parallel_test_util.hpp"  // run_ranks, check_all_ok

using namespace ddp;
using trace_test_clock = ddp::Clock;

namespace trace_test {

// Linear(8, 16) -> ReLU -> Linear(16, 4): children "0", "1", "2" of the root ("model").
std::unique_ptr<nn::Sequential<float, Cpu>> small_mlp() {
  auto m = std::make_unique<nn::Sequential<float, Cpu>>();
  m->push_back(std::make_unique<nn::Linear<float, Cpu>>(nn::LinearOptions{.in_features = 8, .out_features = 16}));
  m->push_back(std::make_unique<nn::ReLU<float, Cpu>>());
  m->push_back(std::make_unique<nn::Linear<float, Cpu>>(nn::LinearOptions{.in_features = 16, .out_features = 4}));
  return m;
}

Tensor<float, Cpu> random_input(std::uint64_t seed) {
  Tensor<float, Cpu> x(Shape{6, 8});
  Generator g(seed, 0, 0);
  g.fill_uniform(x.view(), -1.0, 1.0);
  return x;
}

// The event of `category` named `name`, or nullptr.
const trace::Event* find(const std::vector<trace::Event>& events, const std::string& category, const std::string& name) {
  for (const auto& e : events)
    if (e.category == category && e.name == name) return &e;
  return nullptr;
}
bool inside(const trace::Event& child, const trace::Event& parent) {
  return parent.start <= child.start && child.end <= parent.end;
}

trace::Event comm_event(int from_us, int to_us) {
  const trace_test_clock::time_point t0{};
  return {.name = "all-reduce", .category = "allreduce", .start = t0 + std::chrono::microseconds(from_us),
          .end = t0 + std::chrono::microseconds(to_us), .track = trace::kCommTrack, .args = {}};
}

}  // namespace trace_test

TEST_SUITE("train") {
  TEST_CASE("trace: spans are recorded only while a recorder is active on this thread") {
    trace::Recorder rec;
    { trace::Span off("test", "before"); CHECK_FALSE(off); }
    {
      trace::Activation on(rec);
      trace::Span s("test", "inside");
      CHECK(s);
      s.arg("n", 3.0);
      s.arg("what", std::string("x"));
      std::thread other([] { trace::Span t("test", "other thread"); CHECK_FALSE(t); });
      other.join();
    }
    { trace::Span off("test", "after"); }
    const auto events = rec.take();
    REQUIRE(events.size() == 1);
    CHECK(events[0].name == "inside");
    CHECK(events[0].start <= events[0].end);
    REQUIRE(events[0].args.size() == 2);
    CHECK(events[0].args[0].number == 3.0);
    CHECK(events[0].args[1].text == "x");
    CHECK(rec.size() == 0);
  }

  TEST_CASE("trace: every module's forward and backward is a span, nested as the model nests") {
    auto net = trace_test::small_mlp();
    Exec<Cpu> exec;
    const auto x = trace_test::random_input(1);
    trace::Recorder rec;
    {
      trace::Activation on(rec);
      const auto y = net->forward(exec, x.cview());
      auto dy = Tensor<float, Cpu>::zeros(y.shape());
      dy.data()[0] = 1.0f;
      net->backward(exec, dy.cview());
    }
    const auto events = rec.take();
    CHECK(events.size() == 8);  // 4 modules x (forward, backward)
    for (const char* phase : {"forward", "backward"}) {
      const trace::Event* root = trace_test::find(events, phase, "model");
      REQUIRE(root != nullptr);
      std::vector<const trace::Event*> kids;
      for (const char* name : {"0", "1", "2"}) {
        kids.push_back(trace_test::find(events, phase, name));
        REQUIRE(kids.back() != nullptr);
        CHECK(trace_test::inside(*kids.back(), *root));
      }
      if (std::string(phase) == "forward") {
        CHECK(kids[0]->end <= kids[1]->start);
        CHECK(kids[1]->end <= kids[2]->start);
      } else {
        CHECK(kids[2]->end <= kids[1]->start);
        CHECK(kids[1]->end <= kids[0]->start);
      }
    }
    const trace::Event* lin = trace_test::find(events, "forward", "0");
    REQUIRE(lin->args.size() == 1);
    CHECK(lin->args[0].key == "module");
    CHECK(lin->args[0].text.find("Linear(in_features=8") == 0);
  }

  TEST_CASE("Work::completed_at: the time the op completed, nothing before it or for a default Work") {
    CHECK_FALSE(comm::Work().completed_at().has_value());
    auto state = std::make_shared<comm::detail::WorkState>("op");
    comm::Work w(state);
    CHECK_FALSE(w.completed_at().has_value());
    const auto before = std::chrono::steady_clock::now();
    state->complete();
    const auto t = w.completed_at();
    REQUIRE(t.has_value());
    CHECK(*t >= before);
    CHECK(*t <= std::chrono::steady_clock::now());
  }

  TEST_CASE("StepTrace: communication time is the union of launch..completion, exposed time is finish()'s") {
    using std::chrono::milliseconds;
    const ddp::Clock::time_point t0{};
    parallel::StepTrace t;
    t.step = 0;
    t.backward_end = t0 + milliseconds(20);
    t.finished = t0 + milliseconds(27);
    t.buckets = {{.index = 0, .numel = 1, .num_params = 1, .launched = t0 + milliseconds(5), .completed = t0 + milliseconds(12)},
                 {.index = 1, .numel = 1, .num_params = 1, .launched = t0 + milliseconds(10), .completed = t0 + milliseconds(15)},
                 {.index = 2, .numel = 1, .num_params = 1, .launched = t0 + milliseconds(21), .completed = t0 + milliseconds(26)}};
    CHECK(t.comm_seconds() == doctest::Approx(0.015));  // 5..15 and 21..26
    CHECK(t.exposed_comm_seconds() == doctest::Approx(0.007));
  }

  TEST_CASE("--trace-steps: N or FIRST:LAST from 1; anything else is a ConfigError naming the flag") {
    train::TraceOptions o;
    train::parse_trace_steps("4", o);
    CHECK((o.first == 4 && o.last == 4));
    train::parse_trace_steps("3:5", o);
    CHECK((o.first == 3 && o.last == 5));
    for (const char* bad : {"", "a", "0", "5:3", "3:", ":4", "-1", "2:x", "1:2:3"}) {
      CAPTURE(bad);
      try {
        train::parse_trace_steps(bad, o);
        FAIL("accepted");
      } catch (const ConfigError& e) {
        CHECK(std::string(e.what()).find("--trace-steps") != std::string::npos);
      }
    }
  }

  TEST_CASE("chrome_events: overlapping all-reduces take separate lanes, so that each thread's spans nest") {
    std::vector<trace::Event> events{trace_test::comm_event(0, 10), trace_test::comm_event(5, 15),
                                     trace_test::comm_event(12, 20), trace_test::comm_event(14, 16)};
    const auto json = train::detail::chrome_events(events, 3, {});
    REQUIRE(json.size() == 4);
    std::vector<int> tids;
    for (const auto& e : json) {
      CHECK(e["pid"] == 3);
      CHECK(e["ph"] == "X");
      tids.push_back(e["tid"].get<int>());
    }
    // 5..15 overlaps 0..10: lane 2; 12..20 reuses lane 1 (ended at 10); 14..16 overlaps both (20, 15): lane 3.
    CHECK(tids == std::vector<int>{1, 2, 1, 3});
    CHECK(json[1]["dur"].get<double>() == doctest::Approx(10.0));
    const auto merged = train::detail::merge_chrome_trace({json}, {});
    double first = 1e300;
    std::set<std::string> thread_names;
    for (const auto& e : merged["traceEvents"]) {
      if (e["ph"] == "X") first = std::min(first, e["ts"].get<double>());
      if (e["ph"] == "M" && e["name"] == "thread_name") thread_names.insert(e["args"]["name"].get<std::string>());
    }
    CHECK(first == 0.0);
    CHECK(thread_names == std::set<std::string>{"train", "all-reduce", "all-reduce 2", "all-reduce 3"});
  }

  TEST_CASE("StepTracer: 2 ranks, steps 2..3 of 5: one file with both ranks' steps, modules and every bucket") {
    test::TempDir dir("ddp_trace_");
    const std::string path = dir.file("trace.json");
    std::vector<std::size_t> buckets(2);
    auto errors = test::run_ranks(2, [&](comm::TcpCommunicator& c) {
      auto net = trace_test::small_mlp();
      // 1 KiB caps: Linear(16, 4)'s 80 floats and Linear(8, 16)'s 144 in buckets of their own and more.
      parallel::DistributedDataParallel<float, Cpu> model(*net, c, {.bucket_cap_bytes = 256, .first_bucket_cap_bytes = 256});
      Exec<Cpu> exec;
      train::StepTracer<Cpu> tracer(c, {.path = path, .first = 2, .last = 3}, exec);
      nn::MSELoss<float, Cpu> mse;
      const auto target = Tensor<float, Cpu>::zeros(Shape{6, 4});
      for (long step = 1; step <= 5; ++step) {
        const auto started = ddp::Clock::now();
        const auto x = trace_test::random_input(static_cast<std::uint64_t>(step * 10 + c.rank()));
        const auto got = ddp::Clock::now();
        tracer.begin_step(step);
        const auto y = model.forward(exec, x.cview());
        mse.forward(exec, y.cview(), target.cview());
        model.backward(exec, mse.backward(exec).cview());
        tracer.end_step(step, started, got, exec);
      }
      tracer.close(exec);  // already written after step 3: nothing more
      buckets[static_cast<std::size_t>(c.rank())] = model.buckets().size();
    });
    test::check_all_ok(errors);
    REQUIRE(buckets[0] >= 2);
    std::ifstream in(path);
    REQUIRE(in.good());
    const auto doc = nlohmann::json::parse(in);
    // Per rank and step: the step span, its module spans and bucket indices.
    std::map<std::pair<int, long>, std::set<std::string>> spans;
    std::map<std::pair<int, long>, std::set<int>> bucket_seen;
    std::set<int> pids;
    for (const auto& e : doc["traceEvents"]) {
      if (e["ph"] != "X") continue;
      const int pid = e["pid"].get<int>();
      pids.insert(pid);
      const std::string cat = e["cat"].get<std::string>();
      if (cat == "allreduce") {
        CHECK(e["tid"].get<int>() >= 1);
        const long step = static_cast<long>(e["args"]["ddp_step"].get<double>()) + 1;  // DDP counts from 0
        bucket_seen[{pid, step}].insert(static_cast<int>(e["args"]["bucket"].get<double>()));
      } else if (cat == "step") {
        spans[{pid, static_cast<long>(e["args"]["step"].get<double>())}].insert(e["name"].get<std::string>());
      }
    }
    CHECK(pids == std::set<int>{0, 1});
    for (int pid : {0, 1}) {
      CHECK(spans[{pid, 2}] == std::set<std::string>{"step 2"});
      CHECK(spans[{pid, 3}] == std::set<std::string>{"step 3"});
      std::set<int> all;
      for (std::size_t b = 0; b < buckets[0]; ++b) all.insert(static_cast<int>(b));
      CHECK(bucket_seen[{pid, 2}] == all);
      CHECK(bucket_seen[{pid, 3}] == all);
    }
    CHECK(spans.size() == 4);        // no step 1, 4 or 5
    CHECK(bucket_seen.size() == 4);
    std::map<std::string, int> module_spans;
    for (const auto& e : doc["traceEvents"])
      if (e["ph"] == "X" && (e["cat"] == "forward" || e["cat"] == "backward"))
        ++module_spans[e["cat"].get<std::string>() + " " + e["name"].get<std::string>()];
    for (const char* m : {"model", "0", "1", "2"}) {
      CHECK(module_spans[std::string("forward ") + m] == 4);  // 2 ranks x 2 steps
      CHECK(module_spans[std::string("backward ") + m] == 4);
    }
  }
}
