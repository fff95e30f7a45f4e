// The PowerSGD communication hook (parallel/powersgd.hpp): orthogonalisation, torch's compression rule,
// option validation, plain all-reduce before start_iter, the error-feedback identity, exact recovery of a
// rank-1 gradient, the byte counters, the bucket plan and state rules the CUDA transport shares, and DDP with
// --comm-hook powersgd. Ranks are threads (tcp over loopback).
// The comparison with torch's own powerSGD_hook is tests/interop/torch_powersgd.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <ddp/nn/linear.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/parallel/ddp.hpp>
#include <ddp/parallel/powersgd.hpp>

#include "parallel_test_util.hpp"

using namespace ddp;
using test::check_all_ok;
using test::max_rel_diff;
using test::Params;
using test::snapshot_params;
using namespace ddp::parallel;

namespace {

std::vector<float> gaussian(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// One bucket of parameters with the given torch shapes, laid out back to back, as the transport makes it.
struct TestBucket {
  explicit TestBucket(std::vector<Shape> s) : shapes(std::move(s)) {
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      layout.params.push_back(k);
      layout.offsets.push_back(layout.numel);
      layout.numel += shapes[k].numel();
    }
    buffer.assign(static_cast<std::size_t>(layout.numel), 0.0f);
  }
  // Runs the hook on `buffer` as DDP does: call, wait, then.
  void reduce(const CommHook<float>& hook, comm::Communicator& c, std::size_t index = 0, bool is_last = true) {
    GradBucket<float> gb{.index = index, .buffer = std::span<float>(buffer), .layout = &layout, .comm = &c,
                         .is_last = is_last, .shapes = shapes};
    HookResult r = hook(gb);
    r.work.wait();
    if (r.then) r.then();
  }
  std::vector<Shape> shapes;
  BucketLayout layout;
  std::vector<float> buffer;
};

}  // namespace

TEST_CASE("PowerSGD: Gram-Schmidt gives orthonormal columns; a zero column stays zero") {
  const std::int64_t rows = 20, cols = 3;
  auto a = gaussian(static_cast<std::size_t>(rows * cols), 7);
  parallel::detail::gram_schmidt(a.data(), rows, cols, 0.0);
  for (std::int64_t i = 0; i < cols; ++i)
    for (std::int64_t j = 0; j < cols; ++j) {
      double dot = 0;
      for (std::int64_t r = 0; r < rows; ++r) dot += double(a[static_cast<std::size_t>(r * cols + i)]) * a[static_cast<std::size_t>(r * cols + j)];
      CHECK(dot == doctest::Approx(i == j ? 1.0 : 0.0).epsilon(1e-6));
    }
  std::vector<float> z(10, 0.0f);  // (10 x 1) of zeros: torch 1.13 would give NaN, we keep zeros
  parallel::detail::gram_schmidt(z.data(), 10, 1, 0.0);
  for (float v : z) CHECK(v == 0.0f);
  std::vector<float> e{3.0f, 4.0f};  // norm 5, eps 1: divided by 6
  parallel::detail::gram_schmidt(e.data(), 2, 1, 1.0);
  CHECK(e[0] == doctest::Approx(0.5));
  CHECK(e[1] == doctest::Approx(4.0 / 6.0));
}

