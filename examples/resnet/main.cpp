// resnet: the ResNet DDP tutorial program (synthetic data or CIFAR-10), one binary for every launcher.
// SPDX-License-Identifier: MIT
//
// Usage:
//   ddprun --nproc-per-node 2 --standalone ./resnet --backend gloo --use_syn --device cpu --arch resnet18
//          --batch_size 8 --image_size 64 --steps_syn 10 --num_epochs 1 --width 16
//   torchrun --nproc_per_node=2 --no-python ./resnet --backend=gloo --use_syn --batch_size=16 --arch=resnet18
//   mpirun -np 2 ./resnet --backend=mpi --use_syn --device cpu
//   ./resnet --data_dir cifar-10-batches-bin --device cpu --image_size 32 --num_classes 10
// Flags (the tutorial's): --backend, --use_syn, --batch_size (per process), --arch, --num_epochs,
// --learning_rate, --random_seed, --model_dir, --model_filename, --resume, --image_size, --steps_syn;
// ours: --device cpu|cuda, --threads, --width (channel multiplier; 64 is torchvision's), --num_classes,
// --data_dir, --log_every, and the distributed flags of train/options.hpp (--bucket-cap-mb, ...).
// SGD momentum 0.9, weight decay 1e-5, cross-entropy. samples_per_sec counts every step of every rank.
// Expected output (rank 0):
//   epoch 0 step 1/10 loss 6.9412 samples/s 41.3
//   ...
//   samples_per_sec: 95.2 (2 ranks x 8 samples x 10 steps in 1.68 s)
#include <algorithm>
#include <cxxopts.hpp>
#include <ddp/comm/factory.hpp>
#include <ddp/data/cifar10.hpp>
#include <ddp/data/loader.hpp>
#include <ddp/data/synthetic.hpp>
#include <ddp/env/detect.hpp>
#include <ddp/env/flags.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/parallel/ddp.hpp>
#include <ddp/store/hash_store.hpp>
#include <ddp/store/rendezvous.hpp>
#include <ddp/train/checkpoint.hpp>
#include <ddp/train/metrics.hpp>
#include <ddp/train/options.hpp>
#include <ddp/train/snapshot_sync.hpp>
#include <filesystem>
#include <iostream>
#include <thread>

using namespace ddp;

