// resnet: the ResNet DDP tutorial program (synthetic data or CIFAR-10), one binary for every
// launcher.
// SPDX-License-Identifier: MIT
//
// Usage:
//   ddprun --nproc-per-node 2 --standalone ./resnet --backend gloo --use_syn --device cpu --arch
//     resnet18
//          --batch_size 8 --image_size 64 --steps_syn 10 --num_epochs 1 --width 16
//   torchrun --nproc_per_node=2 --no-python ./resnet --backend=gloo --use_syn --batch_size=16
//     --arch=resnet18
//   torchrun --nproc_per_node=1 --no-python ./resnet --backend=nccl --use_syn --batch_size=16
//     --arch=resnet152
//   mpirun -np 2 ./resnet --backend=mpi --use_syn --device cpu
//   ./resnet --data_dir cifar-10-batches-bin --device cpu --image_size 32 --num_classes 10
//   ./resnet --data_dir imagenet/train --val_dir imagenet/val --workers 4 --arch resnet50
//     (ImageFolder)
// Flags (the tutorial's): --backend, --use_syn, --batch_size (per process), --arch, --num_epochs,
// --learning_rate, --random_seed, --model_dir, --model_filename, --resume, --image_size,
// --steps_syn; ours: --device cpu|cuda, --precision fp32|tf32|bf16 (GPU; default tf32), --conv
// auto|own|cudnn|cudnn_find (GPU convolutions, tensor/conv_impl.hpp), --deterministic, --threads,
// --width (channel multiplier; 64 is torchvision's), --num_classes, --data_dir, --log_every, the
// distributed flags of train/options.hpp (--bucket-cap-mb, --comm-hook, --metrics-file,
// --tensorboard-dir, --trace, --trace-steps, ...) and the optimizer flags of train/optim_flags.hpp:
// --optimizer sgd|adamw, --momentum, --weight-decay (not on biases and BatchNorm),
// --clip-grad-norm, --lr-schedule constant|step|multistep|cosine (--lr-step-epochs,
// --lr-milestones, --lr-gamma), --warmup-epochs, --sync-bn. Device (train/device_choice.hpp, shared
// with the multinode example): --device cuda trains on GPU LOCAL_RANK with nccl, or shares the
// visible GPUs round-robin with gloo/tcp (world 2-4 on one GPU); --backend mpi is host memory only.
// Without --device, a build with CUDA and a visible GPU trains on the GPU (except under mpi),
// anything else on the CPU (a log line says which and why); --backend nccl without a GPU is a
// ConfigError. Defaults: SGD momentum 0.9, weight decay 1e-5 on conv and linear weights (none on
// biases and BatchNorm, the usual parameter groups), constant learning rate; cross-entropy.
// samples_per_sec counts every step of every rank. --data_dir is either CIFAR-10 binaries
// (data_batch_1.bin ... test_batch.bin) or an ImageFolder tree (root/<class>/<image>.jpg|png,
// data/image_folder.hpp: RandomResizedCrop(--image_size) + flip + Normalize; needs ddp::image),
// detected by its content; --val_dir is the ImageFolder evaluation tree (Resize(256/224 of
// --image_size) + CenterCrop(--image_size)); --workers threads decode batches; --skip_bad_images
// counts and replaces undecodable files instead of failing on them. With a test set, every rank
// evaluates its share after each epoch (data::EvalSampler) and rank 0 prints top-1 and top-5 of the
// whole set, summed over the ranks: "epoch 0 test accuracy 0.41 (4100/10000) top-5 0.83
// (8300/10000)". Expected output (rank 0):
//   epoch 0 step 1/10 loss 6.9412 samples/s 41.3 lr 0.1
//   ...
//   samples_per_sec: 95.2 (2 ranks x 8 samples x 10 steps in 1.68 s)
#include <algorithm>
#include <cxxopts.hpp>
#include <ddp/config.hpp>
#include <ddp/core/log.hpp>
#include <ddp/data/cifar10.hpp>
#include <ddp/data/image_folder.hpp>
#include <ddp/data/loader.hpp>
#include <ddp/data/synthetic.hpp>
#include <ddp/tensor/conv_impl.hpp>
#include <ddp/tensor/precision.hpp>
#include <ddp/train/init.hpp>
#include <ddp/train/optim_flags.hpp>
#include <ddp/train/parse_args.hpp>
#include <filesystem>
#include <iostream>
#include <thread>

#include "cuda_entry.hpp"
#include "train.hpp"

using namespace ddp;