TEST_CASE("PowerSGD: Householder QR (rank > 2, as torch) stays orthonormal on a rank-deficient matrix") {
  // 3 x 3 whose columns are orthogonal to (1, 1, 1) (a cross-entropy classifier's weight gradient): rank 2.
  std::vector<float> a{1, 2, -3, -1, 0.5f, 1, 0, -2.5f, 2};
  auto gs = a, hh = a;
  parallel::detail::gram_schmidt(gs.data(), 3, 3, 0.0);
  parallel::detail::orthogonalize(hh.data(), 3, 3, 0.0);  // 3 columns: Householder, as torch
  auto gram = [](const std::vector<float>& m, int i, int j) {
    double d = 0;
    for (int r = 0; r < 3; ++r) d += double(m[static_cast<std::size_t>(r * 3 + i)]) * m[static_cast<std::size_t>(r * 3 + j)];
    return d;
  };
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) CHECK(gram(hh, i, j) == doctest::Approx(i == j ? 1.0 : 0.0).scale(1.0).epsilon(1e-6));
  // The third column of Householder's Q is +-(1, 1, 1) / sqrt(3), the complement of the matrix's column space.
  CHECK(std::abs(hh[2] + hh[5] + hh[8]) == doctest::Approx(std::sqrt(3.0)).epsilon(1e-5));
  // Gram-Schmidt's first two columns agree with Householder's up to sign.
  for (int c = 0; c < 2; ++c) CHECK(std::abs(gram(gs, c, c)) == doctest::Approx(1.0).epsilon(1e-6));
}

TEST_CASE("PowerSGD: torch's _should_compress rule") {
  CHECK(should_compress(10, 64, 1, 2));   // 74 * 2 < 640
  CHECK(!should_compress(10, 1, 1, 2));   // a bias: 11 * 2 >= 10
  CHECK(!should_compress(4, 27, 2, 2));   // 62 * 2 = 124 >= 108
  CHECK(should_compress(4, 27, 2, 1));    // 62 < 108
  CHECK(!should_compress(4, 4, 2, 1));    // 16 == 16: not strictly smaller
  CHECK(should_compress(512, 4608, 4, 2));
}

TEST_CASE("PowerSGD: the bucket plan both devices use (offsets of the uncompressed part, each P and each Q)") {
  // A bucket {fc.bias (10), fc.weight (10 x 64), conv (4, 3, 3, 3), conv2 (16, 8, 3, 3)} at rank 2: fc.weight
  // (74 * 2 * 2 < 640) and conv2 (88 * 2 * 2 < 1152) are compressed, the bias and conv (31 * 2 * 2 >= 108) not.
  TestBucket b({Shape{10}, Shape{10, 64}, Shape{4, 3, 3, 3}, Shape{16, 8, 3, 3}});
  const PowerSgdPlan plan = plan_powersgd_bucket(b.layout, b.shapes, {.matrix_approximation_rank = 2});
  REQUIRE(plan.uncompressed.size() == 2);
  CHECK(plan.uncompressed[0] == std::pair<std::int64_t, std::int64_t>(0, 10));
  CHECK(plan.uncompressed[1] == std::pair<std::int64_t, std::int64_t>(650, 108));
  REQUIRE(plan.matrices.size() == 2);
  const PowerSgdMatrix& fc = plan.matrices[0];
  const PowerSgdMatrix& conv2 = plan.matrices[1];
  CHECK(fc.param == 1);
  CHECK(fc.offset == 10);
  CHECK(fc.rows == 10);
  CHECK(fc.cols == 64);
  CHECK(fc.rank == 2);
  CHECK(fc.p_offset == 0);
  CHECK(fc.q_offset == 0);
  CHECK(conv2.param == 3);
  CHECK(conv2.offset == 758);
  CHECK(conv2.rows == 16);
  CHECK(conv2.cols == 72);
  CHECK(conv2.p_offset == 20);   // after fc's P (10 x 2)
  CHECK(conv2.q_offset == 128);  // after fc's Q (64 x 2)
  CHECK(plan.n_unc == 118);
  CHECK(plan.n_p == 20 + 32);
  CHECK(plan.n_q == 128 + 144);
  CHECK(plan.send_numel() == 118 + 52);
  CHECK(plan.numel == b.layout.numel);
  CHECK(plan.compressed_numel == 118 + 52 + 272);
  // r = min(rows, cols, rank): a 3 x 200 matrix at rank 4 is compressed at rank 3 (203 * 3 * 0.5 < 600).
  TestBucket thin({Shape{3, 200}});
  const PowerSgdPlan p3 =
      plan_powersgd_bucket(thin.layout, thin.shapes, {.matrix_approximation_rank = 4, .min_compression_rate = 0.5});
  REQUIRE(p3.matrices.size() == 1);
  CHECK(p3.matrices[0].rank == 3);
  // Shapes that do not match the layout (a transport without them) are refused.
  CHECK_THROWS_WITH_AS(plan_powersgd_bucket(b.layout, {}, {}), doctest::Contains("GradBucket::shapes"), ValueError);
}