int main(int argc, char** argv) {
  try {
    const env::Env env = env::Env::process();
    const env::LaunchFlags launch = env::extract_launch_flags(argc, argv);  // --local_rank=N, --rank, ...
    cxxopts::Options options("resnet", "Distributed data-parallel ResNet training (synthetic data or CIFAR-10)");
    options.add_options()("use_syn", "train on synthetic data")("batch_size", "samples per process and step",
                                                                cxxopts::value<long>()->default_value("256"))(
        "arch", "resnet18, resnet34, resnet50, resnet101 or resnet152", cxxopts::value<std::string>()->default_value("resnet50"))(
        "num_epochs", "epochs", cxxopts::value<long>()->default_value("1"))(
        "learning_rate", "SGD learning rate", cxxopts::value<double>()->default_value("0.1"))(
        "random_seed", "initialisation and data seed", cxxopts::value<long>()->default_value("0"))(
        "model_dir", "where rank 0 saves the snapshot", cxxopts::value<std::string>()->default_value("saved_models"))(
        "model_filename", "snapshot file name", cxxopts::value<std::string>()->default_value("resnet_distributed.safetensors"))(
        "resume", "resume from model_dir/model_filename")(
        "image_size", "synthetic image height and width", cxxopts::value<long>()->default_value("224"))(
        "steps_syn", "steps per epoch on synthetic data", cxxopts::value<long>()->default_value("20"))(
        "device", "cpu or cuda (default: cuda for --backend nccl, else cpu)", cxxopts::value<std::string>()->default_value(""))(
        "threads", "CPU threads per process (0: cores / local world size)", cxxopts::value<int>()->default_value("0"))(
        "width", "channels of the first layer (64 = torchvision; smaller is faster)", cxxopts::value<long>()->default_value("64"))(
        "num_classes", "classes (synthetic data; CIFAR-10 has 10)", cxxopts::value<long>()->default_value("1000"))(
        "data_dir", "train on CIFAR-10 binary files in this directory", cxxopts::value<std::string>()->default_value(""))(
        "log_every", "print progress every this many steps", cxxopts::value<long>()->default_value("1"))("h,help", "this help");
    train::add_dist_options(options, env);
    const auto args = options.parse(argc, argv);
    if (args.count("help")) {
      std::cout << options.help() << '\n';
      return 0;
    }
    log::init();
    const train::DistFlags dist = train::read_dist_flags(args);
    train::resolve_device(args["device"].as<std::string>(), dist.backend);
    const auto batch_size = static_cast<std::size_t>(args["batch_size"].as<long>());
    const auto seed = static_cast<std::uint64_t>(args["random_seed"].as<long>());
    const std::string data_dir = args["data_dir"].as<std::string>();
    if (!args.count("use_syn") && data_dir.empty())
      throw ConfigError("ddp: no data: pass --use_syn for synthetic images or --data_dir <cifar-10-batches-bin>");

    // Launch info -> store -> communicator.
    const env::LaunchInfo info = env::detect(env, launch, {.need_master_addr = dist.needs_store(), .backend = dist.backend});
    log::set_rank(info.rank, info.world_size);
    std::unique_ptr<store::Store> store = dist.needs_store() ? store::make_store(info, dist.timeout, dist.store_port)
                                                             : std::make_unique<store::HashStore>(dist.timeout);
    auto comm = comm::make_communicator(dist.backend, info, *store, dist.comm_options());
    const int rank = comm->rank(), world = comm->size();
    int threads = args["threads"].as<int>();
    if (threads <= 0) threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / info.local_world_size);
    kernels::cpu::ThreadPool pool(threads);
    Exec<Cpu> exec{.pool = &pool};

    // Data: synthetic images or CIFAR-10, split across ranks by the DistributedSampler.
    std::unique_ptr<data::Dataset> train_set, test_set;
    if (!data_dir.empty()) {
      train_set = std::make_unique<data::CifarBinaryDataset>(data::cifar10_files(data_dir, true),
                                                             data::CifarOptions{.augment = true, .seed = seed});
      test_set = std::make_unique<data::CifarBinaryDataset>(data::cifar10_files(data_dir, false));
    } else {
      const long hw = args["image_size"].as<long>();
      const auto size = static_cast<std::size_t>(args["steps_syn"].as<long>()) * batch_size * static_cast<std::size_t>(world);
      train_set = std::make_unique<data::SyntheticDataset>(data::SyntheticOptions{
          .size = size, .height = hw, .width = hw, .num_classes = args["num_classes"].as<long>(), .seed = seed,
          .distinct = std::min<std::size_t>(size, 64)});
    }
    data::DistributedSampler sampler(train_set->size(), {.num_replicas = world, .rank = rank, .seed = seed});
    data::DataLoader loader(*train_set, sampler, {.batch_size = batch_size, .drop_last = true});

    // Model, optimizer, resume (rank 0 reads, everyone receives), DDP.
    nn::ResNet<float, Cpu> net({.arch = args["arch"].as<std::string>(), .num_classes = train_set->num_classes(),
                                .seed = seed, .width = args["width"].as<long>()});
    optim::SGD<float, Cpu> opt(net.parameters(), {.lr = args["learning_rate"].as<double>(), .momentum = 0.9,
                                                  .weight_decay = 1e-5});
    const std::string path = (std::filesystem::path(args["model_dir"].as<std::string>()) /
                              args["model_filename"].as<std::string>()).string();
    long start_epoch = 0;
    if (args.count("resume")) {
      const auto bytes = train::read_and_broadcast(*comm, path);
      if (!bytes.empty()) start_epoch = static_cast<long>(train::load_snapshot_bytes<float>(bytes, net, opt, path).epoch);
      if (rank == 0) std::cout << "resumed from " << path << " at epoch " << start_epoch << std::endl;
    }
    parallel::DistributedDataParallel<float, Cpu> model(net, *comm, dist.ddp);
    train::MetricsWriter metrics(rank == 0 ? dist.metrics_file : std::string());
    nn::CrossEntropyLoss<float, Cpu> ce;

    // Steps.
    const long epochs = args["num_epochs"].as<long>(), log_every = std::max(1L, args["log_every"].as<long>());
    std::size_t total_steps = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (long epoch = start_epoch; epoch < epochs; ++epoch) {
      net.train();
      loader.start_epoch(static_cast<std::uint64_t>(epoch));
      const auto steps = static_cast<long>(loader.num_batches());
      while (auto batch = loader.next()) {
        opt.zero_grad();
        auto logits = model.forward(exec, batch->images.cview());
        const double loss = ce.forward(exec, logits.cview(), batch->labels.cview());
        model.backward(exec, ce.backward(exec).cview());
        opt.step(exec);
        ++total_steps;
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double sps = static_cast<double>(total_steps * batch_size * static_cast<std::size_t>(world)) / secs;
        const long step = static_cast<long>(batch->step) + 1;
        if (rank == 0 && (step % log_every == 0 || step == steps))
          std::cout << train::progress_line(epoch, step, steps, loss, sps) << std::endl;
        metrics.write({{"epoch", epoch}, {"step", step}, {"loss", loss}, {"samples_per_sec", sps}});
      }
      if (rank == 0) {
        std::filesystem::create_directories(std::filesystem::path(path).parent_path());
        train::save_snapshot(path, net, opt, {.epoch = epoch + 1});
      }
      if (test_set && rank == 0) {  // evaluation on the unwrapped model: no collective involved
        net.eval();
        data::EvalSampler es(test_set->size(), 1, 0);
        data::DataLoader tl(*test_set, es, {.batch_size = 256});
        tl.start_epoch(0);
        std::size_t correct = 0;
        while (auto b = tl.next()) {
          auto y = net.forward(exec, b->images.cview());
          const auto c = y.shape()[1];
          for (std::int64_t i = 0; i < y.shape()[0]; ++i)
            correct += std::max_element(y.data() + i * c, y.data() + (i + 1) * c) - (y.data() + i * c) == b->labels.data()[i];
        }
        std::cout << "epoch " << epoch << " test accuracy " << static_cast<double>(correct) / test_set->size() << std::endl;
      }
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rank == 0)
      std::cout << "samples_per_sec: " << static_cast<double>(total_steps * batch_size * world) / secs << " (" << world
                << " ranks x " << batch_size << " samples x " << total_steps << " steps in " << secs << " s)" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << '\n';
    return 1;
  }
}
