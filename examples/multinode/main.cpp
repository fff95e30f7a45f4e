// multinode: PyTorch's multinode DDP tutorial (Linear(20, 1) on random data) with snapshots and
// exact resume.
// SPDX-License-Identifier: MIT
//
// Usage: multinode total_epochs save_every [--batch_size 32] [--snapshot_path snapshot.safetensors]
//                  [--loss mse|cross_entropy] [--backend gloo] [--device cpu] [--seed 0] [--lr
//                    0.001]
//                  [--optimizer sgd|adamw] [--momentum 0] [--weight-decay 0] [--clip-grad-norm 0]
//                  [--lr-schedule constant|step|multistep|cosine] [--warmup-epochs 0] ...
//                    (train/optim_flags.hpp)
//   ddprun --nproc-per-node 2 --standalone --max-restarts 3 ./multinode 50 10
//   torchrun --nproc-per-node=1 --nnodes=2 --node-rank=0 --rdzv-id=456 --rdzv-backend=c10d
//            --rdzv-endpoint=1.2.3.4:29603 ./multinode 1000 1000
//   torchrun --nproc-per-node=4 ./multinode 50 10 --backend nccl --device cuda     (one GPU per
//     rank)
//   mpirun -np 2 -x MASTER_ADDR=10.0.0.1 -x MASTER_PORT=29500 ./multinode 50 10 --backend nccl
// Device (train/device_choice.hpp, the resnet example's rules): --device cuda trains on GPU
// LOCAL_RANK with nccl, or shares the visible GPUs with gloo/tcp; without --device a build with
// CUDA and a visible GPU trains on the GPU (not with --backend mpi), anything else on the CPU. The
// loop is train.hpp, one template for both devices; on the GPU it runs in fp32. Data: 2048 samples
// (x in [-1,1)^20, y in [-1,1)) drawn from --seed, the same on every rank; the DistributedSampler
// gives each rank its share (1024 each with 2 ranks: 32 steps of 32). Snapshots
// (docs/decisions/0010): after every save_every-th epoch and after the last one, global rank 0
// writes model + optimizer + next epoch atomically (the previous file is kept as <path>.prev). On
// start rank 0 reads the snapshot if it exists and broadcasts its bytes (no shared filesystem
// needed); training resumes at the first unfinished epoch (the tutorial re-ran the saved one), so a
// restarted run ends bit-identical to an uninterrupted one. The optimizer (default: the tutorial's
// plain SGD, no momentum, no weight decay, constant lr) and its schedule state (the step count) are
// part of the snapshot. There is no evaluation. Expected output (2 ranks, `multinode 2 1`):
//   [Rank 0] Epoch 0 | Batchsize: 32 | Steps: 32
//   [Rank 1] Epoch 0 | Batchsize: 32 | Steps: 32
//   Epoch 0 | Training snapshot saved at snapshot.safetensors
//   ...
//   Training took 0.01 s
#include <cxxopts.hpp>
#include <ddp/config.hpp>
#include <ddp/core/log.hpp>
#include <ddp/train/init.hpp>
#include <ddp/train/optim_flags.hpp>
#include <ddp/train/parse_args.hpp>
#include <iostream>

#include "cuda_entry.hpp"
#include "train.hpp"

using namespace ddp;

int main(int argc, char** argv) {
  try {
    train::InitFlags init(argc, argv);  // takes --local_rank=N, --rank, ... out of argv
    cxxopts::Options options(
        "multinode", "PyTorch's multinode DDP tutorial: Linear(20, 1) on 2048 random samples");
    options.positional_help("total_epochs save_every");
    options.add_options()("total_epochs", "epochs to train", cxxopts::value<long>())(
        "save_every", "write a snapshot every this many epochs", cxxopts::value<long>())(
        "batch_size", "samples per process and step", cxxopts::value<long>()->default_value("32"))(
        "snapshot_path", "snapshot file (global rank 0 writes it)",
        cxxopts::value<std::string>()->default_value("snapshot.safetensors"))(
        "loss",
        "mse, or cross_entropy as in the tutorial -- which is identically zero on a single output "
        "(log_softmax of one logit is 0), so the model would never change; hence the default mse",
        cxxopts::value<std::string>()->default_value("mse"))(
        "seed", "data and initialisation seed", cxxopts::value<long>()->default_value("0"))(
        "lr", "learning rate (with --lr-schedule: its base)",
        cxxopts::value<double>()->default_value("0.001"))(
        "await-join-after-epoch",
        "testing: when the job has one rank, wait after this epoch's snapshot (60 s at "
        "most) for an elastic launcher to restart it with more",
        cxxopts::value<long>()->default_value("-1"))("h,help", "this help");
    init.add_options(options);          // --backend, --device, --timeout-ms, ... (train/init.hpp)
    train::add_optim_options(options);  // the tutorial's SGD: momentum 0, weight decay 0
    options.parse_positional({"total_epochs", "save_every"});
    const auto args = ddp::train::parse_args(options, argc, argv);
    if (args.count("help") || !args.count("save_every")) {
      std::cout << options.help() << '\n';
      return args.count("help") ? 0 : 1;
    }
    log::init();
    // and the device: bad flags fail before any rendezvous
    const train::DistFlags& dist = init.read(args);
    const train::OptimFlags optim = train::read_optim_flags(args);
    const long total_epochs = args["total_epochs"].as<long>(),
               save_every = args["save_every"].as<long>();
    const auto batch_size = static_cast<std::size_t>(args["batch_size"].as<long>());
    const std::string snapshot_path = args["snapshot_path"].as<std::string>(),
                      loss_name = args["loss"].as<std::string>();
    const auto seed = static_cast<std::uint64_t>(args["seed"].as<long>());
    if (save_every < 1 || batch_size < 1)
      throw ConfigError("ddp: save_every and --batch_size must be >= 1");
    if (loss_name != "mse" && loss_name != "cross_entropy")
      throw ConfigError("ddp: --loss must be mse or cross_entropy, got '" + loss_name + "'");

    // Launch info -> (GPU) -> store -> communicator.
    train::Job job = train::init_process_group(init);

    const multinode_example::Setup setup{
        .total_epochs = total_epochs,
        .save_every = save_every,
        .batch_size = batch_size,
        .snapshot_path = snapshot_path,
        .loss = loss_name,
        .seed = seed,
        .lr = args["lr"].as<double>(),
        .optim = optim,
        .await_join_after_epoch = args["await-join-after-epoch"].as<long>(),
        .metrics_file = dist.metrics_file,
        .tensorboard_dir = dist.tensorboard_dir,
        .trace = dist.trace,
        .ddp = dist.ddp,
        .comm = &job.communicator()};
    if constexpr (BuildConfig::with_cuda)
      if (job.cuda_device() >= 0) return multinode_example::train_cuda(setup, job.cuda_device());
    Exec<Cpu> exec;
    // the communicator's destructor runs a bounded barrier
    return multinode_example::train<Cpu>(setup, exec);
  } catch (const std::exception& e) {
    std::cerr << e.what() << '\n';
    return 1;
  }
}
