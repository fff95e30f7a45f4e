// custom_model: a small residual CNN of one's own, trained data-parallel on scikit-learn's 8x8
// digits.
// SPDX-License-Identifier: MIT
//
// twin.py beside it is the same program in PyTorch. Prepare the data once (1438 training, 359 test
// images):
//   /usr/bin/python3 tests/interop/reference/digits_to_cifar_format.py digits
// then run 2 processes with either launcher:
//   ddprun --nproc-per-node 2 --standalone build/examples/custom_model/custom_model --data-dir
//     digits
//   torchrun --standalone --nproc_per_node 2 --no-python build/examples/custom_model/custom_model
//     --data-dir digits
// Rank 0 prints, per epoch, the accuracy of the whole test set and the time of the training pass.
#include <algorithm>
#include <array>
#include <iostream>

#include <ddp/ddp.hpp>

using namespace ddp;

auto sequential(auto... layers) {  // torch's nn.Sequential(a, b, ...)
  auto s = std::make_unique<nn::Sequential<float, Cpu>>();
  (s->push_back(std::move(layers)), ...);
  return s;
}
// 3x3, padding 1: same size; no bias (BatchNorm follows)
auto conv(std::int64_t in, std::int64_t out) {
  return std::make_unique<nn::Conv2d<float, Cpu>>(
      nn::Conv2dOptions{.in_channels = in, .out_channels = out, .padding = 1, .bias = false});
}
auto batchnorm(std::int64_t c) {
  return std::make_unique<nn::BatchNorm2d<float, Cpu>>(nn::BatchNorm2dOptions{c});
}
auto relu() { return std::make_unique<nn::ReLU<float, Cpu>>(); }

// (N, 8, 8, 1) images -> conv-bn-relu -> relu(x + conv-bn-relu-conv-bn(x)) -> flatten -> linear ->
// (N, 10) logits.
auto make_model() {
  auto body = sequential(conv(16, 16), batchnorm(16), relu(), conv(16, 16), batchnorm(16));
  return sequential(conv(1, 16), batchnorm(16), relu(),
                    std::make_unique<nn::Residual<float, Cpu>>(std::move(body)), relu(),
                    std::make_unique<nn::Flatten<float, Cpu>>(),
                    std::make_unique<nn::Linear<float, Cpu>>(nn::LinearOptions{16 * 8 * 8, 10}));
}

int main(int argc, char** argv) try {
  cxxopts::Options options("custom_model", "A residual CNN of one's own on scikit-learn's digits");
  options.add_options()("data-dir", "digits_{train,test}.bin",
                        cxxopts::value<std::string>()->default_value("digits"))(
      "epochs", "epochs", cxxopts::value<int>()->default_value("5"))(
      "seed", "initialisation and shuffling", cxxopts::value<std::uint64_t>()->default_value("0"));
  // Adds --backend, --timeout-ms, ... and --help; joins the job unless --help was given.
  auto [job, args] = train::init_process_group(argc, argv, options, {.cpu_only = true});
  if (!job) return 0;  // --help printed
  const int rank = job->rank(), world = job->world_size();
  const auto dir = args["data-dir"].as<std::string>();
  const auto seed = args["seed"].as<std::uint64_t>();

  // Pixels scaled to [0, 1], then normalised by the training set's mean and standard deviation.
  data::CifarOptions digits{
      .format = {.height = 8, .width = 8, .channels = 1}, .mean = {0.306f}, .std = {0.376f}};
  data::CifarBinaryDataset train_set({dir + "/digits_train.bin"}, digits),
      test_set({dir + "/digits_test.bin"}, digits);
  data::DistributedSampler sampler(train_set.size(),
                                   {.num_replicas = world, .rank = rank, .seed = seed});
  data::DataLoader loader(train_set, sampler, {.batch_size = 32});
  // each test image on exactly one rank
  data::EvalSampler test_share(test_set.size(), world, rank);
  data::DataLoader test_loader(test_set, test_share, {.batch_size = 256});

  manual_seed(seed);  // the layers' initial weights
  auto net = make_model();
  // --comm-hook, --bucket-cap-mb, ... (train::init_process_group added them) reach DDP here
  parallel::DistributedDataParallel<float, Cpu> model(*net, job->communicator(), job->flags().ddp);
  optim::SGD<float, Cpu> opt(*net, {.lr = 0.05, .momentum = 0.9});
  nn::CrossEntropyLoss<float, Cpu> loss;
  // kernels on this thread: one thread per process, as the launchers ask (OMP_NUM_THREADS=1)
  Exec<Cpu> exec;
  const int epochs = args["epochs"].as<int>();
  // Step timing and throughput; on a terminal rank 0 redraws a progress line
  // (train/bookkeeper.hpp).
  train::Bookkeeper<Cpu> book(job->communicator(), exec,
                              {.steps_per_epoch = static_cast<long long>(loader.num_batches()),
                               .last_epoch = epochs - 1,
                               .progress_lines = false,
                               .metrics_file = job->flags().metrics_file,
                               .tensorboard_dir = job->flags().tensorboard_dir,
                               .trace = job->flags().trace});
  for (int epoch = 0; epoch < epochs; ++epoch) {
    net->train();
    loader.start_epoch(epoch);
    book.start_epoch(epoch);
    while (auto batch = loader.next()) {
      book.got_batch();
      opt.zero_grad();
      const double l = loss.forward(exec, model.forward(exec, batch->images.cview()).cview(),
                                    batch->labels.cview());
      model.backward(exec, loss.backward(exec).cview());  // gradients averaged over the ranks
      opt.step(exec);
      book.end_step({.loss = l, .lr = opt.lr(), .samples = batch->size()}, model.last_trace());
    }
    const double seconds = book.end_epoch(epoch);  // the training pass

    net->eval();
    std::array<double, 2> counts{};  // correct, images
    test_loader.start_epoch(0);
    while (auto batch = test_loader.next()) {
      auto logits = net->forward(exec, batch->images.cview());
      const float* row = logits.data();  // 10 logits per image
      for (std::size_t i = 0; i < batch->size(); ++i, row += 10)
        counts[0] += std::max_element(row, row + 10) - row == batch->labels.data()[i];
      counts[1] += batch->size();
    }
    const auto [correct, images] = train::sum_over_ranks(job->communicator(), exec, counts);
    if (rank == 0)
      std::cout << "epoch " << epoch << " test accuracy " << correct / images << " (" << correct
                << "/" << images << ") train time " << seconds << " s" << std::endl;
  }
} catch (const std::exception& e) {
  std::cerr << e.what() << '\n';
  return 1;
}