TEST_CASE("PowerSGD: the state's per-bucket rules (start_iter, counters, initial Q) that both devices call") {
  PowerSgdState<float> st(PowerSgdOptions{.start_iter = 2});
  TestBucket b({Shape{8}, Shape{8, 16}});
  const PowerSgdPlan plan = plan_powersgd_bucket(b.layout, b.shapes, st.options);
  // Steps 0 and 1: plain buckets, counted at launch; the last bucket of a step ends it.
  CHECK_FALSE(st.begin_bucket(136, false));
  CHECK(st.iter == 0);
  CHECK_FALSE(st.begin_bucket(136, true));
  CHECK(st.iter == 1);
  CHECK(st.bytes_last_step == 2 * 136 * sizeof(float));
  CHECK_FALSE(st.begin_bucket(136, true));
  CHECK(st.iter == 2);
  // Step 2: compressed; counted by the plan, the step ended at finish.
  CHECK(st.begin_bucket(136, true));
  st.count_compressed(plan, true);
  CHECK(st.iter == 2);
  st.end_compressed_bucket(true);
  CHECK(st.iter == 3);
  CHECK(st.bytes_last_step == (8 + 8 + 16) * sizeof(float));
  CHECK(st.numel_before_compression == 136);
  CHECK(st.numel_after_compression == 32);
  // Q: new when none is held (or the plan changed size), kept with warm_start.
  CHECK(st.needs_new_q(0, plan));
  CHECK_FALSE(st.needs_new_q(16, plan));
  CHECK(PowerSgdState<float>(PowerSgdOptions{.start_iter = 0, .use_error_feedback = false, .warm_start = false})
            .needs_new_q(16, plan));
  // The initial Q is the seeded generator's (or options.initial_q's), the same for every state with the seed.
  PowerSgdState<float> other(PowerSgdOptions{.start_iter = 2});
  std::vector<float> q1(16), q2(16);
  st.initial_q(0, plan, std::span<float>(q1));
  other.initial_q(0, plan, std::span<float>(q2));
  CHECK(q1 == q2);
  PowerSgdState<float> fed(PowerSgdOptions{
      .start_iter = 2, .initial_q = [](std::size_t bucket, std::size_t param, std::span<double> q) {
        for (std::size_t i = 0; i < q.size(); ++i) q[i] = double(bucket * 100 + param * 10 + i);
      }});
  fed.initial_q(3, plan, std::span<float>(q2));
  CHECK(q2[0] == 310.0f);
  CHECK(q2[15] == 325.0f);
}

TEST_CASE("PowerSGD: option validation names the option; parse_comm_hook knows powersgd") {
  CHECK_NOTHROW(validate_powersgd_options({}));
  CHECK_THROWS_WITH_AS(validate_powersgd_options({.start_iter = 1}),
                       doctest::Contains("use_error_feedback or warm_start"), ValueError);
  CHECK_THROWS_WITH_AS(powersgd_hook<float>({.start_iter = 0, .use_error_feedback = false}),
                       doctest::Contains("--powersgd-start-iter"), ValueError);
  CHECK_NOTHROW(powersgd_hook<float>({.start_iter = 0, .use_error_feedback = false, .warm_start = false}));
  CHECK_THROWS_WITH_AS(validate_powersgd_options({.matrix_approximation_rank = 0}),
                       doctest::Contains("matrix_approximation_rank"), ValueError);
  CHECK_THROWS_WITH_AS(validate_powersgd_options({.start_iter = -1, .use_error_feedback = false, .warm_start = false}),
                       doctest::Contains("start_iter must be >= 0"), ValueError);
  CHECK(parse_comm_hook("powersgd") == CommHookKind::PowerSgd);
  CHECK_THROWS_WITH_AS(make_comm_hook<float>(CommHookKind::PowerSgd, {.start_iter = 1}),
                       doctest::Contains("start_iter must be > 1"), ValueError);
  CHECK_THROWS_WITH_AS(parse_comm_hook("power"), doctest::Contains("powersgd"), ValueError);
}

