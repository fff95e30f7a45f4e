// kernels: Kernels<Cpu>'s fused and multi-tensor members give the same bits as the unfused members run in a row.
// SPDX-License-Identifier: MIT
//
// batchnorm_act_forward/backward against batchnorm_forward + add + relu_forward and relu_backward +
// batchnorm_backward; sgd_step_multi against one sgd_step per tensor. Bit equality, not a tolerance: the
// modules rely on the fused forms being the unfused arithmetic (the CPU results did not move when the
// residual blocks switched to BatchNorm2d::forward_act). A 2-thread pool and tensors larger than one
// 16 Ki / 32 Ki-element chunk exercise the threaded loops.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/tensor/random.hpp>
#include <ddp/tensor/tensor.hpp>

#include "support/same_bits.hpp"

using ddp::Cpu;
using ddp::Exec;
using ddp::Shape;
using ddp::Tensor;
using K = ddp::Kernels<Cpu>;
namespace kn = ddp::kernels;
using F = Tensor<float, Cpu>;
using CView = ddp::TensorView<const float, Cpu>;

namespace {

using ddp::test::same_bits;

F random(ddp::Generator& g, const Shape& s, double lo = -1.0, double hi = 1.0) {
  F t(s);
  g.fill_uniform(t.view(), lo, hi);
  return t;
}

}  // namespace

