// Reducer over a recording transport: strictly in-order launches, the unused-parameter error (after
// draining), find_unused_parameters (zeros, the used-flag reduction, kept gradients, no_sync use), the rebuild
// from rank 0's arrival order. The CUDA transport runs
// this same schedule, so these cases cover its bookkeeping without a GPU.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <ddp/core/str.hpp>
#include <ddp/nn/parameter.hpp>
#include <ddp/parallel/reducer.hpp>
#include <ddp/parallel/transport.hpp>

using namespace ddp;

namespace {

using Param = nn::Parameter<float, Cpu>;

// What the schedule asked the transport for, in order, e.g. "build {3} {2,1} {0}", "begin", "launch 1 zeros {2}",
// "finish 0", "drain", "order 0,1,2,3"; and how many launched buckets were neither finished nor drained.
struct Log {
  std::vector<std::string> events;
  int in_flight = 0;
  std::vector<std::int64_t> rank0_order;  // broadcast_order() hands this out, as rank 0's order (empty: keep ours)
  std::vector<std::int64_t> others_used;  // any_rank() takes the max with this, as the other ranks' flags
};

std::string list(const std::vector<std::size_t>& v) {
  std::vector<std::string> s;
  for (std::size_t x : v) s.push_back(std::to_string(x));
  return ddp::detail::join(s, ",");
}

class RecordingTransport {
 public:
  RecordingTransport(const std::vector<Param*>& params, const parallel::DdpOptions& /*o*/, Log& log)
      : n_(params.size()), log_(&log) {}

  void build(const std::vector<parallel::BucketLayout>& layouts) {
    layouts_ = layouts;
    std::vector<std::string> parts{"build"};
    for (const auto& l : layouts) parts.push_back(ddp::detail::str('{', list(l.params), '}'));
    log_->events.push_back(ddp::detail::join(parts, " "));
  }
  void begin_step(const Exec<Cpu>& /*exec*/) { log_->events.push_back("begin"); }
  void launch(std::size_t b, const std::vector<bool>& zero) {
    REQUIRE(zero.size() == n_);
    log_->events.push_back(ddp::detail::str("launch ", b, marked(b, zero, " zeros")));
    ++log_->in_flight;
  }
  void finish(std::size_t b, const std::vector<bool>& keep) {
    REQUIRE(keep.size() == n_);
    log_->events.push_back(ddp::detail::str("finish ", b, marked(b, keep, " keep")));
    --log_->in_flight;
  }
  void any_rank(std::span<std::int64_t> flags) {
    std::vector<std::size_t> f(flags.begin(), flags.end());
    log_->events.push_back(ddp::detail::str("used ", list(f)));
    for (std::size_t i = 0; i < log_->others_used.size(); ++i) flags[i] = std::max(flags[i], log_->others_used[i]);
  }
  void drain() noexcept {
    log_->events.push_back("drain");
    log_->in_flight = 0;
  }
  void broadcast_order(std::span<std::int64_t> order) {
    std::vector<std::size_t> o(order.begin(), order.end());
    log_->events.push_back(ddp::detail::str("order ", list(o)));
    if (!log_->rank0_order.empty()) {
      REQUIRE(log_->rank0_order.size() == order.size());
      std::copy(log_->rank0_order.begin(), log_->rank0_order.end(), order.begin());
    }
  }

 private:
  // " zeros {2}" for the parameters of bucket b set in mask, or "" when none is.
  std::string marked(std::size_t b, const std::vector<bool>& mask, const char* what) const {
    std::vector<std::size_t> on;
    for (std::size_t i : layouts_[b].params)
      if (mask[i]) on.push_back(i);
    return on.empty() ? std::string() : ddp::detail::str(what, " {", list(on), '}');
  }

