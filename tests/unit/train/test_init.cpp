// train: init_process_group (train/init.hpp), the one start-up call. The launch flags leave argv beside the program's
// own flags; bad flags, devices and launch environments fail before any rendezvous; jobs of one rank (in-process
// store) and of two ranks (threads: over one HashStore, torch's `store=`, and over the TCP store rank 0 hosts)
// report the rank and sizes their launch environment gives, and their communicators sum across the ranks.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cxxopts.hpp>
#include <exception>
#include <iostream>
#include <memory>
#include <sstream>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <ddp/config.hpp>
#include <ddp/core/error.hpp>
#include <ddp/env/env.hpp>
#include <ddp/store/hash_store.hpp>
#include <ddp/store/tcp_store.hpp>
#include <ddp/store/tcp_store_server.hpp>
#include <ddp/train/init.hpp>
#include <ddp/train/parse_args.hpp>

namespace test_init {

using namespace ddp;

// argv as main() gets it: writable strings, argv[argc] == nullptr.
struct Argv {
  explicit Argv(std::vector<std::string> a) : strings(std::move(a)) {
    for (auto& s : strings) ptrs.push_back(s.data());
    ptrs.push_back(nullptr);
    argc = static_cast<int>(strings.size());
  }
  std::vector<std::string> strings;
  std::vector<char*> ptrs;
  int argc = 0;
};

// InitFlags over `argv` and `env`, read beside the program's own --epochs (its value to *epochs).
train::InitFlags read_flags(std::vector<std::string> argv, env::Env env, long* epochs = nullptr,
                            train::InitOptions opts = {}) {
  Argv a(std::move(argv));
  train::InitFlags init(a.argc, a.ptrs.data(), opts, std::move(env));
  cxxopts::Options options("prog", "test");
  options.add_options()("epochs", "the program's own flag", cxxopts::value<long>()->default_value("1"));
  init.add_options(options);
  const auto args = train::parse_args(options, a.argc, a.ptrs.data());
  init.read(args);
  if (epochs) *epochs = args["epochs"].as<long>();
  return init;
}

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

// env:// variables of rank `rank` of 2, both on this host; MASTER_PORT only when `port` is given (MASTER_ADDR
// also names the interface the tcp backend listens on).
env::Env env_rank(int rank, int port = 0) {
  if (port == 0)
    return env::Env::from({{"RANK", std::to_string(rank)}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", std::to_string(rank)},
                           {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}});
  return env::Env::from({{"RANK", std::to_string(rank)}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", std::to_string(rank)},
                         {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                         {"MASTER_PORT", std::to_string(port)}});
}

struct Seen {
  int rank = -1, world = -1, local_rank = -1, local_world = -1, gpu = 0;
  std::string source, device, backend;
  bool tcp_store = false;
  float sum = 0;
};

// Rank r's job (store: shared, or nullptr for init_process_group's own), and what it reports; an all-reduce of
// r + 1 over both ranks must give 1 + 2.
Seen join_rank(int r, int port, std::shared_ptr<store::Store> store) {
  const train::InitFlags init =
      read_flags({"prog", "--backend=tcp", "--device=cpu", "--timeout-ms", "20000"}, env_rank(r, port));
  train::Job job = store ? train::init_process_group(init, store) : train::init_process_group(init);
  std::vector<float> v{static_cast<float>(r + 1)};
  job.communicator().all_reduce(std::span(v)).wait();
  return {.rank = job.rank(), .world = job.world_size(), .local_rank = job.local_rank(),
          .local_world = job.local_world_size(), .gpu = job.cuda_device(), .source = job.info().source,
          .device = job.device().device, .backend = std::string(job.communicator().backend()),
          .tcp_store = dynamic_cast<store::TcpStore*>(&job.store()) != nullptr, .sum = v[0]};
}

// Both ranks on threads; rethrows the first failure.
std::vector<Seen> join_two(int port, std::shared_ptr<store::Store> store) {
  std::vector<Seen> seen(2);
  std::vector<std::exception_ptr> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        seen[static_cast<std::size_t>(r)] = join_rank(r, port, store);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return seen;
}

// std::cout's text while alive.
struct CaptureCout {
  CaptureCout() : old(std::cout.rdbuf(text.rdbuf())) {}
  ~CaptureCout() { std::cout.rdbuf(old); }
  std::ostringstream text;
  std::streambuf* old;
};

// A port nothing listens on: rank 1 of 2 would wait there for rank 0's store (up to --timeout-ms) if it joined.
int closed_port() {
  store::TcpStoreServer probe("127.0.0.1", 0);
  return probe.port();
}

// The program's own options: --epochs, and with `own_h` a -h of its own (-h,--height).
cxxopts::Options program_options(bool own_h = false) {
  cxxopts::Options options("prog", "test");
  options.add_options()("epochs", "the program's own flag", cxxopts::value<long>()->default_value("1"));
  if (own_h)
    options.add_options()("h,height", "a flag of the program's on -h", cxxopts::value<int>()->default_value("0"));
  return options;
}

}  // namespace test_init

TEST_SUITE("train") {
  TEST_CASE("init_process_group: one process, launch flags out of argv beside the program's own flags") {
    using namespace test_init;
    long epochs = 0;
    const train::InitFlags init =
        read_flags({"prog", "--epochs", "3", "--local_rank=0", "--backend", "tcp", "--device", "cpu",
                    "--timeout-ms=5000"},
                   env::Env::from({}), &epochs);
    CHECK(epochs == 3);
    CHECK(init.launch_flags().local_rank == 0);
    CHECK(init.dist().backend == "tcp");
    CHECK(init.dist().timeout == std::chrono::milliseconds(5000));
    train::Job job = train::init_process_group(init);
    CHECK(job.rank() == 0);
    CHECK(job.world_size() == 1);
    CHECK(job.local_rank() == 0);
    CHECK(job.local_world_size() == 1);
    CHECK(job.device().device == "cpu");
    CHECK(job.cuda_device() == -1);
    CHECK(job.communicator().backend() == "tcp");
    CHECK(dynamic_cast<store::HashStore*>(&job.store()) != nullptr);  // nothing to rendezvous with
    job.store().set("k", std::string_view("v"));
    CHECK(job.store().get_string("k") == "v");
    std::vector<float> v{2.5f};
    job.communicator().all_reduce(std::span(v)).wait();
    CHECK(v[0] == 2.5f);
    train::Job moved(std::move(job));  // the job moves out of a function, as from init_process_group
    CHECK(moved.world_size() == 1);
  }

  TEST_CASE("init_process_group: two ranks over the caller's store (torch's store=) report the env:// launch") {
    using namespace test_init;
    auto shared = std::make_shared<store::HashStore>(std::chrono::seconds(20));
    const std::vector<Seen> seen = join_two(0, shared);  // no MASTER_PORT: the given store needs none
    for (int r = 0; r < 2; ++r) {
      const Seen& s = seen[static_cast<std::size_t>(r)];
      CAPTURE(r);
      CHECK(s.rank == r);
      CHECK(s.world == 2);
      CHECK(s.local_rank == r);
      CHECK(s.local_world == 2);
      CHECK(s.source == "env");
      CHECK(s.backend == "tcp");
      CHECK(s.sum == 3.0f);
      CHECK_FALSE(s.tcp_store);
    }
  }

  TEST_CASE("init_process_group: two ranks over the TCP store rank 0 hosts on MASTER_PORT") {
    using namespace test_init;
    int port = 0;
    {
      store::TcpStoreServer probe("127.0.0.1", 0);  // a free port, released for rank 0 to bind
      port = probe.port();
    }
    const std::vector<Seen> seen = join_two(port, nullptr);
    for (int r = 0; r < 2; ++r) {
      const Seen& s = seen[static_cast<std::size_t>(r)];
      CAPTURE(r);
      CHECK(s.rank == r);
      CHECK(s.world == 2);
      CHECK(s.tcp_store);
      CHECK(s.sum == 3.0f);
    }
  }

  TEST_CASE("init_process_group(argc, argv, options): --help prints the flags and joins nothing") {
    using namespace test_init;
    for (const bool own_h : {false, true}) {
      CAPTURE(own_h);
      // Rank 1 of 2 with no rank 0 anywhere: joining would wait out --timeout-ms and throw.
      Argv a({"prog", "--local_rank=1", "--help", "--timeout-ms=3000"});
      cxxopts::Options options = program_options(own_h);
      CaptureCout out;
      auto [job, args] =
          train::init_process_group(a.argc, a.ptrs.data(), options, {.cpu_only = true}, env_rank(1, closed_port()));
      CHECK_FALSE(job.has_value());
      CHECK(args.count("help") == 1);
      CHECK(a.argc == 3);  // --local_rank=1 taken out
      const std::string help = out.text.str();
      CAPTURE(help);
      CHECK(help.find("--epochs") != std::string::npos);      // the program's
      CHECK(help.find("--backend") != std::string::npos);     // the distributed flags
      CHECK(help.find("--timeout-ms") != std::string::npos);
      CHECK(help.find("--device") == std::string::npos);      // cpu_only
      CHECK(help.find("--master-port") != std::string::npos); // the launch flags
      CHECK(help.find(own_h ? "-h, --height" : "-h, --help") != std::string::npos);
    }
  }

  TEST_CASE("init_process_group(argc, argv, options): one process returns the job and the parsed flags") {
    using namespace test_init;
    Argv a({"prog", "--epochs", "3", "--local_rank=0", "--backend", "tcp", "--timeout-ms=5000", "--comm-hook",
            "fp16", "--bucket-cap-mb", "2", "--static-graph", "--metrics-file", "m.jsonl"});
    cxxopts::Options options = program_options();
    auto [job, args] =
        train::init_process_group(a.argc, a.ptrs.data(), options, {.cpu_only = true}, env::Env::from({}));
    REQUIRE(job.has_value());
    // The distributed flags reach the program through the job (DDP's options, the bookkeeper's outputs).
    CHECK(job->flags().ddp.comm_hook == parallel::CommHookKind::Fp16);
    CHECK(job->flags().ddp.bucket_cap_bytes == 2u << 20);
    CHECK(job->flags().ddp.static_graph);
    CHECK_FALSE(job->flags().ddp.find_unused_parameters);
    CHECK(job->flags().metrics_file == "m.jsonl");
    CHECK(job->flags().timeout == std::chrono::milliseconds(5000));
    CHECK(args.count("help") == 0);
    CHECK(args["epochs"].as<long>() == 3);
    CHECK(args["backend"].as<std::string>() == "tcp");
    CHECK(job->rank() == 0);
    CHECK(job->world_size() == 1);
    CHECK(job->local_rank() == 0);
    CHECK(job->device().device == "cpu");
    CHECK(job->communicator().backend() == "tcp");
    std::vector<float> v{1.5f};
    job->communicator().all_reduce(std::span(v)).wait();
    CHECK(v[0] == 1.5f);
    // The program's own -h stays its own; --help is added beside it.
    Argv b({"prog", "-h", "7"});
    cxxopts::Options with_h = program_options(true);
    auto [job_h, args_h] = train::init_process_group(b.argc, b.ptrs.data(), with_h, {.cpu_only = true},
                                                     env::Env::from({}));
    CHECK(job_h.has_value());
    CHECK(args_h["height"].as<int>() == 7);
  }

  TEST_CASE("init_process_group(argc, argv, options): bad flags fail before any rendezvous") {
    using namespace test_init;
    const int port = closed_port();  // as above: rank 1 of 2, joining would wait out --timeout-ms
    const auto start = [&](std::vector<std::string> argv) {
      argv.push_back("--timeout-ms=3000");
      Argv a(std::move(argv));
      cxxopts::Options options = program_options();
      (void)train::init_process_group(a.argc, a.ptrs.data(), options, {.cpu_only = true}, env_rank(1, port));
    };
    const std::string unknown = error_of([&] { start({"prog", "--no-such-flag"}); });
    CHECK(unknown.starts_with("ddp: Option "));  // cxxopts' words, with UTF-8 or ASCII quotes
    CHECK(unknown.find("no-such-flag") != std::string::npos);
    CHECK(unknown.ends_with("; --help lists the flags"));  // true here: the call added --help
    CHECK(error_of([&] { start({"prog", "--epochs", "x"}); })
              .starts_with("ddp: --epochs: 'x' is not a value of its type"));
    CHECK(error_of([&] { start({"prog", "--backend", "nccl"}); }) ==
          "ddp: --backend nccl reduces GPU memory, but this program computes on the CPU only; use --backend gloo "
          "(or tcp, mpi)");
    CHECK(error_of([&] { start({"prog", "--rank"}); }) == "ddp: --rank needs a value, e.g. --rank=0.");
  }

  TEST_CASE("init_process_group: bad flags, devices and launch environments fail before any rendezvous") {
    using namespace test_init;
    const env::Env none = env::Env::from({});
    CHECK(error_of([&] { (void)read_flags({"prog", "--device", "gpu"}, none); }) ==
          "ddp: unknown --device 'gpu'; valid: cpu, cuda (or leave --device out to pick)");
    if constexpr (!BuildConfig::with_cuda) {
      CHECK(read_flags({"prog"}, none).device().reason ==
            "--device not given: training on the CPU (built without CUDA)");
      CHECK(error_of([&] { (void)read_flags({"prog", "--backend", "nccl"}, none); })
                .starts_with("ddp: --backend nccl needs a build with CUDA and NCCL"));
    }
    // A CPU-only program has no --device, and refuses nccl in its own words.
    CHECK(error_of([&] { (void)read_flags({"prog", "--device", "cpu"}, none, nullptr, {.cpu_only = true}); })
              .find("device") != std::string::npos);
    CHECK(error_of([&] { (void)read_flags({"prog", "--backend", "nccl"}, none, nullptr, {.cpu_only = true}); }) ==
          "ddp: --backend nccl reduces GPU memory, but this program computes on the CPU only; use --backend gloo "
          "(or tcp, mpi)");
    CHECK(read_flags({"prog"}, none, nullptr, {.cpu_only = true}).device().device == "cpu");
    // Not read yet.
    Argv a({"prog"});
    const train::InitFlags unread(a.argc, a.ptrs.data(), {}, none);
    CHECK(error_of([&] { (void)train::init_process_group(unread); }).starts_with("ddp: init_process_group before "
                                                                                "InitFlags::read"));
    // The launch environment: detect's errors, before any store exists.
    CHECK(error_of([&] {
            (void)train::init_process_group(read_flags({"prog"}, env::Env::from({{"RANK", "2"}, {"WORLD_SIZE", "2"}})));
          }).find("RANK") != std::string::npos);
    // RANK and WORLD_SIZE alone do not prove the ranks local, so no store address is assumed.
    const env::Env no_master = env::Env::from({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
    CHECK(error_of([&] { (void)train::init_process_group(read_flags({"prog"}, no_master)); })
              .find("MASTER_ADDR is not set") != std::string::npos);
    // A bad launch flag: from the InitFlags constructor, naming it.
    Argv bad({"prog", "--rank"});
    CHECK(error_of([&] { train::InitFlags f(bad.argc, bad.ptrs.data(), {}, none); }) ==
          "ddp: --rank needs a value, e.g. --rank=0.");
  }
}