TEST_SUITE("kernels") {
  TEST_CASE("batchnorm_act on the CPU is bit-identical to bn, add, relu (and relu_backward, bn backward)") {
    kn::cpu::ThreadPool pool(2);
    const Exec<Cpu> e{.pool = &pool};
    struct Case {
      bool training, residual, relu, want_dresidual;
    };
    for (const Case c : {Case{true, true, true, true}, Case{true, false, true, false}, Case{false, true, true, true},
                         Case{true, true, false, true}, Case{true, false, false, false},
                         Case{true, true, true, false}}) {
      INFO("training ", c.training, " residual ", c.residual, " relu ", c.relu, " dresidual ", c.want_dresidual);
      ddp::Generator gen(7);
      const Shape xs{3, 7, 9, 37}, cs{37};  // 6,993 rows: several 256-row chunks per thread
      F x = random(gen, xs, -2.0, 3.0), res = random(gen, xs), dy = random(gen, xs), gamma = random(gen, cs, 0.5, 1.5),
        beta = random(gen, cs), rm0 = random(gen, cs), rv0 = random(gen, cs, 0.5, 2.0);
      const CView none;

      // Reference: the unfused members one after the other.
      F rm = rm0.clone(), rv = rv0.clone(), y(xs), sm(cs), si(cs);
      const kn::BatchNormForwardArgs<float, Cpu> fa{.x = x.cview(), .gamma = gamma.cview(), .beta = beta.cview(),
                                                    .running_mean = rm.view(), .running_var = rv.view(),
                                                    .y = y.view(), .save_mean = sm.view(), .save_invstd = si.view(),
                                                    .training = c.training};
      K::batchnorm_forward(e, fa);
      if (c.residual) K::add(e, y.cview(), res.cview(), y.view());
      if (c.relu) K::relu_forward(e, y.cview(), y.view());
      F g = dy.clone(), dx(xs), dg(cs), db(cs);
      if (c.relu) K::relu_backward(e, y.cview(), dy.cview(), g.view());
      K::batchnorm_backward(e, kn::BatchNormBackwardArgs<float, Cpu>{
                                   .x = x.cview(), .dy = g.cview(), .gamma = gamma.cview(), .save_mean = sm.cview(),
                                   .save_invstd = si.cview(), .dx = dx.view(), .dgamma = dg.view(),
                                   .dbeta = db.view(), .training = c.training});

      // Fused members.
      F frm = rm0.clone(), frv = rv0.clone(), fy(xs), fsm(cs), fsi(cs);
      kn::BatchNormForwardArgs<float, Cpu> ffa = fa;
      ffa.running_mean = frm.view();
      ffa.running_var = frv.view();
      ffa.y = fy.view();
      ffa.save_mean = fsm.view();
      ffa.save_invstd = fsi.view();
      K::batchnorm_act_forward(
          e, kn::BatchNormActForwardArgs<float, Cpu>{.bn = ffa, .residual = c.residual ? res.cview() : none,
                                                     .relu = c.relu});
      F fdx(xs), fdg(cs), fdb(cs), fdres = F::full(xs, 42.0f);
      K::batchnorm_act_backward(
          e, kn::BatchNormActBackwardArgs<float, Cpu>{
                 .bn = {.x = x.cview(), .dy = dy.cview(), .gamma = gamma.cview(), .save_mean = fsm.cview(),
                        .save_invstd = fsi.cview(), .dx = fdx.view(), .dgamma = fdg.view(), .dbeta = fdb.view(),
                        .training = c.training},
                 .y = fy.cview(),
                 .dresidual = c.want_dresidual ? fdres.view() : ddp::TensorView<float, Cpu>{},
                 .relu = c.relu});

      CHECK(same_bits(y, fy));
      CHECK(same_bits(sm, fsm));
      CHECK(same_bits(si, fsi));
      CHECK(same_bits(rm, frm));
      CHECK(same_bits(rv, frv));
      CHECK(same_bits(dx, fdx));
      CHECK(same_bits(dg, fdg));
      CHECK(same_bits(db, fdb));
      if (c.want_dresidual) CHECK(same_bits(g, fdres));  // the residual's gradient is the masked dy
    }
  }

  TEST_CASE("batchnorm_act checks its residual and ReLU mask like the CUDA kernel") {
    const Exec<Cpu> e;
    F x = F::zeros({2, 3, 3, 4}), y = F::zeros({2, 3, 3, 4}), res = F::zeros({2, 3, 3, 5});
    F c1 = F::full({4}, 1.0f), c0 = F::zeros({4}), rm = F::zeros({4}), rv = F::full({4}, 1.0f), sm = F::zeros({4}),
      si = F::zeros({4});
    const kn::BatchNormForwardArgs<float, Cpu> bn{.x = x.cview(), .gamma = c1.cview(), .beta = c0.cview(),
                                                  .running_mean = rm.view(), .running_var = rv.view(), .y = y.view(),
                                                  .save_mean = sm.view(), .save_invstd = si.view()};
    CHECK_THROWS_WITH_AS(
        K::batchnorm_act_forward(e, kn::BatchNormActForwardArgs<float, Cpu>{.bn = bn, .residual = res.cview()}),
        "ddp: batchnorm_act_forward: residual has shape (2, 3, 3, 5) but must be (2, 3, 3, 4)", ddp::ValueError);
    F dx = F::zeros({2, 3, 3, 4});
    const kn::BatchNormBackwardArgs<float, Cpu> bb{.x = x.cview(), .dy = y.cview(), .gamma = c1.cview(),
                                                   .save_mean = sm.cview(), .save_invstd = si.cview(),
                                                   .dx = dx.view()};
    CHECK_THROWS_WITH_AS(K::batchnorm_act_backward(e, kn::BatchNormActBackwardArgs<float, Cpu>{.bn = bb}),
                         "ddp: batchnorm_act_backward: relu = true needs the forward output y (the ReLU mask)",
                         ddp::ValueError);
  }

  TEST_CASE("sgd_step_multi on the CPU is bit-identical to one sgd_step per tensor, over two steps") {
    kn::cpu::ThreadPool pool(2);
    const Exec<Cpu> e{.pool = &pool};
    for (const bool nesterov : {false, true}) {
      INFO("nesterov ", nesterov);
      ddp::Generator gen(11);
      // An empty tensor, small ones, and ones of several 32 Ki-element chunks (the threaded path).
      const std::vector<std::int64_t> sizes{5, 0, 301, (std::int64_t{1} << 15) * 3 + 7, 64, (std::int64_t{1} << 16) + 1};
      std::vector<F> p, g, buf, mp, mbuf;
      for (const std::int64_t n : sizes) {
        p.push_back(random(gen, {n}));
        g.push_back(random(gen, {n}));
        buf.emplace_back(Shape{n});
        mp.push_back(p.back().clone());
        mbuf.push_back(F::full({n}, 42.0f));  // the first step must overwrite every buffer element
      }
      for (int step = 0; step < 2; ++step) {
        std::vector<kn::SgdTensor<float>> ts;
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          const bool first = step == 0 || i == 2;  // tensor 2 joins late, as a parameter whose buffer is new
          K::sgd_step(e, kn::SgdArgs<float, Cpu>{.param = p[i].view(), .grad = g[i].cview(),
                                                 .momentum_buffer = buf[i].view(), .first_step = first, .lr = 0.05,
                                                 .momentum = 0.9, .weight_decay = 1e-4, .nesterov = nesterov});
          ts.push_back({.param = mp[i].data(), .grad = g[i].data(), .momentum_buffer = mbuf[i].data(),
                        .numel = sizes[i], .first_step = first});
        }
        K::sgd_step_multi(e, kn::MultiSgdArgs<float, Cpu>{.tensors = ts, .lr = 0.05, .momentum = 0.9,
                                                          .weight_decay = 1e-4, .nesterov = nesterov});
      }
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        INFO("tensor ", i, " of ", sizes[i], " elements");
        CHECK(same_bits(p[i], mp[i]));
        CHECK(same_bits(buf[i], mbuf[i]));
      }
    }
  }

  TEST_CASE("fill and the other element-wise members are shared by both devices' Kernels (CPU side)") {
    kn::cpu::ThreadPool pool(2);
    const Exec<Cpu> e{.pool = &pool};
    const std::int64_t n = (std::int64_t{1} << 15) + 3;  // two 16 Ki-element chunks and a bit
    F x = F::full({n}, 3.0f);
    K::fill(e, x.view(), -0.5f);
    K::scale(e, 4.0f, x.view());
    F y = F::full({n}, 1.0f);
    K::axpy(e, 2.0f, x.cview(), y.view());  // 1 + 2 * (-2) = -3
    K::relu_forward(e, y.cview(), y.view());
    for (std::int64_t i = 0; i < n; i += 4099) {
      CHECK(x.data()[i] == -2.0f);
      CHECK(y.data()[i] == 0.0f);
    }
    Tensor<std::int64_t, Cpu> count(Shape{3});
    K::fill(e, count.view(), std::int64_t{7});  // BatchNorm's step counter is int64
    CHECK(count.data()[2] == 7);
  }
}
