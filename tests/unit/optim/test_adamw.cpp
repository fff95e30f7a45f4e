// AdamW, parameter groups, skipping parameters without a gradient and clip_grad_norm: the worked examples of
// the headers and the errors. (The comparisons with torch.optim itself are in tests/interop/torch_optim.)
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <ddp/nn/gpt.hpp>
#include <ddp/nn/parameter.hpp>
#include <ddp/optim/adamw.hpp>
#include <ddp/optim/clip.hpp>
#include <ddp/optim/param_groups.hpp>
#include <ddp/optim/sgd.hpp>

#include "set_grad.hpp"

using namespace ddp;
using ddp::test::set_grad;

namespace {
using Param = nn::Parameter<float, Cpu>;

}  // namespace

TEST_SUITE("optim") {
  TEST_CASE("the worked example of adamw.hpp: the first step is lr * sign(g)") {
    Exec<Cpu> exec;
    Param p("w", Shape{1});
    p.value().data()[0] = 1.0f;
    optim::AdamW<float, Cpu> opt({&p}, {.lr = 0.1, .weight_decay = 0.0});
    set_grad(p, {2.0f});
    opt.step(exec);
    CHECK(p.value().data()[0] == doctest::Approx(0.9).epsilon(1e-6));
    CHECK(opt.param_step(0) == 1);
    REQUIRE(opt.state("exp_avg", 0) != nullptr);
    CHECK(opt.state("exp_avg", 0)->data()[0] == doctest::Approx(0.2));
    CHECK(opt.state("exp_avg_sq", 0)->data()[0] == doctest::Approx(0.004));
  }

  TEST_CASE("parameters without a gradient are skipped: no decay, no momentum, no step count") {
    Exec<Cpu> exec;
    Param a("a", Shape{1}), b("b", Shape{1});
    a.value().data()[0] = b.value().data()[0] = 1.0f;
    optim::SGD<float, Cpu> sgd({&a, &b}, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.5});
    set_grad(a, {1.0f});
    b.zero_grad();  // b: .grad is None
    sgd.step(exec);
    CHECK(b.value().data()[0] == 1.0f);
    CHECK(sgd.momentum_buffer(1) == nullptr);
    REQUIRE(sgd.momentum_buffer(0) != nullptr);
    const float buf = sgd.momentum_buffer(0)->data()[0];
    a.zero_grad();
    const float a_before = a.value().data()[0];
    sgd.step(exec);  // a skipped now: its buffer and value stay
    CHECK(a.value().data()[0] == a_before);
    CHECK(sgd.momentum_buffer(0)->data()[0] == buf);

    optim::AdamW<float, Cpu> adamw({&a, &b}, {.lr = 0.1});
    set_grad(b, {1.0f});
    adamw.step(exec);
    CHECK(adamw.param_step(0) == 0);
    CHECK(adamw.state("exp_avg", 0) == nullptr);
    CHECK(adamw.param_step(1) == 1);
    CHECK(a.value().data()[0] == a_before);  // no decoupled decay either
  }

  TEST_CASE("weight_decay_groups: no decay on biases and normalisation weights (rank <= 1)") {
    Param conv("conv.weight", Shape{4, 3, 3, 2}, nn::Layout::Krsc), bn_w("bn.weight", Shape{4}),
        bn_b("bn.bias", Shape{4}), fc_w("fc.weight", Shape{2, 4}), fc_b("fc.bias", Shape{2});
    const auto groups = optim::weight_decay_groups<float, Cpu>({&conv, &bn_w, &bn_b, &fc_w, &fc_b}, 0.05);
    REQUIRE(groups.size() == 2);
    CHECK(groups[0].name == "decay");
    CHECK(groups[0].weight_decay == 0.05);
    CHECK(groups[0].params == std::vector<Param*>{&conv, &fc_w});
    CHECK(groups[1].name == "no_decay");
    CHECK(groups[1].weight_decay == 0.0);
    CHECK(groups[1].params == std::vector<Param*>{&bn_w, &bn_b, &fc_b});

    optim::AdamW<float, Cpu> opt(groups, {.lr = 1e-3});
    CHECK(opt.parameters() == std::vector<Param*>{&conv, &fc_w, &bn_w, &bn_b, &fc_b});  // group after group
    CHECK(opt.group_of(2) == 1);
    CHECK(opt.group_lr(1) == 1e-3);
    opt.set_lr(2e-3);
    CHECK(opt.group_lr(1) == 2e-3);  // a group without its own lr follows lr()
  }

  TEST_CASE("linear_weight_decay_groups: minGPT's groups, decay on Linear weights only") {
    // The tutorial's create_optimizer on its GPT: decay = every Linear's weight (MultiheadAttention's
    // in_proj_weight and out_proj included), no_decay = biases, LayerNorm and Embedding weights, pos_emb.
    nn::GPT<float, Cpu> gpt({.vocab_size = 5, .block_size = 4, .n_layer = 1, .n_head = 1, .n_embd = 4});
    const auto groups = optim::linear_weight_decay_groups(gpt, 0.1);
    auto names = [](const optim::ParamGroup<float, Cpu>& g) {
      std::vector<std::string> out;
      for (auto* p : g.params) out.push_back(p->name());
      return out;
    };
    REQUIRE(groups.size() == 2);
    CHECK(groups[0].weight_decay == 0.1);
    CHECK(names(groups[0]) == std::vector<std::string>{"blocks.0.attn.c_proj.weight", "blocks.0.attn.attn.c_attn.weight",
                                                       "blocks.0.attn.attn.c_proj.weight", "blocks.0.mlp.0.weight",
                                                       "blocks.0.mlp.2.weight", "head.weight"});
    CHECK(groups[1].weight_decay == 0.0);
    CHECK(names(groups[1]) ==
          std::vector<std::string>{"emb_stem.pos_emb", "emb_stem.tok_emb.weight", "blocks.0.ln1.weight",
                                   "blocks.0.ln1.bias", "blocks.0.ln2.weight", "blocks.0.ln2.bias",
                                   "blocks.0.attn.c_proj.bias", "blocks.0.attn.attn.c_attn.bias",
                                   "blocks.0.attn.attn.c_proj.bias", "blocks.0.mlp.0.bias", "blocks.0.mlp.2.bias",
                                   "ln_f.weight", "ln_f.bias"});
  }

  TEST_CASE("parameter groups: a parameter twice, bad settings and bad AdamW options are ValueErrors") {
    Param p("w", Shape{2}), q("v", Shape{2});
    using Groups = std::vector<optim::ParamGroup<float, Cpu>>;
    auto twice = [&] { return optim::SGD<float, Cpu>(Groups{{.params = {&p}}, {.params = {&q, &p}}}, {}); };
    CHECK_THROWS_WITH_AS(twice(),
                         "ddp: SGD: parameter 'w' appears more than once in the parameter groups (group 1); give "
                         "each parameter to one group",
                         ValueError);
    auto bad_lr = [&] { return optim::AdamW<float, Cpu>(Groups{{.params = {&p}, .lr = -1.0, .name = "x"}}, {}); };
    CHECK_THROWS_WITH_AS(bad_lr(),
                         "ddp: AdamW: parameter group 0 ('x') has lr -1 and weight_decay 0; both must be >= 0",
                         ValueError);
    auto empty = [&] { return optim::AdamW<float, Cpu>(Groups{{.params = {}}}, {}); };
    CHECK_THROWS_WITH_AS(empty(),
                         "ddp: AdamW got an empty parameter list; pass model.parameters()", ValueError);
    auto bad_beta = [&] { return optim::AdamW<float, Cpu>({&p}, {.beta2 = 1.0}); };
    CHECK_THROWS_WITH_AS(bad_beta(),
                         "ddp: AdamW: invalid betas (0.9, 1); each must be in [0, 1)", ValueError);
  }

  TEST_CASE("clip_grad_norm: the worked example of clip.hpp, no clipping below max_norm, bad max_norm") {
    Exec<Cpu> exec;
    Param a("a", Shape{2}), b("b", Shape{1}), none("none", Shape{1});
    set_grad(a, {3.0f, 4.0f});
    set_grad(b, {0.0f});
    none.zero_grad();
    none.grad().data()[0] = 100.0f;  // not a gradient (has_grad() is false): ignored and untouched
    const std::vector<Param*> ps{&a, &b, &none};
    CHECK(optim::clip_grad_norm(exec, ps, 1.0) == doctest::Approx(5.0));
    CHECK(a.grad().data()[0] == doctest::Approx(0.6));
    CHECK(a.grad().data()[1] == doctest::Approx(0.8));
    CHECK(none.grad().data()[0] == 100.0f);
    CHECK(optim::clip_grad_norm(exec, ps, 2.0) == doctest::Approx(1.0).epsilon(1e-6));
    CHECK(a.grad().data()[1] == doctest::Approx(0.8));  // below max_norm: unchanged
    CHECK_THROWS_WITH_AS(optim::clip_grad_norm(exec, ps, -1.0),
                         "ddp: clip_grad_norm: max_norm -1 must be >= 0 (--clip-grad-norm)", ValueError);
  }
}