TEST_CASE("PowerSGD: plain average before start_iter; iter counted on the last bucket; byte counters") {
  auto errors = test::run_ranks(2, [&](comm::TcpCommunicator& c) {
    auto st = std::make_shared<PowerSgdState<float>>(PowerSgdOptions{.start_iter = 2});
    auto hook = powersgd_hook<float>(st);
    TestBucket b0({Shape{8, 16}, Shape{8}}), b1({Shape{4, 4}});
    for (int step = 0; step < 2; ++step) {
      for (auto& v : b0.buffer) v = static_cast<float>(c.rank() + 1);  // average 1.5
      b0.reduce(hook, c, 0, false);
      CHECK(st->iter == step);  // not the last bucket: no count
      b1.buffer.assign(b1.buffer.size(), 2.0f * static_cast<float>(c.rank()));
      b1.reduce(hook, c, 1, true);
      CHECK(st->iter == step + 1);
      for (float v : b0.buffer) CHECK(v == 1.5f);
      for (float v : b1.buffer) CHECK(v == 1.0f);
      CHECK(st->bytes_last_step == (136 + 16) * sizeof(float));
    }
    CHECK(st->bytes_total == 2 * (136 + 16) * sizeof(float));
    CHECK(st->numel_before_compression == 0);
  });
  check_all_ok(errors);
}

TEST_CASE("PowerSGD: error feedback identity, identical results on every rank, rank-1 recovery, payload") {
  const int world = 2;
  std::vector<std::vector<float>> outs(world);
  auto errors = test::run_ranks(world, [&](comm::TcpCommunicator& c) {
    const auto rk = static_cast<std::size_t>(c.rank());
    auto st = std::make_shared<PowerSgdState<float>>(PowerSgdOptions{.matrix_approximation_rank = 2, .start_iter = 2});
    st->iter = 2;  // compress from the first call
    auto hook = powersgd_hook<float>(st);
    // fc.weight (10 x 64): compressed (r = 2: 148 * 2 < 640); fc.bias (10): not; conv (6, 2, 3, 3) -> 6 x 18:
    // r = 2: 48 * 2 < 108, compressed.
    TestBucket b({Shape{10, 64}, Shape{10}, Shape{6, 2, 3, 3}});
    for (int step = 0; step < 3; ++step) {
      b.buffer = gaussian(b.buffer.size(), 100 * static_cast<std::uint64_t>(step) + rk);
      std::vector<float> input = b.buffer;  // + the error of the last step, added by the hook
      if (step > 0)
        for (std::size_t i = 0; i < input.size(); ++i) input[i] += st->buckets[0].error[i];
      b.reduce(hook, c);
      for (std::size_t i = 0; i < input.size(); ++i)
        REQUIRE(double(b.buffer[i]) + st->buckets[0].error[i] == doctest::Approx(input[i]).epsilon(1e-6));
      // The bias is averaged exactly: the mean of both ranks' inputs.
      CHECK(st->bytes_last_step == (10 + (10 + 64) * 2 + (6 + 18) * 2) * sizeof(float));
    }
    CHECK(st->iter == 5);
    CHECK(st->numel_before_compression == 3 * (640 + 10 + 108));
    CHECK(st->numel_after_compression == 3 * (148 + 10 + 48));
    outs[rk] = b.buffer;

    // A gradient that is exactly rank 1 and the same on every rank: M = u v^T is recovered exactly (P spans u).
    auto st1 = std::make_shared<PowerSgdState<float>>(PowerSgdOptions{.start_iter = 2, .use_error_feedback = false});
    st1->iter = 2;
    TestBucket m({Shape{12, 30}});
    const auto u = gaussian(12, 1), v = gaussian(30, 2);
    for (std::size_t i = 0; i < 12; ++i)
      for (std::size_t j = 0; j < 30; ++j) m.buffer[i * 30 + j] = u[i] * v[j];
    const auto want = m.buffer;
    m.reduce(powersgd_hook<float>(st1), c);
    for (std::size_t i = 0; i < want.size(); ++i) REQUIRE(m.buffer[i] == doctest::Approx(want[i]).epsilon(1e-4).scale(1e-3));
  });
  check_all_ok(errors);
  CHECK(outs[0] == outs[1]);  // every rank applies the same gradient
}