  std::size_t n_;
  Log* log_;
  std::vector<parallel::BucketLayout> layouts_;
};

static_assert(parallel::BucketTransport<RecordingTransport, Cpu>);
static_assert(parallel::BucketTransport<parallel::Transport<float, Cpu>, Cpu>);

using Schedule = parallel::Reducer<float, Cpu, RecordingTransport>;

// Four parameters p0..p3 of 4 floats (16 bytes) each. With a first cap of 16 bytes and a cap of 32 bytes the
// initial (reverse) order 3,2,1,0 gives buckets {3} {2,1} {0}.
struct Fixture {
  std::vector<std::unique_ptr<Param>> owned;
  std::vector<Param*> params;
  Log log;
  Fixture() {
    for (int i = 0; i < 4; ++i) {
      owned.push_back(std::make_unique<Param>(ddp::detail::str('p', i), Shape{4}));
      params.push_back(owned.back().get());
    }
  }
  std::unique_ptr<Schedule> schedule(parallel::DdpOptions o = {}) {
    o.bucket_cap_bytes = 32;
    o.first_bucket_cap_bytes = 16;
    return std::make_unique<Schedule>(params, o, log);
  }
  // The events since the last call.
  std::vector<std::string> take() { return std::exchange(log.events, {}); }
};

using Events = std::vector<std::string>;

}  // namespace

