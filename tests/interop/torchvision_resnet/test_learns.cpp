// "It learns": a small ResNet trained here on scikit-learn's 8x8 digits (converted at test time) reaches a
// held-out accuracy far above chance (10 %), and on synthetic data the training loss falls.
// SPDX-License-Identifier: MIT
//
// Model: torchvision's resnet18 structure with width 16 (channels 16-32-64-128 instead of 64-...-512; same
// names) and one input channel, on the digits upsampled to 16x16 (nearest neighbour). 1437 training and
// 360 held-out images, batch 32, SGD lr 0.05 momentum 0.9 weight decay 5e-4, cosine schedule, 6 epochs,
// 2 threads: about 10-20 s here.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <ddp/data/cifar10.hpp>
#include <ddp/data/dataset.hpp>
#include <ddp/data/synthetic.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/lr_schedule.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/tensor/random.hpp>

#include "model_test_util.hpp"

using namespace ddp;

namespace {

struct EpochStats {
  double loss = 0;
  double accuracy = 0;
};

// One pass over `ds` in batches; trains when `opt` is given, else evaluates (eval mode, no update).
EpochStats run_epoch(Exec<Cpu>& exec, nn::ResNet<float, Cpu>& model, const data::Dataset& ds,
                     optim::SGD<float, Cpu>* opt, std::uint64_t epoch, std::int64_t batch) {
  std::vector<std::int64_t> order(ds.size());
  std::iota(order.begin(), order.end(), 0);
  if (opt) {  // Fisher-Yates with our seeded generator
    Generator g(1234 + epoch, 0, kStreamShuffle);
    for (std::size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[g.uniform_int(i + 1)]);
  }
  model.train(opt != nullptr);
  nn::CrossEntropyLoss<float, Cpu> ce;
  double loss_sum = 0;
  std::int64_t correct = 0, seen = 0;
  for (std::size_t b = 0; b < order.size(); b += static_cast<std::size_t>(batch)) {
    const std::size_t e = std::min(order.size(), b + static_cast<std::size_t>(batch));
    if (opt && e - b < 2) break;  // BatchNorm needs 2 samples to train
    auto bt = data::make_batch(ds, std::span<const std::int64_t>(order.data() + b, e - b), epoch);
    auto logits = model.forward(exec, bt.images.cview());
    const double loss = ce.forward(exec, logits.cview(), bt.labels.cview());
    auto d = ce.backward(exec);
    if (opt) {
      opt->zero_grad();
      model.backward(exec, d.cview());
      opt->step(exec);
    }
    const std::int64_t n = logits.dim(0), c = logits.dim(1);
    for (std::int64_t i = 0; i < n; ++i) {
      const float* row = logits.data() + i * c;
      correct += std::max_element(row, row + c) - row == bt.labels.data()[i];
    }
    loss_sum += loss * static_cast<double>(n);
    seen += n;
  }
  return {loss_sum / static_cast<double>(seen), static_cast<double>(correct) / static_cast<double>(seen)};
}

}  // namespace

TEST_SUITE("model") {
  TEST_CASE("a small ResNet learns sklearn digits far above chance") {
    const std::string dir = DDP_MODEL_TEST_OUT;
    const std::string cmd = std::string(DDP_TEST_PYTHON) + " " + DDP_REFERENCE_DIR + "/digits_to_cifar_format.py " +
                            dir + " --size 16 --channels 1";
    const int rc = std::system(cmd.c_str());
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0) {
      std::printf("SKIP: %s failed (python3-sklearn missing?)\n", cmd.c_str());
      std::exit(77);
    }
    nlohmann::json meta;
    std::ifstream(dir + "/digits_meta.json") >> meta;
    const std::vector<float> mean = meta.at("mean").get<std::vector<float>>();
    const std::vector<float> stdv = meta.at("std").get<std::vector<float>>();
    const data::CifarOptions co{.format = {.height = 16, .width = 16, .channels = 1, .num_classes = 10},
                                .mean = mean, .std = stdv};
    data::CifarBinaryDataset train({dir + "/digits_train.bin"}, co), test({dir + "/digits_test.bin"}, co);

    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> exec{.pool = &pool};
    nn::ResNet<float, Cpu> model({.arch = "resnet18", .num_classes = 10, .seed = 1, .in_channels = 1, .width = 16});
    const int epochs = 6;
    optim::SGD<float, Cpu> opt(model, {.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4});
    const optim::LrSchedule sched({.policy = optim::LrPolicy::Cosine, .base_lr = 0.05, .t_max = epochs});
    const auto t0 = std::chrono::steady_clock::now();
    EpochStats first{}, last{};
    for (int e = 0; e < epochs; ++e) {
      opt.set_lr(sched.lr_at(e));
      last = run_epoch(exec, model, train, &opt, static_cast<std::uint64_t>(e), 32);
      if (e == 0) first = last;
      std::printf("digits epoch %d: lr %.4f train loss %.4f train accuracy %.3f\n", e, opt.lr(), last.loss,
                  last.accuracy);
    }
    const EpochStats held_out = run_epoch(exec, model, test, nullptr, 0, 64);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("digits: %zu train / %zu held-out images, held-out accuracy %.3f (chance 0.100), loss %.4f, %.1f s\n",
                train.size(), test.size(), held_out.accuracy, held_out.loss, secs);
    CHECK(last.loss < first.loss);
    CHECK(held_out.accuracy >= 0.85);
  }

  TEST_CASE("on synthetic data the training loss falls") {
    // 64 fixed random images with random labels: the net can only memorise them, so the loss must fall
    // from about ln(10) = 2.30 towards 0.
    const data::SyntheticDataset ds({.size = 64, .height = 16, .width = 16, .channels = 3, .num_classes = 10,
                                     .seed = 5, .distinct = 64});
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> exec{.pool = &pool};
    nn::ResNet<float, Cpu> model({.arch = "resnet18", .num_classes = 10, .seed = 2, .width = 16});
    optim::SGD<float, Cpu> opt(model, {.lr = 0.05, .momentum = 0.9});
    std::vector<double> losses;
    for (int e = 0; e < 15; ++e) losses.push_back(run_epoch(exec, model, ds, &opt, static_cast<std::uint64_t>(e), 16).loss);
    std::printf("synthetic: training loss %.4f (epoch 0) -> %.4f (epoch %zu)\n", losses.front(), losses.back(),
                losses.size() - 1);
    CHECK(losses.back() < 0.5 * losses.front());
  }
}
