// Our synchronised BatchNorm2d, ranks as threads each on a slice of the batch, against PyTorch 1.13's
// torch.nn.BatchNorm2d on the whole batch (what torch.nn.SyncBatchNorm computes; it runs only on CUDA):
// a plain step, then a step in the residual blocks' fused form y = relu(bn(x) + residual), then eval.
// Outputs, input and residual gradients, dgamma/dbeta, running statistics and num_batches_tracked.
// SPDX-License-Identifier: MIT
//
// Gradients: dy is the whole batch's upstream gradient, so each rank's dx is the slice of torch's, and
// dgamma/dbeta -- each rank's own sums, as torch's SyncBatchNorm leaves them -- add up over the ranks to
// torch's (DDP's average of them is that sum / W, matching per-rank losses that are each W times their share).
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <ddp/nn/batchnorm2d.hpp>
#include <ddp/nn/sync_batchnorm.hpp>
#include <ddp/train/safetensors.hpp>

#include "unit/comm/comm_harness.hpp"

using namespace ddp;

namespace {

using Vec = std::vector<float>;
constexpr std::int64_t kN = 8, kC = 6, kH = 3, kW = 3;
constexpr double kTol = 1e-5;  // ||ours - torch|| / ||torch|| per tensor

// Generates the reference once per test program; exits 77 (skipped) when torch is missing.
const train::SafetensorsFile& reference() {
  static const train::SafetensorsFile ref = [] {
    const std::string out = std::string(DDP_SYNCBN_TEST_OUT) + "/sync_batchnorm_ref.safetensors";
    const std::string cmd = std::string(DDP_TEST_PYTHON) + " " + DDP_SYNCBN_TEST_DIR + "/sync_batchnorm_reference.py " +
                            DDP_REFERENCE_DIR + " " + out;
    const int rc = std::system(cmd.c_str());
    const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    if (code == 77) {
      std::printf("SKIP: sync_batchnorm_reference.py could not run (torch missing)\n");
      std::fflush(stdout);
      std::exit(77);
    }
    if (code != 0) throw std::runtime_error(cmd + " failed with exit code " + std::to_string(code));
    return train::read_safetensors(out);
  }();
  return ref;
}

Vec ref_vec(const std::string& name) { return reference().at(name).as<float>(); }

// Rows [begin, begin + n) of an NHWC (kN, kH, kW, kC) reference tensor.
Tensor<float, Cpu> slice(const std::string& name, std::int64_t begin, std::int64_t n) {
  const Vec v = ref_vec(name);
  const std::int64_t per = kH * kW * kC;
  Tensor<float, Cpu> t(Shape{n, kH, kW, kC});
  std::copy_n(v.data() + begin * per, n * per, t.data());
  return t;
}

double rel_error(const Vec& a, const Vec& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

Vec vec(const Tensor<float, Cpu>& t) { return Vec(t.data(), t.data() + t.numel()); }

struct RankOut {
  Vec y1, dx1, dgamma1, dbeta1, y2, dx2, dres2, dgamma2, dbeta2, running_mean, running_var, y_eval;
  std::int64_t tracked = 0;
};

// World sizes.size(), rank r on rows [offset_r, offset_r + sizes[r]); returns the worst relative error.
double against_torch(const std::vector<std::int64_t>& sizes) {
  const int world = static_cast<int>(sizes.size());
  std::vector<std::int64_t> offset(sizes.size(), 0);
  for (std::size_t r = 1; r < sizes.size(); ++r) offset[r] = offset[r - 1] + sizes[r - 1];
  std::vector<RankOut> outs(sizes.size());
  (void)reference();  // generated before the rank threads start
  const auto errors = test::run_ranks(world, [&](comm::TcpCommunicator& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    const std::int64_t b = offset[r], n = sizes[r];
    Exec<Cpu> exec{};
    nn::BatchNorm2d<float, Cpu> bn({.num_features = kC});
    nn::convert_sync_batchnorm(bn, c);
    const Vec gamma = ref_vec("gamma"), beta = ref_vec("beta");
    std::copy(gamma.begin(), gamma.end(), bn.weight().value().data());
    std::copy(beta.begin(), beta.end(), bn.bias().value().data());
    RankOut& o = outs[r];
    bn.train();
    // Step 1: plain BatchNorm.
    const auto x1 = slice("x1", b, n), dy1 = slice("dy1", b, n);
    bn.zero_grad();
    auto y1 = bn.forward(exec, x1.cview());
    auto dx1 = bn.backward(exec, dy1.cview());
    o.y1 = vec(y1);
    o.dx1 = vec(dx1);
    o.dgamma1 = vec(bn.weight().grad());
    o.dbeta1 = vec(bn.bias().grad());
    // Step 2: y = relu(bn(x) + residual), the fused path of the residual blocks.
    const auto x2 = slice("x2", b, n), res2 = slice("res2", b, n), dy2 = slice("dy2", b, n);
    bn.zero_grad();
    auto y2 = bn.forward_act(exec, x2.cview(), res2.cview(), /*relu=*/true);
    Tensor<float, Cpu> dres2(x2.shape());
    auto dx2 = bn.backward_act(exec, dy2.cview(), y2.cview(), dres2.view());
    o.y2 = vec(y2);
    o.dx2 = vec(dx2);
    o.dres2 = vec(dres2);
    o.dgamma2 = vec(bn.weight().grad());
    o.dbeta2 = vec(bn.bias().grad());
    o.running_mean = vec(bn.running_mean());
    o.running_var = vec(bn.running_var());
    o.tracked = bn.num_batches_tracked().data()[0];
    // Eval on this rank's slice of x1: running statistics, no communication (an empty batch is an error there).
    bn.eval();
    if (n > 0) o.y_eval = vec(bn.forward(exec, x1.cview()));
  });
  for (const auto& e : errors) REQUIRE_MESSAGE(!e, test::message(e));

  double worst = 0;
  auto compare = [&](const std::string& what, const Vec& ours, const std::string& ref_name) {
    const double e = rel_error(ours, ref_vec(ref_name));
    worst = std::max(worst, e);
    INFO(what << ": relative error " << e << " (tolerance " << kTol << ")");
    CHECK(e <= kTol);
  };
  auto concat = [&](Vec RankOut::*field) {
    Vec all;
    for (const RankOut& o : outs) all.insert(all.end(), (o.*field).begin(), (o.*field).end());
    return all;
  };
  auto summed = [&](Vec RankOut::*field) {
    Vec s(static_cast<std::size_t>(kC), 0.0f);
    for (const RankOut& o : outs)
      for (std::size_t k = 0; k < s.size(); ++k) s[k] += (o.*field)[k];
    return s;
  };
  compare("y1", concat(&RankOut::y1), "y1");
  compare("dx1", concat(&RankOut::dx1), "dx1");
  compare("dgamma1 (sum over ranks)", summed(&RankOut::dgamma1), "dgamma1");
  compare("dbeta1 (sum over ranks)", summed(&RankOut::dbeta1), "dbeta1");
  compare("y2", concat(&RankOut::y2), "y2");
  compare("dx2", concat(&RankOut::dx2), "dx2");
  compare("dres2", concat(&RankOut::dres2), "dres2");
  compare("dgamma2 (sum over ranks)", summed(&RankOut::dgamma2), "dgamma2");
  compare("dbeta2 (sum over ranks)", summed(&RankOut::dbeta2), "dbeta2");
  compare("y_eval", concat(&RankOut::y_eval), "y_eval");
  for (const RankOut& o : outs) {
    compare("running_mean", o.running_mean, "running_mean");
    compare("running_var", o.running_var, "running_var");
    CHECK(o.tracked == reference().at("num_batches_tracked").as<std::int64_t>()[0]);
  }
  return worst;
}

}  // namespace

TEST_CASE("SyncBatchNorm vs torch.nn.BatchNorm2d on the whole batch: 2 and 4 equal slices, uneven 3 + 5") {
  const double w2 = against_torch({4, 4});
  const double w4 = against_torch({2, 2, 2, 2});
  const double uneven = against_torch({3, 5});
  const double with_empty = against_torch({5, 0, 3});  // a rank without rows still takes part
  MESSAGE("worst relative error vs torch: world 2 ", w2, ", world 4 ", w4, ", uneven 3+5 ", uneven,
          ", 5+0+3 ", with_empty);
}