TEST_SUITE("parallel") {
  TEST_CASE("bucket schedule: buckets launch strictly in index order, as soon as the head bucket is complete") {
    Fixture f;
    auto s = f.schedule({.rebuild_buckets = false});
    CHECK(f.take() == Events{"build {3} {2,1} {0}"});
    s->prepare_step(0);
    CHECK(f.take() == Events{"begin"});
    s->mark_ready(*f.params[1]);
    s->mark_ready(*f.params[2]);  // bucket 1 is complete, but bucket 0 has not launched: it waits
    CHECK(f.take().empty());
    s->mark_ready(*f.params[3]);  // bucket 0 complete: it launches, then the waiting bucket 1
    CHECK(f.take() == Events{"launch 0", "launch 1"});
    s->mark_ready(*f.params[0]);
    CHECK(f.take() == Events{"launch 2"});
    s->finish();
    CHECK(f.take() == Events{"finish 0", "finish 1", "finish 2"});
    CHECK(f.log.in_flight == 0);
    const auto& t = s->last_trace();
    CHECK(t.step == 0);
    REQUIRE(t.buckets.size() == 3);
    CHECK(t.buckets[0].index == 0);
    CHECK(t.buckets[1].index == 1);
    CHECK(t.buckets[1].num_params == 2);
    CHECK(t.buckets[1].numel == 8);
    CHECK(t.buckets[2].index == 2);
    CHECK(s->synced_steps() == 1);
    s->finish();  // idempotent
    CHECK(f.take().empty());
  }

  TEST_CASE("bucket schedule: hooks outside a step are ignored; a gradient reported twice is an error") {
    Fixture f;
    auto s = f.schedule();
    f.take();
    s->mark_ready(*f.params[3]);  // no step: a no_sync pass
    CHECK(f.take().empty());
    Param stranger("stranger", Shape{4});
    s->prepare_step(7);
    s->mark_ready(stranger);  // not one of ours
    s->mark_ready(*f.params[0]);
    CHECK_THROWS_WITH_AS(s->mark_ready(*f.params[0]),
                         "ddp: parameter 'p0' reported its gradient twice in step 7; DDP supports one backward per "
                         "synchronised forward (use no_sync() for accumulation)",
                         Error);
  }

  TEST_CASE("bucket schedule: a missing gradient is an error naming every such parameter, raised after draining") {
    Fixture f;
    auto s = f.schedule();
    f.take();
    s->prepare_step(0);
    s->mark_ready(*f.params[3]);
    s->mark_ready(*f.params[1]);  // bucket 0 launches; p0 and p2 never arrive
    CHECK(f.log.in_flight == 1);
    CHECK_THROWS_WITH_AS(s->finish(),
                         "ddp: parameter 'p0' received no gradient in step 0 (2 parameter(s) without a gradient: "
                         "'p0', 'p2'); DistributedDataParallel all-reduces every parameter in every synchronised "
                         "step, so each one must take part in the loss. Use it in forward, remove it from the model, "
                         "or set .find_unused_parameters = true (--find-unused-parameters)",
                         Error);
    // The launched bucket's collective was drained before the error left finish(); nothing was finished
    // or rebuilt.
    CHECK(f.take() == Events{"begin", "launch 0", "drain"});
    CHECK(f.log.in_flight == 0);
    CHECK_FALSE(s->active());
    CHECK(s->synced_steps() == 0);
    // The next step starts clean.
    s->prepare_step(1);
    for (int i : {3, 2, 1, 0}) s->mark_ready(*f.params[static_cast<std::size_t>(i)]);
    s->finish();
    CHECK(f.take() == Events{"begin", "launch 0", "launch 1", "launch 2", "finish 0", "finish 1", "finish 2",
                             "order 3,2,1,0", "build {3} {2,1} {0}"});
  }

  TEST_CASE("bucket schedule: a step abandoned half-way is drained by the next prepare_step") {
    Fixture f;
    auto s = f.schedule();
    f.take();
    s->prepare_step(0);
    s->mark_ready(*f.params[3]);  // backward threw after this
    s->prepare_step(1);
    CHECK(f.take() == Events{"begin", "launch 0", "drain", "begin"});
    CHECK(s->last_trace().step == 1);
  }

  TEST_CASE("bucket schedule: find_unused_parameters launches zeros for the missing parameters; they go last") {
    Fixture f;
    auto s = f.schedule({.find_unused_parameters = true});
    f.take();
    s->prepare_step(0);
    s->mark_ready(*f.params[3]);
    s->mark_ready(*f.params[1]);
    CHECK(f.take() == Events{"begin", "launch 0"});
    s->finish();
    // p2 completes bucket 1 and p0 bucket 2, both as zeros (no gradient); after the last bucket the ranks agree
    // on the used flags (p0..p3); no rank used p0 and p2, so their grad() is kept; the rebuilt order has them
    // after the arrivals.
    CHECK(f.take() == Events{"launch 1 zeros {2}", "launch 2 zeros {0}", "used 0,1,0,1", "finish 0",
                             "finish 1 keep {2}", "finish 2 keep {0}", "order 3,1,0,2", "build {3} {1,0} {2}"});
    CHECK(f.params[1]->has_grad());  // written by the reduction (the hook of a real backward would have too)
    CHECK_FALSE(f.params[0]->has_grad());
    // The flags are exchanged in every step with find_unused_parameters, also when nothing is missing here,
    // because another rank may miss some (every rank must take part).
    s->prepare_step(1);
    for (int i : {3, 1, 0, 2}) s->mark_ready(*f.params[static_cast<std::size_t>(i)]);
    s->finish();
    CHECK(f.take() == Events{"begin", "launch 0", "launch 1", "launch 2", "used 1,1,1,1", "finish 0", "finish 1",
                             "finish 2"});
  }

  TEST_CASE("bucket schedule: find_unused_parameters counts no_sync use and other ranks' use (torch >= 2.0)") {
    Fixture f;
    auto s = f.schedule({.find_unused_parameters = true, .rebuild_buckets = false});
    f.take();
    Exec<Cpu> ex;
    f.params[0]->grad_done(ex);   // a no_sync backward accumulated p0's gradient ...
    s->mark_ready(*f.params[0]);  // ... and its hook fired outside a step
    f.log.others_used = {0, 0, 1, 0};  // another rank used p2
    s->prepare_step(0);
    s->mark_ready(*f.params[3]);
    s->mark_ready(*f.params[1]);
    s->finish();
    // p0 goes into its slot with its accumulated gradient (no zeros) and is reduced; p2 has no gradient here
    // (zeros) but another rank used it, so it takes the average too; nothing is kept.
    CHECK(f.take() == Events{"begin", "launch 0", "launch 1 zeros {2}", "launch 2", "used 1,1,0,1", "finish 0",
                             "finish 1", "finish 2"});
    CHECK(f.params[2]->has_grad());
    // The no_sync use counts until the synchronised step that reduced it, not after.
    f.log.others_used.clear();
    s->prepare_step(1);
    s->mark_ready(*f.params[3]);
    s->finish();
    CHECK(f.take() == Events{"begin", "launch 0", "launch 1", "launch 2", "used 0,0,0,1", "finish 0",
                             "finish 1 keep {2,1}", "finish 2 keep {0}"});
  }

  TEST_CASE("bucket schedule: static_graph agrees on unused parameters once, then marks them at backward's start") {
    Fixture f;
    auto s = f.schedule({.rebuild_buckets = false, .static_graph = true});
    f.take();
    // Step 0 runs as find_unused_parameters does: p2 is missing here and on every rank, p0 only here.
    f.log.others_used = {1, 0, 0, 0};
    s->prepare_step(0);
    s->mark_ready(*f.params[3]);
    s->mark_ready(*f.params[1]);
    s->finish();
    CHECK(f.take() == Events{"begin", "launch 0", "launch 1 zeros {2}", "launch 2 zeros {0}", "used 0,1,0,1",
                             "finish 0", "finish 1 keep {2}", "finish 2"});
    // Later steps: no flag exchange; at the first gradient p0 and p2 count as ready, so bucket 2 ({p0}) is
    // launched right away, before the gradients that backward still owes.
    f.log.others_used.clear();
    for (int step : {1, 2}) {
      s->prepare_step(step);
      for (auto* p : f.params) p->zero_grad();  // after forward: still counts (marked at backward's start)
      s->mark_ready(*f.params[3]);
      CHECK(f.take() == Events{"begin", "launch 0"});
      s->mark_ready(*f.params[1]);
      CHECK(f.take() == Events{"launch 1 zeros {2}", "launch 2 zeros {0}"});
      s->finish();
      CHECK(f.take() == Events{"finish 0", "finish 1 keep {2}", "finish 2"});
    }
    // A graph that changes is an error naming the parameter, both ways.
    s->prepare_step(3);
    s->mark_ready(*f.params[3]);
    CHECK_THROWS_WITH_AS(s->mark_ready(*f.params[2]), doctest::Contains("static_graph: parameter 'p2' received a gradient"),
                         Error);
    s->prepare_step(4);
    s->mark_ready(*f.params[3]);
    CHECK_THROWS_WITH_AS(s->finish(), doctest::Contains("static_graph: parameter 'p1' received no gradient in step 4"),
                         Error);
    CHECK(f.log.in_flight == 0);
  }

  TEST_CASE("bucket schedule: rebuilt once, after the first synchronised step, from rank 0's arrival order") {
    Fixture f;
    auto s = f.schedule();
    f.take();
    f.log.rank0_order = {2, 3, 0, 1};  // what rank 0 saw; this rank saw 0,1,2,3
    s->prepare_step(0);
    for (int i : {0, 1, 2, 3}) s->mark_ready(*f.params[static_cast<std::size_t>(i)]);
    s->finish();
    CHECK(f.take() == Events{"begin", "launch 0", "launch 1", "launch 2", "finish 0", "finish 1", "finish 2",
                             "order 0,1,2,3", "build {2} {3,0} {1}"});
    REQUIRE(s->layouts().size() == 3);
    CHECK(s->layouts()[1].params == std::vector<std::size_t>{3, 0});
    CHECK(s->layouts()[1].offsets == std::vector<std::int64_t>{0, 4});
    // Step 2 runs on the new buckets and is not rebuilt again.
    s->prepare_step(1);
    s->mark_ready(*f.params[2]);
    CHECK(f.take() == Events{"begin", "launch 0"});
    for (int i : {3, 0, 1}) s->mark_ready(*f.params[static_cast<std::size_t>(i)]);
    s->finish();
    CHECK(f.take() == Events{"launch 1", "launch 2", "finish 0", "finish 1", "finish 2"});
    // Without rebuild_buckets the first buckets stay.
    Fixture g;
    auto t = g.schedule({.rebuild_buckets = false});
    t->prepare_step(0);
    for (int i : {0, 1, 2, 3}) t->mark_ready(*g.params[static_cast<std::size_t>(i)]);
    t->finish();
    CHECK(g.take().back() == "finish 2");
  }

  TEST_CASE("bucket schedule: rank 0's order must be a permutation") {
    Fixture f;
    auto s = f.schedule();
    f.log.rank0_order = {0, 1, 1, 3};
    s->prepare_step(0);
    for (int i : {3, 2, 1, 0}) s->mark_ready(*f.params[static_cast<std::size_t>(i)]);
    CHECK_THROWS_WITH_AS(s->finish(), "ddp: bucket order is not a permutation: index 1 is repeated", ValueError);
  }
}
