// DistributedDataParallel with ranks as threads (HashStore + tcp communicator): equivalence with a single
// process on the concatenated batch, no_sync accumulation, buffers, unused parameters, overlap, buckets.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <ddp/data/synthetic.hpp>
#include <ddp/nn/linear.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/parallel/ddp.hpp>
#include <ddp/tensor/random.hpp>

#include "parallel_test_util.hpp"

using namespace ddp;
using test::check_all_ok;
using test::max_rel_diff;
using test::Params;
using test::snapshot_params;
using test::mse_pass;
using test::RegressionData;
using ddp::parallel::DistributedDataParallel;

namespace {

// ---- the ResNet case: resnet18 at width 4, 16x16 images, 5 classes ----
// A: the activations' type (bfloat16: docs/decisions/0070).
template <class A = float>
std::unique_ptr<nn::ResNet<float, Cpu, A>> small_resnet(std::uint64_t seed) {
  return std::make_unique<nn::ResNet<float, Cpu, A>>(nn::ResNetOptions{.arch = "resnet18", .num_classes = 5, .seed = seed, .width = 4});
}
// The batch's images as A.
template <class A>
Tensor<A, Cpu> images_as(const Tensor<float, Cpu>& x) {
  if constexpr (std::is_same_v<A, float>) {
    Tensor<float, Cpu> c(x.shape());
    std::memcpy(c.data(), x.data(), x.bytes());
    return c;
  } else {
    Tensor<A, Cpu> c(x.shape());
    for (std::int64_t i = 0; i < x.numel(); ++i) c.data()[i] = A(x.data()[i]);
    return c;
  }
}
const data::SyntheticDataset& images() {
  static data::SyntheticDataset ds({.size = 256, .height = 16, .width = 16, .channels = 3, .num_classes = 5, .seed = 7});
  return ds;
}
std::vector<std::int64_t> range(std::int64_t from, std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = from + i;
  return v;
}

constexpr optim::SgdOptions kSgd{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4};

// One step of a plain (non-DDP) model on samples `idx`; returns d(loss)/d(logits) scaled by `scale`.
template <class M>
void local_backward(Exec<Cpu>& exec, M& model, const std::vector<std::int64_t>& idx, float scale = 1.0f) {
  using A = typename M::activation_type;
  auto batch = data::make_batch(images(), idx, 0);
  const Tensor<A, Cpu> x = images_as<A>(batch.images);
  nn::CrossEntropyLoss<A, Cpu> ce;
  auto y = model.forward(exec, x.cview());
  ce.forward(exec, y.cview(), batch.labels.cview());
  auto dy = ce.backward(exec);
  for (std::int64_t i = 0; i < dy.numel(); ++i) dy.data()[i] = A(float(dy.data()[i]) * scale);
  model.backward(exec, dy.cview());
}

// World size W, per-rank batch B, k steps; rank r takes samples [s W B + r B, s W B + (r+1) B) in step s.
// Ranks start from different seeds: DDP's construction broadcast must make them equal to rank 0's.
template <class A = float>
std::vector<Params> run_ddp_resnet(int world, std::int64_t B, int steps, bool eval_bn,
                                   const parallel::DdpOptions& options = {}) {
  std::vector<Params> out(static_cast<std::size_t>(world));
  auto errors = test::run_ranks(world, [&](comm::TcpCommunicator& c) {
    Exec<Cpu> exec;
    auto net = small_resnet<A>(100 + static_cast<std::uint64_t>(c.rank()));
    if (eval_bn) net->eval();
    DistributedDataParallel<float, Cpu, A> model(*net, c, options);
    optim::SGD<float, Cpu> opt(net->parameters(), kSgd);
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      auto batch = data::make_batch(images(), range(s * world * B + c.rank() * B, B), 0);
      const Tensor<A, Cpu> x = images_as<A>(batch.images);
      nn::CrossEntropyLoss<A, Cpu> ce;
      auto y = model.forward(exec, x.cview());
      ce.forward(exec, y.cview(), batch.labels.cview());
      model.backward(exec, ce.backward(exec).cview());
      opt.step(exec);
    }
    out[static_cast<std::size_t>(c.rank())] = snapshot_params(*net);
  });
  check_all_ok(errors);
  return out;
}

