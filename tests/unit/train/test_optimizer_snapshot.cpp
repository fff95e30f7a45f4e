// train: snapshots and copy_state of AdamW (moments, per-parameter step counts) and of parameter groups'
// learning rates; the learning rate is restored; an AdamW snapshot does not load into SGD. State dicts under
// another implementation's names (StateDictKeys): the DDP tutorial's minGPT names of nn::GPT and the errors that
// name both keys. (PyTorch's own file of the tutorial's model loads in tests/interop/reference/test_gpt_ops.cpp.)
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <ddp/nn/gpt.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/adamw.hpp>
#include <ddp/optim/lr_schedule.hpp>
#include <ddp/optim/param_groups.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/tensor/random.hpp>
#include <ddp/train/checkpoint.hpp>
#include <ddp/train/device_state.hpp>

#include "support/temp_dir.hpp"

using namespace ddp;

namespace {

const nn::ResNetOptions kSnapshotNet{.arch = "resnet18", .num_classes = 5, .seed = 1, .width = 4};
using Net = nn::ResNet<float, Cpu>;
using Adamw = optim::AdamW<float, Cpu>;

// Groups: decay / no decay, the no-decay group at its own lr (torch: {"params": ..., "lr": ...}).
std::vector<optim::ParamGroup<float, Cpu>> groups_of(Net& net) {
  auto g = optim::weight_decay_groups(net, 0.05);
  g[1].lr = 2e-3;
  return g;
}

// Gradients from seed for every parameter except every fifth (those have none: skipped by the step).
void fake_grads(Net& net, std::uint64_t seed) {
  auto ps = net.parameters();
  for (std::size_t i = 0; i < ps.size(); ++i) {
    ps[i]->zero_grad();
    if (i % 5 == 0) continue;
    Generator(seed + i).fill_normal(ps[i]->grad().view(), 0.0, 1.0);
    ps[i]->set_grad_written();
  }
}

bool same(const Tensor<float, Cpu>& a, const Tensor<float, Cpu>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

void expect_same_state(Net& a, Adamw& oa, Net& b, Adamw& ob) {
  auto pa = a.parameters(), pb = b.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) CHECK(same(pa[i]->value(), pb[i]->value()));
  for (std::size_t i = 0; i < oa.parameters().size(); ++i) {
    INFO(oa.parameters()[i]->name());
    CHECK(oa.param_step(i) == ob.param_step(i));
    for (const char* s : {"exp_avg", "exp_avg_sq"}) {
      const auto *x = oa.state(s, i), *y = ob.state(s, i);
      REQUIRE((x == nullptr) == (y == nullptr));
      if (x) CHECK(same(*x, *y));
    }
  }
  CHECK(oa.lr() == ob.lr());
  CHECK(oa.group_lr(1) == ob.group_lr(1));
  CHECK(oa.steps() == ob.steps());
}

}  // namespace