int main(int argc, char** argv) {
  try {
    train::InitFlags init(argc, argv);  // takes --local_rank=N, --rank, ... out of argv
    cxxopts::Options options(
        "resnet", "Distributed data-parallel ResNet training (synthetic data or CIFAR-10)");
    options.add_options()("use_syn", "train on synthetic data")(
        "batch_size", "samples per process and step", cxxopts::value<long>()->default_value("256"))(
        "arch", "resnet18, resnet34, resnet50, resnet101 or resnet152",
        cxxopts::value<std::string>()->default_value("resnet50"))(
        "num_epochs", "epochs", cxxopts::value<long>()->default_value("1"))(
        "learning_rate", "learning rate (with --lr-schedule: its base)",
        cxxopts::value<double>()->default_value("0.1"))(
        "random_seed", "initialisation and data seed", cxxopts::value<long>()->default_value("0"))(
        "model_dir", "where rank 0 saves the snapshot",
        cxxopts::value<std::string>()->default_value("saved_models"))(
        "model_filename", "snapshot file name",
        cxxopts::value<std::string>()->default_value("resnet_distributed.safetensors"))(
        "resume", "resume from model_dir/model_filename")(
        "image_size", "synthetic image height and width; ImageFolder crop size",
        cxxopts::value<long>()->default_value("224"))("steps_syn",
                                                      "steps per epoch on synthetic data",
                                                      cxxopts::value<long>()->default_value("20"))(
        "precision", "GPU arithmetic of convolutions and Linear: fp32, tf32 or bf16",
        cxxopts::value<std::string>()->default_value("tf32"))(
        "conv",
        "GPU convolutions: auto (cuDNN when built with it, else own), own (ddp's kernels), cudnn, "
        "cudnn_find "
        "(cuDNN's fastest measured algorithm per shape)",
        cxxopts::value<std::string>()->default_value("auto"))(
        "deterministic", "GPU: bitwise-reproducible kernels only")(
        "threads", "CPU threads per process (0: cores / local world size)",
        cxxopts::value<int>()->default_value("0"))(
        "width", "channels of the first layer (64 = torchvision; smaller is faster)",
        cxxopts::value<long>()->default_value("64"))("num_classes",
                                                     "classes (synthetic data; CIFAR-10 has 10)",
                                                     cxxopts::value<long>()->default_value("1000"))(
        "data_dir",
        "train on CIFAR-10 binary files or an ImageFolder tree (root/<class>/<image>.jpg) in this "
        "directory",
        cxxopts::value<std::string>()->default_value(""))(
        "val_dir", "ImageFolder evaluation tree (with an ImageFolder --data_dir)",
        cxxopts::value<std::string>()->default_value(""))(
        "workers", "loader threads decoding and augmenting batches",
        cxxopts::value<long>()->default_value("1"))(
        "skip_bad_images",
        "ImageFolder: skip (count, report) undecodable files instead of failing")(
        "log_every", "print progress every this many steps",
        cxxopts::value<long>()->default_value("1"))("h,help", "this help");
    init.add_options(options);  // --backend, --device, --timeout-ms, ... (train/init.hpp)
    train::add_optim_options(options, {.momentum = 0.9, .weight_decay = 1e-5});
    const auto args = ddp::train::parse_args(options, argc, argv);
    if (args.count("help")) {
      std::cout << options.help() << '\n';
      return 0;
    }
    log::init();
    // and the device: bad flags fail before any rendezvous
    const train::DistFlags& dist = init.read(args);
    const train::OptimFlags optim = train::read_optim_flags(args);
    const std::string precision = args["precision"].as<std::string>();
    (void)parse_precision(precision);  // a bad --precision or --conv fails before any rendezvous
    const ConvImpl conv = parse_conv_impl(args["conv"].as<std::string>());
    const auto batch_size = static_cast<std::size_t>(args["batch_size"].as<long>());
    const auto seed = static_cast<std::uint64_t>(args["random_seed"].as<long>());
    const std::string data_dir = args["data_dir"].as<std::string>();
    if (!args.count("use_syn") && data_dir.empty())
      throw ConfigError(
          "ddp: no data: pass --use_syn for synthetic images or --data_dir <cifar-10-batches-bin>");

    // Launch info -> (GPU) -> store -> communicator.
    train::Job job = train::init_process_group(init);
    const int rank = job.rank(), world = job.world_size();
    // Data: synthetic images or CIFAR-10, split across ranks by the DistributedSampler.
    std::unique_ptr<data::Dataset> train_set, test_set;
    const std::string val_dir = args["val_dir"].as<std::string>();
    const auto workers = static_cast<std::size_t>(std::max(1L, args["workers"].as<long>()));
    const bool cifar =
        !data_dir.empty() &&
        (std::filesystem::exists(std::filesystem::path(data_dir) / "data_batch_1.bin") ||
         std::filesystem::exists(std::filesystem::path(data_dir) / "test_batch.bin"));
    if (!data_dir.empty() && !cifar) {
      if (!data::image_decoders_available())
        throw ConfigError("ddp: --data_dir " + data_dir +
                          " holds no CIFAR-10 binaries, so it is read as an ImageFolder tree, but "
                          "this resnet was "
                          "built without JPEG/PNG decoding: install libturbojpeg0-dev and "
                          "libpng-dev and rebuild");
      const long s = args["image_size"].as<long>();
      const data::OnBadImage on_error =
          args.count("skip_bad_images") ? data::OnBadImage::kSkip : data::OnBadImage::kFail;
      train_set = std::make_unique<data::ImageFolder>(
          data_dir, data::ImageFolderOptions{
                        .train = true, .crop_size = s, .seed = seed, .on_error = on_error});
      if (!val_dir.empty()) {
        test_set = std::make_unique<data::ImageFolder>(
            val_dir, data::ImageFolderOptions{.train = false,
                                              .crop_size = s,
                                              .resize_size = s * 256 / 224,
                                              .on_error = on_error});
        if (test_set->num_classes() != train_set->num_classes())
          throw ConfigError("ddp: --val_dir " + val_dir + " has " +
                            std::to_string(test_set->num_classes()) + " classes but --data_dir " +
                            data_dir + " has " + std::to_string(train_set->num_classes()));
      }
    } else if (!data_dir.empty()) {
      if (!val_dir.empty())
        throw ConfigError(
            "ddp: --val_dir is for an ImageFolder --data_dir; CIFAR-10 evaluates on "
            "test_batch.bin");
      train_set = std::make_unique<data::CifarBinaryDataset>(
          data::cifar10_files(data_dir, true), data::CifarOptions{.augment = true, .seed = seed});
      test_set = std::make_unique<data::CifarBinaryDataset>(data::cifar10_files(data_dir, false));
    } else {
      const long hw = args["image_size"].as<long>();
      const auto size = static_cast<std::size_t>(args["steps_syn"].as<long>()) * batch_size *
                        static_cast<std::size_t>(world);
      train_set = std::make_unique<data::SyntheticDataset>(
          data::SyntheticOptions{.size = size,
                                 .height = hw,
                                 .width = hw,
                                 .num_classes = args["num_classes"].as<long>(),
                                 .seed = seed,
                                 .distinct = std::min<std::size_t>(size, 64)});
    }
    data::DistributedSampler sampler(train_set->size(),
                                     {.num_replicas = world, .rank = rank, .seed = seed});
    data::DataLoader loader(*train_set, sampler,
                            {.batch_size = batch_size,
                             .drop_last = true,
                             .prefetch = std::max<std::size_t>(2, workers),
                             .num_workers = workers});

    resnet_example::Setup setup{
        .arch = args["arch"].as<std::string>(),
        .width = args["width"].as<long>(),
        .seed = seed,
        .learning_rate = args["learning_rate"].as<double>(),
        .num_epochs = args["num_epochs"].as<long>(),
        .log_every = std::max(1L, args["log_every"].as<long>()),
        .batch_size = batch_size,
        .resume = args.count("resume") > 0,
        .path = (std::filesystem::path(args["model_dir"].as<std::string>()) /
                 args["model_filename"].as<std::string>())
                    .string(),
        .metrics_file = dist.metrics_file,
        .tensorboard_dir = dist.tensorboard_dir,
        .trace = dist.trace,
        .ddp = dist.ddp,
        .optim = optim,
        .comm = &job.communicator(),
        .train_set = train_set.get(),
        .test_set = test_set.get(),
        .loader = &loader,
        .workers = workers};
    if constexpr (BuildConfig::with_cuda)
      if (job.cuda_device() >= 0)
        return resnet_example::train_cuda(setup, job.cuda_device(), precision, conv,
                                          args.count("deterministic") > 0);
    int threads = args["threads"].as<int>();
    if (threads <= 0)
      threads = std::max(
          1, static_cast<int>(std::thread::hardware_concurrency()) / job.local_world_size());
    kernels::cpu::ThreadPool pool(threads);
    Exec<Cpu> exec{.pool = &pool};
    return resnet_example::train<Cpu>(setup, exec);
  } catch (const std::exception& e) {
    std::cerr << e.what() << '\n';
    return 1;
  }
}