// ---- the toy case: Linear(20, 1) + MSE on seeded samples ----
const RegressionData& toy() {
  static const RegressionData t(512, 20, 1);
  return t;
}
std::unique_ptr<nn::Linear<float, Cpu>> toy_model(std::uint64_t seed) {
  auto m = std::make_unique<nn::Linear<float, Cpu>>(nn::LinearOptions{.in_features = 20, .out_features = 1});
  Generator g(seed);
  m->reset_parameters(g);
  return m;
}
// forward + MSE + backward of `model` (a Linear or a DDP wrapper) on rows [from, from + n), dy scaled.
template <class M>
void toy_pass(Exec<Cpu>& exec, M& model, std::int64_t from, std::int64_t n, float scale = 1.0f) {
  mse_pass(exec, model, toy(), from, n, scale);
}

// A model with a parameter that forward never uses.
class TwoHeads : public nn::Module<float, Cpu> {
 public:
  TwoHeads() {
    used_ = &register_module("used", std::make_unique<nn::Linear<float, Cpu>>(nn::LinearOptions{.in_features = 20, .out_features = 1}));
    register_module("unused", std::make_unique<nn::Linear<float, Cpu>>(nn::LinearOptions{.in_features = 20, .out_features = 1}));
  }
  Tensor<float, Cpu> forward_impl(Exec<Cpu>& e, TensorView<const float, Cpu> x) override { return used_->forward(e, x); }
  Tensor<float, Cpu> backward_impl(Exec<Cpu>& e, TensorView<const float, Cpu> dy) override { return used_->backward(e, dy); }
  std::string describe() const override { return "TwoHeads"; }

 private:
  nn::Linear<float, Cpu>* used_ = nullptr;
};

}  // namespace

namespace test_ddp {
// The guide's example hook (docs/GUIDE.md, section 10), verbatim.
template <class T, Device D>
parallel::CommHook<T, D> counting_hook(std::shared_ptr<std::size_t> bytes) {
  return [bytes](parallel::GradBucket<T, D>& b) {
    *bytes += b.buffer.size_bytes();
    return parallel::HookResult{
        .work = b.comm->all_reduce(b.view(), {.op = comm::ReduceOp::Avg, .stream = stream_of(b.exec)}),
        .then = {}};
  };
}
}  // namespace test_ddp