TEST_SUITE("train") {
  TEST_CASE("an AdamW snapshot restores moments, step counts, lr and group lrs; training continues bit for bit") {
    Exec<Cpu> exec;
    Net net(kSnapshotNet);
    Adamw opt(groups_of(net), {.lr = 1e-3});
    const optim::LrSchedule sched({.policy = optim::LrPolicy::Cosine, .base_lr = 1e-3, .t_max = 5, .warmup_steps = 2});
    for (int k = 0; k < 3; ++k) {
      fake_grads(net, 100 * k);
      sched.apply(opt);
      opt.step(exec);
    }
    CHECK(opt.param_step(0) == 0);  // parameter 0 never had a gradient
    CHECK(opt.param_step(1) == 3);
    const auto bytes = train::serialize_snapshot(net, opt, {.epoch = 4});

    Net back({.arch = "resnet18", .num_classes = 5, .seed = 9, .width = 4});
    Adamw bopt(groups_of(back), {.lr = 0.5});
    CHECK(train::load_snapshot_bytes<float>(bytes, back, bopt).epoch == 4);
    expect_same_state(net, opt, back, bopt);
    CHECK(bopt.lr() == sched.lr_at(2));  // the lr of the last step, exactly
    CHECK(bopt.group_lr(1) == sched.lr_at(2, 2e-3));

    // One more step on both, the schedule continuing from the restored step count.
    fake_grads(net, 900);
    fake_grads(back, 900);
    sched.apply(opt);
    sched.apply(bopt);
    opt.step(exec);
    bopt.step(exec);
    expect_same_state(net, opt, back, bopt);

    // The file names the optimizer: it does not load into SGD (nor an SGD snapshot into AdamW).
    optim::SGD<float, Cpu> sgd(groups_of(back), {.lr = 0.1, .momentum = 0.9});
    CHECK_THROWS_WITH_AS(train::load_snapshot_bytes<float>(bytes, back, sgd, "s.safetensors"),
                         "ddp: snapshot 's.safetensors' holds the state of optimizer 'adamw' but this run uses 'sgd'; "
                         "resume with the optimizer it was written with (--optimizer adamw) or start without the "
                         "snapshot",
                         IoError);
  }

  TEST_CASE("an SGD snapshot restores the learning rate (it used to be written but not read)") {
    Exec<Cpu> exec;
    Net net(kSnapshotNet);
    optim::SGD<float, Cpu> opt(net, {.lr = 0.1, .momentum = 0.9});
    opt.set_lr(0.1 / 3.0);  // not representable in 6 digits
    const auto bytes = train::serialize_snapshot(net, opt, {});
    optim::SGD<float, Cpu> other(net, {.lr = 0.5, .momentum = 0.9});
    train::load_snapshot_bytes<float>(bytes, net, other);
    CHECK(other.lr() == 0.1 / 3.0);
    CHECK(train::parse_safetensors(bytes).metadata.at("optimizer.kind") == "sgd");
  }

  TEST_CASE("copy_state and state_on copy AdamW state and groups; a host copy keeps the groups") {
    Exec<Cpu> exec;
    Net src(kSnapshotNet), dst({.arch = "resnet18", .num_classes = 5, .seed = 2, .width = 4});
    Adamw sopt(groups_of(src), {.lr = 1e-3}), dopt(groups_of(dst), {.lr = 0.5});
    fake_grads(src, 7);
    sopt.step(exec);
    sopt.set_group_lr(1, 4e-3);
    train::copy_state(exec, src, sopt, dst, dopt);
    expect_same_state(src, sopt, dst, dopt);

    Adamw ungrouped(dst.parameters(), {.lr = 0.5});  // other order and group count: refused
    CHECK_THROWS_AS(train::copy_state(exec, src, sopt, dst, ungrouped), ValueError);

    auto view = train::state_on<Cpu>(exec, src, sopt, kSnapshotNet);
    CHECK(&view.optimizer() == &sopt);
  }

  TEST_CASE("mingpt_state_dict_key maps our GPT names to the tutorial's; its state_dict loads with them") {
    using nn::mingpt_state_dict_key;
    CHECK(mingpt_state_dict_key("blocks.0.attn.attn.c_attn.weight") == "blocks.0.attn.attn.in_proj_weight");
    CHECK(mingpt_state_dict_key("blocks.12.attn.attn.c_attn.bias") == "blocks.12.attn.attn.in_proj_bias");
    CHECK(mingpt_state_dict_key("blocks.1.attn.attn.c_proj.weight") == "blocks.1.attn.attn.out_proj.weight");
    CHECK(mingpt_state_dict_key("blocks.1.attn.attn.c_proj.bias") == "blocks.1.attn.attn.out_proj.bias");
    CHECK(mingpt_state_dict_key("blocks.1.attn.c_proj.weight") == "blocks.1.attn.c_proj.weight");  // the layer's own
    CHECK(mingpt_state_dict_key("emb_stem.pos_emb") == "emb_stem.pos_emb");
    CHECK(mingpt_state_dict_key("model.blocks.0.attn.attn.c_attn.weight") == "model.blocks.0.attn.attn.in_proj_weight");
    CHECK(nn::mingpt_ignored_keys(2) == std::set<std::string>{"blocks.0.attn.mask", "blocks.1.attn.mask"});

    // A file as the tutorial's model.state_dict() saved with safetensors holds: its names, its mask buffers.
    const nn::GPTOptions o{.vocab_size = 5, .block_size = 4, .n_layer = 2, .n_head = 2, .n_embd = 8, .seed = 1};
    nn::GPT<float, Cpu> src(o);
    auto write_mingpt = [&](const std::string& path, const std::string& skip, const std::string& extra) {
      train::SafetensorsWriter w;
      for (auto* p : src.parameters()) {
        const std::string key = mingpt_state_dict_key(p->name());
        if (key == skip) continue;
        w.add<float>(key, std::vector<std::int64_t>(p->shape().begin(), p->shape().end()),
                     std::span<const float>(p->value().data(), static_cast<std::size_t>(p->numel())));
      }
      for (const auto& mask : nn::mingpt_ignored_keys(o.n_layer))
        w.add<float>(mask, {1, 1, o.block_size, o.block_size}, std::vector<float>(16, 1.0f));
      if (!extra.empty()) w.add<float>(extra, {1}, std::vector<float>{0.0f});
      w.write(path);
    };
    ddp::test::TempDir tmp("ddp_mingpt_keys_");
    const std::string good = tmp.file("mingpt.safetensors");
    write_mingpt(good, "", "");
    const train::StateDictKeys mingpt{.file_key = mingpt_state_dict_key, .ignore = nn::mingpt_ignored_keys(o.n_layer)};
    auto other_seed = o;
    other_seed.seed = 2;
    nn::GPT<float, Cpu> dst(other_seed);
    train::load_state_dict(good, dst, /*strict=*/true, mingpt);
    auto ps = src.parameters(), pd = dst.parameters();
    for (std::size_t i = 0; i < ps.size(); ++i) {
      INFO(ps[i]->name());
      CHECK(same(ps[i]->value(), pd[i]->value()));
    }

    // Errors name the file's key and ours; the model is untouched. (Every load below starts from a fresh dst.)
    nn::GPT<float, Cpu> fresh(other_seed);
    const auto before = fresh.find_parameter("blocks.1.attn.attn.c_attn.bias")->value().clone();
    const std::string model = fresh.describe();
    const std::string missing = tmp.file("missing.safetensors");
    write_mingpt(missing, "blocks.1.attn.attn.in_proj_bias", "");
    CHECK_THROWS_WITH_AS(train::load_state_dict(missing, fresh, true, mingpt),
                         ("ddp: checkpoint '" + missing +
                          "' has no tensor 'blocks.1.attn.attn.in_proj_bias' (ddp's 'blocks.1.attn.attn.c_attn.bias') "
                          "that " +
                          model + " needs; is it a checkpoint of another architecture?")
                             .c_str(),
                         IoError);
    CHECK(same(before, fresh.find_parameter("blocks.1.attn.attn.c_attn.bias")->value()));
    // Our own names read with the tutorial's: the first renamed parameter is missing.
    const std::string ours = tmp.file("ours.safetensors");
    train::save_state_dict(ours, src);
    CHECK_THROWS_WITH_AS(
        train::load_state_dict(ours, fresh, true, mingpt),
        ("ddp: checkpoint '" + ours +
         "' has no tensor 'blocks.0.attn.attn.in_proj_weight' (ddp's "
         "'blocks.0.attn.attn.c_attn.weight') that " +
         model + " needs (the file was written for " + model + "); is it a checkpoint of another architecture?")
            .c_str(),
        IoError);
    // strict: a key that is neither mapped nor ignored is unexpected -- the masks too when not ignored.
    const std::string extra = tmp.file("extra.safetensors");
    write_mingpt(extra, "", "blocks.0.attn.bias_mask");
    CHECK_THROWS_WITH_AS(train::load_state_dict(extra, fresh, true, mingpt),
                         ("ddp: checkpoint '" + extra + "' holds tensor 'blocks.0.attn.bias_mask' that " + model +
                          " does not have; is it a checkpoint of another architecture?")
                             .c_str(),
                         IoError);
    CHECK_THROWS_WITH_AS(train::load_state_dict(good, fresh, true, {.file_key = mingpt_state_dict_key}),
                         ("ddp: checkpoint '" + good + "' holds tensor 'blocks.0.attn.mask' that " + model +
                          " does not have; is it a checkpoint of another architecture?")
                             .c_str(),
                         IoError);
    CHECK(same(before, fresh.find_parameter("blocks.1.attn.attn.c_attn.bias")->value()));
    CHECK_NOTHROW(train::load_state_dict(extra, fresh, /*strict=*/false, mingpt));
    CHECK(same(src.find_parameter("blocks.1.attn.attn.c_attn.bias")->value(),
               fresh.find_parameter("blocks.1.attn.attn.c_attn.bias")->value()));
    // A key map that sends two of our names to one key would load one tensor twice.
    CHECK_THROWS_WITH_AS(
        train::load_state_dict(good, fresh, true, {.file_key = [](const std::string&) { return std::string("w"); }}),
        ("ddp: load_state_dict: the key map sends both 'emb_stem.pos_emb' and 'emb_stem.tok_emb.weight' of " + model +
         " to the file key 'w'; each name needs a key of its own")
            .c_str(),
        ValueError);
  }
}
