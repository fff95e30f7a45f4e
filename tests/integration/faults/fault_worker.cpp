// A rank of the fault matrix (tests/integration/faults/fault_matrix.py): joins the job the way the launcher says (env://,
// torchrun/ddprun, mpirun), runs one phase long enough that the driver's kill -9 / SIGSTOP / link cut lands
// inside it, and announces every step on stdout so that the driver knows when.
// SPDX-License-Identifier: MIT
//
// Usage: fault_worker --phase rendezvous|allreduce|backward|snapshot|train [--backend tcp|mpi] [--timeout-ms N]
//                     [--hold-rank K] [--mib 64] [--iters 1000] [--model-mb 128] [--epochs 6] [--steps 4]
//                     [--snapshot_path P] [--tag DIR]
//        fault_worker --verify P [--model-mb 128]
//   rendezvous  rank K stops between the store and the communicator (it has joined the store, not the mesh
//               or MPI_Init) and sleeps until killed; the others block in the rendezvous waiting for it.
//   allreduce   --iters all-reduces (AVG) of --mib MiB of floats; "phase allreduce iter i" before each.
//   backward    DDP(resnet18, 10 classes) steps on 2 synthetic 32x32 images; "phase backward step i start"
//               just before model.backward (whose gradient buckets all-reduce while it runs).
//   snapshot    --epochs epochs of --steps all-reduces of --mib MiB; every weight of a Linear holding
//   train       --model-mb MiB gains exactly 1 per epoch (from the all-reduced data), then global rank 0
//               writes the snapshot (epoch + 1; "phase snapshot-write epoch e start|end") and all ranks
//               meet in a barrier. On start every rank resumes from the snapshot if there is one (rank 0
//               reads it and broadcasts), so under ddprun --max-restarts a killed job carries on.
//               snapshot and train differ only in the defaults the driver passes (a large model / a small one).
//   --verify P  loads snapshot P with the library's loader (checks the data hash) and checks that every
//               weight equals the snapshot's epoch: prints "verify P epoch E ok" and exits 0, or exits 1.
// Every line is "fw rank R: ..."; failures print the library's message and exit 1. --tag is ignored: the
// driver passes its scenario directory so that every process of a scenario can be found by its cmdline.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cxxopts.hpp>
#include <ddp/comm/factory.hpp>
#include <ddp/env/detect.hpp>
#include <ddp/env/flags.hpp>
#include <ddp/nn/linear.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/parallel/ddp.hpp>
#include <ddp/store/hash_store.hpp>
#include <ddp/store/rendezvous.hpp>
#include <ddp/train/checkpoint.hpp>
#include <ddp/train/options.hpp>
#include <ddp/train/snapshot_sync.hpp>
#include <iostream>
#include <thread>
#include <vector>

using namespace ddp;

