// multinode: PyTorch's multinode DDP tutorial (Linear(20, 1) on random data) with snapshots and exact resume.
// SPDX-License-Identifier: MIT
//
// Usage: multinode total_epochs save_every [--batch_size 32] [--snapshot_path snapshot.safetensors]
//                  [--loss mse|cross_entropy] [--backend gloo] [--device cpu] [--seed 0] [--lr 0.001]
//   ddprun --nproc-per-node 2 --standalone --max-restarts 3 ./multinode 50 10
//   torchrun --nproc-per-node=1 --nnodes=2 --node-rank=0 --rdzv-id=456 --rdzv-backend=c10d
//            --rdzv-endpoint=1.2.3.4:29603 ./multinode 1000 1000
// Data: 2048 samples (x in [-1,1)^20, y in [-1,1)) drawn from --seed, the same on every rank; the
// DistributedSampler gives each rank its share (1024 each with 2 ranks: 32 steps of 32).
// Snapshots (docs/ARCHITECTURE.md D10): after every save_every-th epoch and after the last one, global rank 0 writes
// model + optimizer + next epoch atomically (the previous file is kept as <path>.prev). On start rank 0
// reads the snapshot if it exists and broadcasts its bytes (no shared filesystem needed); training
// resumes at the first unfinished epoch (the tutorial re-ran the saved one), so a restarted run ends
// bit-identical to an uninterrupted one.
// Expected output (2 ranks, `multinode 2 1`):
//   [Rank 0] Epoch 0 | Batchsize: 32 | Steps: 32
//   [Rank 1] Epoch 0 | Batchsize: 32 | Steps: 32
//   Epoch 0 | Training snapshot saved at snapshot.safetensors
//   ...
//   Training took 0.01 s
#include <csignal>
#include <cstdint>
#include <cxxopts.hpp>
#include <ddp/comm/factory.hpp>
#include <ddp/data/distributed_sampler.hpp>
#include <ddp/env/detect.hpp>
#include <ddp/env/flags.hpp>
#include <ddp/nn/linear.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/parallel/ddp.hpp>
#include <ddp/store/hash_store.hpp>
#include <ddp/store/rendezvous.hpp>
#include <ddp/train/checkpoint.hpp>
#include <ddp/train/metrics.hpp>
#include <ddp/train/options.hpp>
#include <ddp/train/snapshot_sync.hpp>
#include <iostream>
#include <vector>

using namespace ddp;
constexpr std::int64_t kSamples = 2048, kIn = 20;