TEST_CASE("PowerSGD: an all-zero gradient stays zero (no NaN) and a bucket without shapes is refused") {
  auto errors = test::run_ranks(2, [&](comm::TcpCommunicator& c) {
    auto st = std::make_shared<PowerSgdState<float>>(PowerSgdOptions{.start_iter = 2});
    st->iter = 2;
    auto hook = powersgd_hook<float>(st);
    TestBucket b({Shape{16, 16}});
    b.reduce(hook, c);
    for (float v : b.buffer) CHECK(v == 0.0f);
    GradBucket<float> gb{.index = 0, .buffer = std::span<float>(b.buffer), .layout = &b.layout, .comm = &c, .is_last = true};
    CHECK_THROWS_WITH_AS(hook(gb), doctest::Contains("GradBucket::shapes"), ValueError);
  });
  check_all_ok(errors);
}

TEST_CASE("PowerSGD in DDP (--comm-hook powersgd and register_comm_hook): ranks stay identical; compression from start_iter") {
  const int world = 2;
  for (bool by_kind : {true, false}) {
    CAPTURE(by_kind);
    std::vector<std::vector<float>> weights(world);
    auto errors = test::run_ranks(world, [&](comm::TcpCommunicator& c) {
      Exec<Cpu> exec;
      nn::Linear<float, Cpu> net({.in_features = 32, .out_features = 16});
      const PowerSgdOptions po{.matrix_approximation_rank = 2, .start_iter = 2};
      DistributedDataParallel<float, Cpu> model(net, c, {.comm_hook = by_kind ? CommHookKind::PowerSgd : CommHookKind::Allreduce, .powersgd = po});
      auto st = std::make_shared<PowerSgdState<float>>(po);
      if (!by_kind) model.register_comm_hook(powersgd_hook<float>(st));
      optim::SGD<float, Cpu> opt(net.parameters(), {.lr = 0.1});
      nn::CrossEntropyLoss<float, Cpu> ce;
      for (int step = 0; step < 4; ++step) {
        opt.zero_grad();
        Tensor<float, Cpu> x(Shape{4, 32});
        const auto xs = gaussian(4 * 32, 10 * static_cast<std::uint64_t>(step) + static_cast<std::uint64_t>(c.rank()));
        std::copy(xs.begin(), xs.end(), x.data());
        Tensor<std::int64_t, Cpu> y(Shape{4});
        for (std::int64_t i = 0; i < 4; ++i) y.data()[i] = (i + step + c.rank()) % 16;
        auto logits = model.forward(exec, x.cview());
        ce.forward(exec, logits.cview(), y.cview());
        model.backward(exec, ce.backward(exec).cview());
        opt.step(exec);
        if (!by_kind) {  // one bucket {bias (16), weight (16 x 32)}: 528 values, then 16 + (16 + 32) * 2
          CHECK(st->iter == step + 1);
          CHECK(st->bytes_last_step == (step < 2 ? 528u : 16u + 96u) * sizeof(float));
        }
      }
      weights[static_cast<std::size_t>(c.rank())].assign(net.parameters()[0]->value().data(),
                                                         net.parameters()[0]->value().data() + net.parameters()[0]->numel());
    });
    check_all_ok(errors);
    CHECK(weights[0] == weights[1]);
  }
}