TEST_SUITE("parallel") {
  TEST_CASE("assign_buckets: worked example from bucket.hpp") {
    const std::int64_t kib = 1024 / 4;  // float elements per KiB
    auto b = parallel::assign_buckets({0, 1, 2, 3, 4}, {600 * kib, 600 * kib, 10240 * kib, 20480 * kib, 4 * kib}, 4,
                                      25 << 20, 1 << 20);
    REQUIRE(b.size() == 3);
    CHECK(b[0].params == std::vector<std::size_t>{0, 1});
    CHECK(b[1].params == std::vector<std::size_t>{2, 3});
    CHECK(b[2].params == std::vector<std::size_t>{4});
    CHECK(b[1].offsets == std::vector<std::int64_t>{0, 10240 * kib});
    CHECK_THROWS_WITH_AS(parallel::assign_buckets({0, 0}, {1, 1}, 4, 8, 8),
                         "ddp: bucket order is not a permutation: index 0 is repeated", ValueError);
    CHECK(parallel::parse_comm_hook("bf16") == parallel::CommHookKind::Bf16);
    CHECK(parallel::parse_comm_hook("none") == parallel::CommHookKind::Allreduce);
    CHECK_THROWS_WITH_AS(parallel::parse_comm_hook("int8"),
                         "ddp: unknown communication hook 'int8'; valid: allreduce, fp16, bf16, powersgd (--comm-hook)",
                         ValueError);
  }

  TEST_CASE("toy Linear(20,1): world 2 and 4 with batch B equal world 1 with batch W*B") {
    const std::int64_t B = 8;
    const int steps = 5;
    for (int world : {2, 4}) {
      CAPTURE(world);
      Exec<Cpu> exec;
      auto ref = toy_model(1);
      optim::SGD<float, Cpu> ropt(ref->parameters(), kSgd);
      for (int s = 0; s < steps; ++s) {
        ropt.zero_grad();
        toy_pass(exec, *ref, s * world * B, world * B);
        ropt.step(exec);
      }
      std::vector<Params> got(static_cast<std::size_t>(world));
      check_all_ok(test::run_ranks(world, [&](comm::TcpCommunicator& c) {
        Exec<Cpu> ex;
        auto net = toy_model(1 + static_cast<std::uint64_t>(c.rank()));  // rank 0 = the reference's init
        DistributedDataParallel<float, Cpu> model(*net, c);
        optim::SGD<float, Cpu> opt(net->parameters(), kSgd);
        for (int s = 0; s < steps; ++s) {
          opt.zero_grad();
          toy_pass(ex, model, s * world * B + c.rank() * B, B);
          opt.step(ex);
        }
        got[static_cast<std::size_t>(c.rank())] = snapshot_params(*net);
      }));
      const Params want = snapshot_params(*ref);
      for (int r = 0; r < world; ++r) CHECK(max_rel_diff(got[static_cast<std::size_t>(r)], want) < 1e-5);
      MESSAGE("world ", world, ": max relative difference to the single-process reference ", max_rel_diff(got[0], want));
      CHECK(got[0] == got[static_cast<std::size_t>(world - 1)]);  // ranks bit-identical to each other
    }
  }

  TEST_CASE("resnet18 (eval-mode BN): world 2 and 4 with batch B equal world 1 with batch W*B") {
    // With eval-mode BatchNorm each sample's loss does not depend on the rest of the batch, so the mean
    // gradient over W*B samples is exactly the average of the W per-rank means (train-mode BN is below).
    const std::int64_t B = 2;
    const int steps = 3;
    for (int world : {2, 4}) {
      CAPTURE(world);
      Exec<Cpu> exec;
      auto ref = small_resnet(100);
      ref->eval();
      optim::SGD<float, Cpu> ropt(ref->parameters(), kSgd);
      for (int s = 0; s < steps; ++s) {
        ropt.zero_grad();
        local_backward(exec, *ref, range(s * world * B, world * B));
        ropt.step(exec);
      }
      const Params want = snapshot_params(*ref);
      // The default caps put this small model (about 45 K floats) in one bucket; 16 KiB caps give about a
      // dozen buckets, launched during backward and rebuilt after step 0: the result must not change.
      for (std::size_t cap : {parallel::kDefaultBucketCapBytes, std::size_t{16} << 10}) {
        CAPTURE(cap);
        auto got = run_ddp_resnet(world, B, steps, /*eval_bn=*/true,
                                  {.bucket_cap_bytes = cap, .first_bucket_cap_bytes = std::min(cap, parallel::kDefaultFirstBucketCapBytes)});
        for (int r = 0; r < world; ++r) CHECK(max_rel_diff(got[static_cast<std::size_t>(r)], want) < 1e-5);
        MESSAGE("world ", world, ", bucket cap ", cap, " B: max relative difference to the single-process reference ",
                max_rel_diff(got[0], want));
        CHECK(got[0] == got[static_cast<std::size_t>(world - 1)]);
      }
    }
  }

  TEST_CASE("after two steps, a resnet training step takes every host tensor from the cache") {
    // tensor/storage.hpp: Allocator<Cpu> caches freed blocks by size class. Step 1 allocates everything;
    // step 2 also allocates what it needs while tensors kept from step 1 (what modules save for backward,
    // replaced only by the next forward) are still alive. From step 3 on, a step repeats the sizes and the
    // lifetimes of the step before: no malloc for a tensor (forward, loss, backward, SGD step).
    Exec<Cpu> exec;
    auto net = small_resnet(100);
    optim::SGD<float, Cpu> opt(net->parameters(), kSgd);
    std::vector<std::int64_t> mallocs;
    for (int s = 0; s < 4; ++s) {
      opt.zero_grad();
      local_backward(exec, *net, range(s * 8, 8));
      opt.step(exec);
      mallocs.push_back(cpu_memory_stats().device_mallocs);
    }
    if constexpr (BuildConfig::cpu_caching) {
      CHECK(mallocs[0] > 0);
      CHECK(mallocs[2] == mallocs[1]);
      CHECK(mallocs[3] == mallocs[1]);
    } else {
      CHECK(mallocs[3] == 0);  // DDP_CPU_CACHING=0: nothing is cached or counted
    }
  }

  TEST_CASE("resnet18 (train-mode BN): world 2 equals accumulating W per-rank micro-batches") {
    // Train-mode BN normalises with each rank's own batch statistics (as in PyTorch DDP without SyncBN),
    // so the right single-process reference runs the W chunks separately and averages their gradients.
    const int world = 2;
    const std::int64_t B = 4;
    const int steps = 3;
    Exec<Cpu> exec;
    auto ref = small_resnet(100);
    optim::SGD<float, Cpu> ropt(ref->parameters(), kSgd);
    for (int s = 0; s < steps; ++s) {
      ropt.zero_grad();
      for (int r = 0; r < world; ++r) local_backward(exec, *ref, range(s * world * B + r * B, B), 1.0f / world);
      ropt.step(exec);
    }
    auto got = run_ddp_resnet(world, B, steps, /*eval_bn=*/false, {.bucket_cap_bytes = 16 << 10, .first_bucket_cap_bytes = 4 << 10});
    const Params want = snapshot_params(*ref);
    CHECK(max_rel_diff(got[0], want) < 1e-5);
    CHECK(max_rel_diff(got[1], want) < 1e-5);
  }

  TEST_CASE("resnet18 with bf16 activations: world 2 equals accumulating W per-rank micro-batches") {
    // As above with ResNet<float, Cpu, bfloat16> (docs/decisions/0070): buckets and parameters stay float, and
    // halving a bf16 dlogits is exact, so DDP's average and the reference's accumulation agree to float rounding.
    const int world = 2;
    const std::int64_t B = 4;
    const int steps = 2;
    Exec<Cpu> exec;
    auto ref = small_resnet<bfloat16>(100);
    optim::SGD<float, Cpu> ropt(*ref, kSgd);
    for (int s = 0; s < steps; ++s) {
      ropt.zero_grad();
      for (int r = 0; r < world; ++r) local_backward(exec, *ref, range(s * world * B + r * B, B), 1.0f / world);
      ropt.step(exec);
    }
    auto got = run_ddp_resnet<bfloat16>(world, B, steps, /*eval_bn=*/false, {.bucket_cap_bytes = 16 << 10});
    const Params want = snapshot_params(*ref);
    CHECK(max_rel_diff(got[0], want) < 1e-5);
    CHECK(got[0] == got[1]);
  }

  TEST_CASE("no_sync: m accumulated micro-batches equal one step on the concatenated batch") {
    const int world = 2, m = 3;
    const std::int64_t B = 4;
    Exec<Cpu> exec;
    auto ref = toy_model(1);
    optim::SGD<float, Cpu> ropt(ref->parameters(), kSgd);
    ropt.zero_grad();
    toy_pass(exec, *ref, 0, world * m * B);
    ropt.step(exec);
    std::vector<Params> got(world);
    check_all_ok(test::run_ranks(world, [&](comm::TcpCommunicator& c) {
      Exec<Cpu> ex;
      auto net = toy_model(1);
      DistributedDataParallel<float, Cpu> model(*net, c);
      optim::SGD<float, Cpu> opt(net->parameters(), kSgd);
      opt.zero_grad();
      // rank r takes micro-batches r*m*B + j*B; the loss of each is scaled by 1/m (as with torch).
      {
        auto guard = model.no_sync();
        for (int j = 0; j + 1 < m; ++j) toy_pass(ex, model, c.rank() * m * B + j * B, B, 1.0f / m);
      }
      REQUIRE(model.steps() == 0);  // nothing synchronised yet
      toy_pass(ex, model, c.rank() * m * B + (m - 1) * B, B, 1.0f / m);
      opt.step(ex);
      got[static_cast<std::size_t>(c.rank())] = snapshot_params(*net);
    }));
    const Params want = snapshot_params(*ref);
    CHECK(max_rel_diff(got[0], want) < 1e-5);
    CHECK(got[0] == got[1]);
  }

  TEST_CASE("buffers: broadcast from rank 0 at construction and on request") {
    const int world = 2;
    std::vector<std::vector<float>> mean_after_ctor(world), mean_before_fwd(world);
    std::vector<std::int64_t> tracked(world);
    check_all_ok(test::run_ranks(world, [&](comm::TcpCommunicator& c) {
      Exec<Cpu> ex;
      auto net = small_resnet(5);
      auto* rm = net->find_buffer("bn1.running_mean");
      REQUIRE(rm);
      for (std::int64_t i = 0; i < rm->real().numel(); ++i) rm->real().data()[i] = float(c.rank() + 1);  // ranks differ
      DistributedDataParallel<float, Cpu> model(*net, c);
      mean_after_ctor[static_cast<std::size_t>(c.rank())].assign(rm->real().data(), rm->real().data() + rm->real().numel());
      for (int s = 0; s < 2; ++s) {
        auto batch = data::make_batch(images(), range(c.rank() * 4 + s * 8, 4), 0);  // different data per rank
        nn::CrossEntropyLoss<float, Cpu> ce;
        auto y = model.forward(ex, batch.images.cview());
        ce.forward(ex, y.cview(), batch.labels.cview());
        model.backward(ex, ce.backward(ex).cview());
      }
      // After two local updates the ranks' running stats differ; the next forward's broadcast equalises them.
      model.broadcast_buffers();
      mean_before_fwd[static_cast<std::size_t>(c.rank())].assign(rm->real().data(), rm->real().data() + rm->real().numel());
      tracked[static_cast<std::size_t>(c.rank())] = net->find_buffer("bn1.num_batches_tracked")->count().data()[0];
    }));
    CHECK(mean_after_ctor[1] == std::vector<float>(mean_after_ctor[1].size(), 1.0f));
    CHECK(mean_before_fwd[0] == mean_before_fwd[1]);
    CHECK(tracked[0] == 2);
    CHECK(tracked[1] == 2);
  }

  TEST_CASE("a parameter without a gradient is named; with find_unused_parameters it keeps no gradient") {
    check_all_ok(test::run_ranks(2, [&](comm::TcpCommunicator& c) {
      Exec<Cpu> ex;
      TwoHeads net;
      DistributedDataParallel<float, Cpu> model(net, c);
      CHECK_THROWS_WITH_AS(toy_pass(ex, model, c.rank() * 4, 4),
                           "ddp: parameter 'unused.weight' received no gradient in step 0 (2 parameter(s) without a "
                           "gradient: 'unused.weight', 'unused.bias'); DistributedDataParallel all-reduces every "
                           "parameter in every synchronised step, so each one must take part in the loss. Use it in "
                           "forward, remove it from the model, or set .find_unused_parameters = true "
                           "(--find-unused-parameters)",
                           Error);
    }));
    check_all_ok(test::run_ranks(2, [&](comm::TcpCommunicator& c) {
      Exec<Cpu> ex;
      TwoHeads net;
      DistributedDataParallel<float, Cpu> model(net, c, {.find_unused_parameters = true});
      net.zero_grad();
      toy_pass(ex, model, c.rank() * 4, 4);
      toy_pass(ex, model, c.rank() * 4, 4);  // a second step works too (after the bucket rebuild)
      CHECK_FALSE(net.find_parameter("unused.weight")->has_grad());  // no rank used it: torch's .grad is None
      CHECK(net.find_parameter("unused.weight")->grad().data()[0] == 0.0f);
      CHECK(net.find_parameter("used.weight")->has_grad());
      CHECK(net.find_parameter("used.weight")->grad().data()[0] != 0.0f);
    }));
  }

  TEST_CASE("different parameter shapes on two ranks: every rank raises, naming the rank and the parameter") {
    std::vector<std::string> msgs(2);
    auto errors = test::run_ranks(2, [&](comm::TcpCommunicator& c) {
      nn::Linear<float, Cpu> net({.in_features = 20, .out_features = c.rank() == 0 ? 1 : 2});
      try {
        DistributedDataParallel<float, Cpu> model(net, c);
      } catch (const ValueError& e) {
        msgs[static_cast<std::size_t>(c.rank())] = e.what();
      }
    });
    check_all_ok(errors);
    CHECK(msgs[0] == "ddp: DistributedDataParallel needs the same model on every rank: rank 1 differs from rank 0 at "
                     "parameter #0 (here on rank 0: 'weight' (1, 20)). Build the same architecture (same options) on "
                     "every rank before wrapping it");
    CHECK(msgs[1] == "ddp: DistributedDataParallel needs the same model on every rank: rank 1 differs from rank 0 at "
                     "parameter #0 (here on rank 1: 'weight' (2, 20)). Build the same architecture (same options) on "
                     "every rank before wrapping it");
    // A different parameter count is caught before the shapes are compared (no collective of mismatched size).
    auto counts = test::run_ranks(2, [&](comm::TcpCommunicator& c) {
      std::unique_ptr<nn::Module<float, Cpu>> net;
      if (c.rank() == 0)
        net = std::make_unique<TwoHeads>();
      else
        net = std::make_unique<nn::Linear<float, Cpu>>(nn::LinearOptions{.in_features = 20, .out_features = 1});
      std::string msg;
      try {
        DistributedDataParallel<float, Cpu> model(*net, c);
      } catch (const ValueError& e) {
        msg = e.what();
      }
      CHECK(msg.find("rank 1 has a different number of parameters or dimensions than rank 0 (rank 0: 4 parameters") !=
            std::string::npos);
    });
    check_all_ok(counts);
  }

  TEST_CASE("fp16 hook divides before it sums: an average of 40000 over two ranks is 40000, not inf") {
    // torch's fp16_compress_hook: (g / W) in fp16, summed. Summing first would give 80000 > 65504 (fp16's max).
    check_all_ok(test::run_ranks(2, [&](comm::TcpCommunicator& c) {
      Exec<Cpu> ex;
      nn::Linear<float, Cpu> net({.in_features = 1, .out_features = 1});
      DistributedDataParallel<float, Cpu> model(net, c, {.comm_hook = parallel::CommHookKind::Fp16});
      net.zero_grad();
      Tensor<float, Cpu> x(Shape{1, 1});
      x.data()[0] = 1.0f;
      model.forward(ex, x.cview());
      Tensor<float, Cpu> dy(Shape{1, 1});
      dy.data()[0] = 40000.0f;  // d(loss)/dy = 40000 on both ranks -> weight and bias gradients 40000
      model.backward(ex, dy.cview());
      CHECK(net.find_parameter("weight")->grad().data()[0] == 40000.0f);  // exact in fp16 (40000 = 625 * 64)
      CHECK(net.find_parameter("bias")->grad().data()[0] == 40000.0f);
    }));
  }

  TEST_CASE("user hooks: the guide's counting hook; Sum, halve in `then`, defer a second Sum; deferred errors raise") {
    // The contract of parallel/grad_bucket.hpp, the same on both devices (the CUDA test runs the same hook shape).
    // The guide's hook (section 10) averages like the default: the same bits, 21 floats x 4 bytes x 2 steps counted.
    // Sum / halve / Sum: ((g0 + g1) * 0.5) summed over 2 ranks = g0 + g1, exactly twice the default hook's average
    // (x / 2 and x * 0.5 are exact).
    const std::int64_t B = 8;
    std::vector<std::vector<float>> plain(2), counted(2), hooked(2);
    std::vector<std::size_t> bytes(2);
    check_all_ok(test::run_ranks(2, [&](comm::TcpCommunicator& c) {
      const auto r = static_cast<std::size_t>(c.rank());
      for (int variant : {0, 1, 2}) {
        Exec<Cpu> ex;
        auto net = toy_model(1);
        DistributedDataParallel<float, Cpu> model(*net, c);
        auto counter = std::make_shared<std::size_t>(0);
        if (variant == 1) model.register_comm_hook(test_ddp::counting_hook<float, Cpu>(counter));
        if (variant == 2)
          model.register_comm_hook([](parallel::GradBucket<float, Cpu>& b) {
            comm::Work w = b.comm->all_reduce(b.view(), {.op = comm::ReduceOp::Sum, .stream = stream_of(b.exec)});
            return parallel::HookResult{.work = std::move(w), .then = [b] {
                                          Kernels<Cpu>::scale(b.exec, 0.5f, b.view());
                                          b.defer(b.comm->all_reduce(b.view(), {.op = comm::ReduceOp::Sum}));
                                        }};
          });
        for (int step = 0; step < 2; ++step) {  // step 1 runs on the rebuilt buckets
          net->zero_grad();
          toy_pass(ex, model, step * 2 * B + c.rank() * B, B);
        }
        bytes[r] += *counter;
        auto& out = variant == 0 ? plain[r] : variant == 1 ? counted[r] : hooked[r];
        for (auto* p : net->parameters()) out.insert(out.end(), p->grad().data(), p->grad().data() + p->numel());
      }
      auto net = toy_model(1);
      DistributedDataParallel<float, Cpu> model(*net, c);
      // A deferred Work's error reaches the caller of backward (DDP waited for it).
      model.register_comm_hook([](parallel::GradBucket<float, Cpu>& b) {
        const comm::Work failed =
            comm::Work::completed("test op", std::make_exception_ptr(CommError("test op failed on purpose")));
        return parallel::HookResult{.work = b.comm->all_reduce(b.view(), {.op = comm::ReduceOp::Avg}),
                                    .then = [b, failed] { b.defer(failed); }};
      });
      Exec<Cpu> ex;
      CHECK_THROWS_WITH_AS(toy_pass(ex, model, c.rank() * B, B), "test op failed on purpose", CommError);
      CHECK_THROWS_WITH_AS(model.register_comm_hook({}),
                           "ddp: register_comm_hook got an empty hook; pass e.g. parallel::allreduce_hook<T, D>()",
                           ValueError);
    }));
    for (std::size_t r = 0; r < 2; ++r) {
      REQUIRE(hooked[r].size() == plain[r].size());
      std::size_t differ = 0;
      for (std::size_t i = 0; i < plain[r].size(); ++i) differ += hooked[r][i] != 2.0f * plain[r][i];
      CHECK(differ == 0);
      CHECK(counted[r] == plain[r]);
      CHECK(bytes[r] == 21 * sizeof(float) * 2);
    }
  }

  TEST_CASE("compression hooks' element steps round to nearest even") {
    // The functors both devices run (through Kernels<D>::for_each_index). Inputs are 2 x v with
    // W = 2 (scale 0.5, exact), so the rounding to 16 bits is the only one; expected bits by IEEE hand rules.
    const float scale = parallel::detail::compress_scale(2);
    CHECK(scale == 0.5f);
    const std::vector<float> f16_in = {80000.0f, 2.0f * (1.0f + 0x1p-11f), 2.0f * (1.0f + 3 * 0x1p-11f), 131008.0f,
                                       131040.0f, 2.0f * 0x1p-25f, -2.0f * 0x1p-24f};
    // 40000 exact; 1 + 2^-11 ties down to 1 (even); 1 + 3 * 2^-11 ties up to 1 + 2^-9 (even); 65504 the
    // largest half; 65520 ties to inf; 2^-25 ties to 0; -2^-24 the smallest subnormal.
    const std::vector<std::uint16_t> f16_want = {0x78e2, 0x3c00, 0x3c02, 0x7bff, 0x7c00, 0x0000, 0x8001};
    std::vector<half> h(f16_in.size());
    const parallel::detail::CompressToWire<float, half> to_half{.bucket = f16_in.data(), .wire = h.data(),
                                                                .inv_world = scale};
    for (std::size_t i = 0; i < h.size(); ++i) {
      to_half(i);
      CHECK(h[i].bits == f16_want[i]);
    }
    std::vector<float> back(h.size());
    const parallel::detail::DecompressFromWire<float, half> from_half{.wire = h.data(), .bucket = back.data()};
    for (std::size_t i = 0; i < back.size(); ++i) from_half(i);
    CHECK(back[0] == 40000.0f);
    CHECK(back[2] == 1.0f + 0x1p-9f);
    CHECK(std::isinf(back[4]));
    CHECK(back[6] == -0x1p-24f);
    // bfloat16 (7 mantissa bits): 1 + 2^-8 ties down to 1, 1 + 3 * 2^-8 up to 1 + 2^-6.
    const std::vector<float> bf_in = {2.0f * (1.0f + 0x1p-8f), 2.0f * (1.0f + 3 * 0x1p-8f)};
    std::vector<bfloat16> b(bf_in.size());
    const parallel::detail::CompressToWire<float, bfloat16> to_bf16{.bucket = bf_in.data(), .wire = b.data(),
                                                                    .inv_world = scale};
    to_bf16(0);
    to_bf16(1);
    CHECK(b[0].bits == 0x3f80);
    CHECK(b[1].bits == 0x3f82);

    for (auto k : {parallel::CommHookKind::Allreduce, parallel::CommHookKind::Fp16, parallel::CommHookKind::Bf16,
                   parallel::CommHookKind::PowerSgd})
      CHECK(parallel::parse_comm_hook(std::string(parallel::comm_hook_name(k))) == k);
  }

  TEST_CASE("gradient_as_bucket_view: gradients live in the buckets, results are bitwise those of copying") {
    // Small buckets, so that there are several and the rebuild after step 0 moves gradients between them.
    const parallel::DdpOptions copying{
        .bucket_cap_bytes = 16 << 10, .first_bucket_cap_bytes = 4 << 10, .gradient_as_bucket_view = false};
    parallel::DdpOptions viewing = copying;
    viewing.gradient_as_bucket_view.reset();  // the CPU default: views
    const auto a = run_ddp_resnet(2, 4, 3, /*eval_bn=*/false, copying);
    const auto b = run_ddp_resnet(2, 4, 3, /*eval_bn=*/false, viewing);
    for (int r = 0; r < 2; ++r) CHECK(b[static_cast<std::size_t>(r)] == a[static_cast<std::size_t>(r)]);

    check_all_ok(test::run_ranks(2, [&](comm::TcpCommunicator& c) {
      Exec<Cpu> ex;
      auto net = small_resnet(3);
      const auto params = net->parameters();
      std::vector<float> grads_before;
      {
        DistributedDataParallel<float, Cpu> model(*net, c, viewing);
        for (int s = 0; s < 2; ++s) {
          net->zero_grad();
          local_backward(ex, model, range(c.rank() * 4, 4));
        }
        // Each bucket's gradients are one flat buffer: parameter k of a bucket starts offsets[k] after the first.
        CHECK(model.buckets().size() > 2);
        for (const auto& l : model.buckets()) {
          const float* base = params[l.params[0]]->grad().data();
          for (std::size_t k = 0; k < l.params.size(); ++k) {
            CHECK(params[l.params[k]]->grad_is_view());
            CHECK(params[l.params[k]]->grad().data() == base + l.offsets[k]);
          }
        }
        for (auto* p : params) grads_before.insert(grads_before.end(), p->grad().data(), p->grad().data() + p->numel());
      }
      // Without DDP the gradients own their memory again, with the same values.
      std::vector<float> grads_after;
      for (auto* p : params) {
        CHECK_FALSE(p->grad_is_view());
        grads_after.insert(grads_after.end(), p->grad().data(), p->grad().data() + p->numel());
      }
      CHECK(grads_after == grads_before);
    }));
  }

  TEST_CASE("overlap: with small buckets, all-reduces start before backward ends") {
    std::vector<parallel::StepTrace> traces(2);
    std::vector<std::size_t> nbuckets(2);
    check_all_ok(test::run_ranks(2, [&](comm::TcpCommunicator& c) {
      Exec<Cpu> ex;
      auto net = small_resnet(3);
      // resnet18 at width 4 holds about 45 K floats (180 KB): 16 KiB buckets give about a dozen.
      DistributedDataParallel<float, Cpu> model(*net, c, {.bucket_cap_bytes = 16 << 10, .first_bucket_cap_bytes = 4 << 10});
      for (int s = 0; s < 2; ++s) local_backward(ex, model, range(c.rank() * 4, 4));
      traces[static_cast<std::size_t>(c.rank())] = model.last_trace();
      nbuckets[static_cast<std::size_t>(c.rank())] = model.buckets().size();
    }));
    for (const auto& t : traces) {
      CHECK(t.step == 1);
      CHECK(t.buckets.size() == nbuckets[0]);
      CHECK(t.buckets.size() > 4);
      CHECK(t.launched_before_backward_end() >= 1);
      CHECK(t.buckets.front().launched < t.backward_end);
      // The real overlap: buckets that started while later gradients were still being computed.
      CHECK(t.launched_during_backward() >= 1);
      CHECK(t.launched_during_backward() <= t.buckets.size() - 1);
      CHECK(t.buckets.front().launched > t.backward_start);
      MESSAGE("buckets launched while backward still produced gradients: ", t.launched_during_backward(), " of ",
              t.buckets.size());
    }
  }

  TEST_CASE("bf16 hook stays close to the uncompressed result") {
    const int world = 2;
    const std::int64_t B = 8;
    std::vector<Params> plain(world), packed(world);
    for (auto comp : {parallel::CommHookKind::Allreduce, parallel::CommHookKind::Bf16}) {
      auto& out = comp == parallel::CommHookKind::Allreduce ? plain : packed;
      check_all_ok(test::run_ranks(world, [&](comm::TcpCommunicator& c) {
        Exec<Cpu> ex;
        auto net = toy_model(1);
        DistributedDataParallel<float, Cpu> model(*net, c, {.comm_hook = comp});
        optim::SGD<float, Cpu> opt(net->parameters(), kSgd);
        for (int s = 0; s < 3; ++s) {
          opt.zero_grad();
          toy_pass(ex, model, s * world * B + c.rank() * B, B);
          opt.step(ex);
        }
        out[static_cast<std::size_t>(c.rank())] = snapshot_params(*net);
      }));
    }
    CHECK(max_rel_diff(packed[0], plain[0]) < 1e-2);
    CHECK(max_rel_diff(packed[0], plain[0]) > 0.0);  // it really went through bf16
    CHECK(packed[0] == packed[1]);
  }
}