int main(int argc, char** argv) {
  try {
    const env::Env env = env::Env::process();
    const env::LaunchFlags launch = env::extract_launch_flags(argc, argv);
    cxxopts::Options options("multinode", "PyTorch's multinode DDP tutorial: Linear(20, 1) on 2048 random samples");
    options.positional_help("total_epochs save_every");
    options.add_options()("total_epochs", "epochs to train", cxxopts::value<long>())(
        "save_every", "write a snapshot every this many epochs", cxxopts::value<long>())(
        "batch_size", "samples per process and step", cxxopts::value<long>()->default_value("32"))(
        "snapshot_path", "snapshot file (global rank 0 writes it)",
        cxxopts::value<std::string>()->default_value("snapshot.safetensors"))(
        "loss", "mse, or cross_entropy as in the tutorial -- which is identically zero on a single output "
        "(log_softmax of one logit is 0), so the model would never change; hence the default mse",
        cxxopts::value<std::string>()->default_value("mse"))(
        "device", "cpu or cuda (default: cuda for --backend nccl)", cxxopts::value<std::string>()->default_value(""))(
        "seed", "data and initialisation seed", cxxopts::value<long>()->default_value("0"))(
        "lr", "SGD learning rate", cxxopts::value<double>()->default_value("0.001"))(
        "die-after-epoch", "testing: global rank 1 kills itself (SIGKILL) after this epoch's snapshot on the "
        "first attempt (TORCHELASTIC_RESTART_COUNT=0)", cxxopts::value<long>()->default_value("-1"))("h,help", "this help");
    train::add_dist_options(options, env);
    options.parse_positional({"total_epochs", "save_every"});
    const auto args = options.parse(argc, argv);
    if (args.count("help") || !args.count("save_every")) {
      std::cout << options.help() << '\n';
      return args.count("help") ? 0 : 1;
    }
    log::init();
    const train::DistFlags dist = train::read_dist_flags(args);
    const long total_epochs = args["total_epochs"].as<long>(), save_every = args["save_every"].as<long>();
    const auto batch_size = static_cast<std::size_t>(args["batch_size"].as<long>());
    const std::string snapshot_path = args["snapshot_path"].as<std::string>(), loss_name = args["loss"].as<std::string>();
    const auto seed = static_cast<std::uint64_t>(args["seed"].as<long>());
    if (save_every < 1 || batch_size < 1) throw ConfigError("ddp: save_every and --batch_size must be >= 1");
    if (loss_name != "mse" && loss_name != "cross_entropy")
      throw ConfigError("ddp: --loss must be mse or cross_entropy, got '" + loss_name + "'");
    train::resolve_device(args["device"].as<std::string>(), dist.backend);

    // Launch info -> store -> communicator.
    const env::LaunchInfo info = env::detect(env, launch, {.need_master_addr = dist.needs_store(), .backend = dist.backend});
    log::set_rank(info.rank, info.world_size);
    std::unique_ptr<store::Store> store = dist.needs_store() ? store::make_store(info, dist.timeout, dist.store_port)
                                                             : std::make_unique<store::HashStore>(dist.timeout);
    auto comm = comm::make_communicator(dist.backend, info, *store, dist.comm_options());
    const int rank = comm->rank();

    // Model, optimizer, data (the same 2048 samples on every rank).
    nn::Linear<float, Cpu> net({.in_features = kIn, .out_features = 1});
    Generator init(seed, 0, kStreamInit);
    net.reset_parameters(init);
    optim::SGD<float, Cpu> opt(net.parameters(), {.lr = args["lr"].as<double>()});
    Tensor<float, Cpu> xs(Shape{kSamples, kIn}), ys(Shape{kSamples, 1});
    Generator data_gen(seed, 0, kStreamData);
    data_gen.fill_uniform(xs.view(), -1.0, 1.0);
    data_gen.fill_uniform(ys.view(), -1.0, 1.0);
    data::DistributedSampler sampler(kSamples, {.num_replicas = comm->size(), .rank = rank, .shuffle = true, .seed = seed});

    // Resume: rank 0 reads the snapshot (if any) and broadcasts its bytes.
    const std::vector<std::uint8_t> bytes = train::read_and_broadcast(*comm, snapshot_path);
    long start_epoch = 0;
    if (!bytes.empty()) {
      start_epoch = static_cast<long>(train::load_snapshot_bytes<float>(bytes, net, opt, snapshot_path).epoch);
      if (rank == 0) std::cout << "Resuming training from snapshot at Epoch " << start_epoch << std::endl;
    }
    parallel::DistributedDataParallel<float, Cpu> model(net, *comm, dist.ddp);

    Exec<Cpu> exec;
    nn::MSELoss<float, Cpu> mse;
    nn::CrossEntropyLoss<float, Cpu> ce;
    train::MetricsWriter metrics(rank == 0 ? dist.metrics_file : std::string());  // per-step JSON lines
    const auto t0 = std::chrono::steady_clock::now();
    for (long epoch = start_epoch; epoch < total_epochs; ++epoch) {
      sampler.set_epoch(static_cast<std::uint64_t>(epoch));
      const auto idx = sampler.indices();
      const std::size_t steps = (idx.size() + batch_size - 1) / batch_size;
      std::cout << "[Rank " << rank << "] Epoch " << epoch << " | Batchsize: " << batch_size << " | Steps: " << steps
                << std::endl;
      for (std::size_t s = 0; s < steps; ++s) {
        const auto ts = std::chrono::steady_clock::now();
        const std::size_t b0 = s * batch_size, n = std::min(batch_size, idx.size() - b0);
        Tensor<float, Cpu> x(Shape{static_cast<std::int64_t>(n), kIn}), y(Shape{static_cast<std::int64_t>(n), 1});
        Tensor<std::int64_t, Cpu> labels = Tensor<std::int64_t, Cpu>::zeros(Shape{static_cast<std::int64_t>(n)});
        for (std::size_t k = 0; k < n; ++k) {
          const auto i = idx[b0 + k];
          std::copy_n(xs.data() + i * kIn, kIn, x.data() + k * kIn);
          y.data()[k] = ys.data()[i];
        }
        opt.zero_grad();
        auto out = model.forward(exec, x.cview());
        double loss = 0;
        if (loss_name == "mse") {
          loss = mse.forward(exec, out.cview(), y.cview());
          model.backward(exec, mse.backward(exec).cview());
        } else {
          loss = ce.forward(exec, out.cview(), labels.cview());
          model.backward(exec, ce.backward(exec).cview());
        }
        opt.step(exec);
        if (metrics.enabled())
          metrics.write({{"epoch", epoch}, {"step", s}, {"loss", loss},
                         {"step_ms", std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - ts).count()}});
      }
      if (epoch % save_every == 0 || epoch + 1 == total_epochs) {
        if (rank == 0) {
          train::save_snapshot(snapshot_path, net, opt, {.epoch = epoch + 1, .rng = data_gen.state()});
          std::cout << "Epoch " << epoch << " | Training snapshot saved at " << snapshot_path << std::endl;
        }
        if (epoch == args["die-after-epoch"].as<long>() && info.restart_count == 0) {
          comm->barrier().wait();  // the snapshot is on disk before the simulated crash
          if (rank == 1) std::raise(SIGKILL);
        }
      }
    }
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rank == 0) std::cout << "Training took " << took << " s" << std::endl;
    return 0;  // the communicator's destructor runs a bounded barrier: never hangs at exit
  } catch (const std::exception& e) {
    std::cerr << e.what() << '\n';
    return 1;
  }
}