namespace {

int g_rank = -1;

std::ostream& say() { return std::cout << "fw rank " << g_rank << ": "; }

// Linear(1024 -> mb * 256), no bias: mb MiB of float weights.
nn::Linear<float, Cpu> make_linear(long mb) {
  return nn::Linear<float, Cpu>({.in_features = 1024, .out_features = mb * 256, .bias = false});
}

int verify(const std::string& path, long mb) {
  auto net = make_linear(mb);
  optim::SGD<float, Cpu> opt(net.parameters(), {.lr = 0.1});
  const train::SnapshotInfo info = train::load_snapshot<float>(path, net, opt);
  const auto& w = net.weight().value();
  const auto want = static_cast<float>(info.epoch);
  for (std::int64_t i = 0; i < w.numel(); ++i)
    if (w.data()[i] != want) {
      std::cout << "verify " << path << " epoch " << info.epoch << " BAD: weight[" << i << "] = " << w.data()[i]
                << ", expected " << want << std::endl;
      return 1;
    }
  std::cout << "verify " << path << " epoch " << info.epoch << " ok (" << w.numel() << " weights)" << std::endl;
  return 0;
}

void run_allreduce(comm::Communicator& comm, long mib, long iters) {
  std::vector<float> v(static_cast<std::size_t>(mib) << 18, 1.0f);
  for (long i = 0; i < iters; ++i) {
    say() << "phase allreduce iter " << i << std::endl;
    comm.all_reduce(std::span(v), {.op = comm::ReduceOp::Avg}).wait();
  }
}

void run_backward(comm::Communicator& comm, const train::DistFlags& dist, long iters) {
  nn::ResNet<float, Cpu> net({.arch = "resnet18", .num_classes = 10});
  optim::SGD<float, Cpu> opt(net.parameters(), {.lr = 0.01});
  parallel::DistributedDataParallel<float, Cpu> model(net, comm, dist.ddp);
  nn::CrossEntropyLoss<float, Cpu> ce;
  Exec<Cpu> exec;
  Tensor<float, Cpu> x(Shape{2, 32, 32, 3});
  Generator gen(1, static_cast<std::uint32_t>(comm.rank()), kStreamData);
  gen.fill_uniform(x.view(), -1.0, 1.0);
  Tensor<std::int64_t, Cpu> y = Tensor<std::int64_t, Cpu>::zeros(Shape{2});
  for (long i = 0; i < iters; ++i) {
    opt.zero_grad();
    auto logits = model.forward(exec, x.cview());
    ce.forward(exec, logits.cview(), y.cview());
    say() << "phase backward step " << i << " start" << std::endl;
    model.backward(exec, ce.backward(exec).cview());
    say() << "phase backward step " << i << " end" << std::endl;
    opt.step(exec);
  }
}

void run_epochs(comm::Communicator& comm, const std::string& path, long model_mb, long epochs, long steps, long mib) {
  auto net = make_linear(model_mb);
  optim::SGD<float, Cpu> opt(net.parameters(), {.lr = 0.1});
  auto& w = net.weight().value();
  std::fill(w.data(), w.data() + w.numel(), 0.0f);
  long start = 0;
  const std::vector<std::uint8_t> bytes = train::read_and_broadcast(comm, path);
  if (!bytes.empty()) {
    start = static_cast<long>(train::load_snapshot_bytes<float>(bytes, net, opt, path).epoch);
    say() << "resumed at epoch " << start << std::endl;
  }
  std::vector<float> v(static_cast<std::size_t>(mib) << 18);
  for (long e = start; e < epochs; ++e) {
    say() << "phase train epoch " << e << std::endl;
    float gain = 0;
    for (long s = 0; s < steps; ++s) {
      std::fill(v.begin(), v.end(), 1.0f / static_cast<float>(steps));  // steps is a power of two: exact
      comm.all_reduce(std::span(v), {.op = comm::ReduceOp::Avg}).wait();
      gain += v[0];
    }
    for (std::int64_t i = 0; i < w.numel(); ++i) w.data()[i] += gain;
    if (comm.rank() == 0) {
      say() << "phase snapshot-write epoch " << e << " start" << std::endl;
      train::save_snapshot(path, net, opt, {.epoch = e + 1});
      say() << "phase snapshot-write epoch " << e << " end" << std::endl;
    }
    // The others wait here while rank 0 writes and fsyncs 128 MiB, which took more than the matrix's T (4 s) on a
    // loaded CI disk: a slow write is not the fault under test (a dead rank 0 is seen by its closed connection or
    // by mpirun, not by this timeout), so this barrier gets a bound of its own.
    comm.barrier({.timeout = std::chrono::seconds(120)}).wait();
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const env::Env env = env::Env::process();
    const env::LaunchFlags launch = env::extract_launch_flags(argc, argv);
    cxxopts::Options options("fault_worker", "a rank of the fault matrix (tests/integration/faults)");
    options.add_options()("phase", "rendezvous, allreduce, backward, snapshot or train",
                          cxxopts::value<std::string>()->default_value(""))(
        "hold-rank", "rendezvous: the rank that stops before the communicator", cxxopts::value<int>()->default_value("-1"))(
        "mib", "MiB per all-reduce", cxxopts::value<long>()->default_value("64"))(
        "iters", "all-reduces / backward steps", cxxopts::value<long>()->default_value("1000"))(
        "model-mb", "snapshot/train: MiB of weights", cxxopts::value<long>()->default_value("128"))(
        "epochs", "snapshot/train: epochs", cxxopts::value<long>()->default_value("6"))(
        "steps", "snapshot/train: all-reduces per epoch (a power of two)", cxxopts::value<long>()->default_value("4"))(
        "snapshot_path", "snapshot file", cxxopts::value<std::string>()->default_value("snapshot.safetensors"))(
        "verify", "load this snapshot and check it", cxxopts::value<std::string>()->default_value(""))(
        "tag", "ignored (the driver's scenario directory)", cxxopts::value<std::string>()->default_value(""));
    train::add_dist_options(options, env, "tcp");
    const auto args = options.parse(argc, argv);
    const long model_mb = args["model-mb"].as<long>();
    if (!args["verify"].as<std::string>().empty()) return verify(args["verify"].as<std::string>(), model_mb);

    log::init();
    const train::DistFlags dist = train::read_dist_flags(args);
    const std::string phase = args["phase"].as<std::string>();
    const env::LaunchInfo info =
        env::detect(env, launch, {.need_master_addr = dist.needs_store(), .backend = dist.backend});
    g_rank = info.rank;
    log::set_rank(info.rank, info.world_size);
    say() << "pid " << ::getpid() << " world " << info.world_size << " attempt " << info.restart_count << std::endl;

    say() << "phase rendezvous start" << std::endl;
    std::unique_ptr<store::Store> store = dist.needs_store() ? store::make_store(info, dist.timeout, dist.store_port)
                                                             : std::make_unique<store::HashStore>(dist.timeout);
    say() << "phase rendezvous store-joined" << std::endl;
    if (phase == "rendezvous" && info.rank == args["hold-rank"].as<int>()) {
      say() << "phase rendezvous hold" << std::endl;
      std::this_thread::sleep_for(std::chrono::seconds(120));  // the driver kills us long before
      say() << "phase rendezvous hold: nobody killed me" << std::endl;
      return 3;
    }
    auto comm = comm::make_communicator(dist.backend, info, *store, dist.comm_options());
    say() << "phase rendezvous done" << std::endl;

    const long mib = args["mib"].as<long>(), iters = args["iters"].as<long>();
    if (phase == "rendezvous") {
      run_allreduce(*comm, 1, 1);
    } else if (phase == "allreduce") {
      run_allreduce(*comm, mib, iters);
    } else if (phase == "backward") {
      run_backward(*comm, dist, iters);
    } else if (phase == "snapshot" || phase == "train") {
      run_epochs(*comm, args["snapshot_path"].as<std::string>(), model_mb, args["epochs"].as<long>(),
                 args["steps"].as<long>(), mib);
    } else {
      throw ConfigError("fault_worker: unknown --phase '" + phase + "'");
    }
    say() << "done" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << e.what() << std::endl;
    return 1;
  }
}
