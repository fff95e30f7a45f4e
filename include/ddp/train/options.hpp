// Training program flags shared by the examples: backend, timeouts, DDP bucket settings, metrics
// file, TensorBoard directory and trace (cxxopts).
// SPDX-License-Identifier: MIT
//
//   cxxopts::Options options("resnet", "...");
//   ddp::train::add_dist_options(options, env);            // --backend, --timeout-ms,
//     --bucket-cap-mb, ...
//   auto args = options.parse(argc, argv);
//   ddp::train::DistFlags dist = ddp::train::read_dist_flags(args);
// Every flag that has an environment variable takes its default from it (DDP_TIMEOUT_MS,
// DDP_SOCKET_IFNAME, DDP_SHM, DDP_STORE_PORT, DDP_COMM_CPUS), so `--timeout-ms` and
// `DDP_TIMEOUT_MS` are interchangeable.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <cxxopts.hpp>

#include "ddp/comm/types.hpp"
#include "ddp/core/cpu_affinity.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/env/env.hpp"
#include "ddp/parallel/ddp.hpp"
#include "ddp/train/parse_args.hpp"
#include "ddp/train/trace.hpp"

namespace ddp::train {

struct DistFlags {
  std::string backend = "gloo";
  std::chrono::milliseconds timeout = comm::kDefaultCommTimeout;
  std::string socket_ifname;
  // tcp, mpi: shared memory between ranks on one host (DDP_SHM=0: off)
  bool shm = true;
  std::optional<std::uint16_t> store_port;  // when the launcher already holds MASTER_PORT
  // --comm-cpus / DDP_COMM_CPUS: the progress thread's CPUs (tcp, mpi)
  std::vector<int> comm_cpus;
  parallel::DdpOptions ddp;  // bucket caps, communication hook, unused parameters
  std::string metrics_file;  // JSON lines; empty: none
  // rank 0's TensorBoard event file goes here; empty: none
  std::string tensorboard_dir;
  // --trace FILE, --trace-steps FIRST:LAST (train/trace.hpp)
  TraceOptions trace;

  // cuda_device: the GPU this rank trains on (train::cuda_device_for), -1 on the CPU. With it,
  // tcp/gloo (and mpi) stage device tensors through pinned memory and nccl uses that GPU
  // (comm::CommOptions::cuda_device).
  comm::CommOptions comm_options(int cuda_device = -1) const {
    return {.timeout = timeout,
            .socket_ifname = socket_ifname,
            .progress_cpus = comm_cpus,
            .shm = shm,
            .cuda_device = cuda_device};
  }
  bool needs_store() const { return backend != "mpi"; }
};

// Adds the distributed flags to `options` (group "distributed"). DDP_TIMEOUT_MS and DDP_STORE_PORT
// become the flags' defaults; a value that is not a number is a ConfigError naming the variable
// here, because cxxopts would only say "Argument '30s' failed to parse" when it parses the default.
inline void add_dist_options(cxxopts::Options& options, const env::Env& env,
                             const std::string& default_backend = "gloo") {
  if (auto v = env.get("DDP_TIMEOUT_MS"); v && !env::detail::parse_int(*v))
    throw ConfigError(ddp::detail::str(
        "ddp: DDP_TIMEOUT_MS=", ddp::detail::quoted(*v),
        " is not a whole number of milliseconds; unset it or pass --timeout-ms=<ms>."));
  if (auto v = env.get("DDP_STORE_PORT"); v && !env::detail::parse_int(*v))
    throw ConfigError(
        ddp::detail::str("ddp: DDP_STORE_PORT=", ddp::detail::quoted(*v),
                         " is not a TCP port; unset it or pass --store-port=<1..65535>."));
  options.add_options("distributed")("backend", "nccl, gloo (= tcp), tcp or mpi",
                                     cxxopts::value<std::string>()->default_value(default_backend))(
      "timeout-ms", "collective and store timeout in ms (DDP_TIMEOUT_MS)",
      cxxopts::value<long>()->default_value(env.get("DDP_TIMEOUT_MS").value_or("300000")))(
      "socket-ifname", "tcp: interface to listen on (DDP_SOCKET_IFNAME)",
      cxxopts::value<std::string>()->default_value(env.get("DDP_SOCKET_IFNAME").value_or("")))(
      "shm",
      "tcp and mpi: shared memory between ranks on one host; 0 or false turns it off (DDP_SHM)",
      cxxopts::value<std::string>()->default_value(env.get("DDP_SHM").value_or("1")))(
      "comm-cpus",
      "tcp, mpi: CPUs for the communication thread, e.g. 1 or 2-3 (DDP_COMM_CPUS): a core the "
      "training threads leave free lets DDP's all-reduces overlap with backward instead of taking "
      "turns with it; "
      "empty: wherever the OS puts it",
      cxxopts::value<std::string>()->default_value(env.get("DDP_COMM_CPUS").value_or("")))(
      "store-port", "store port when the launcher holds MASTER_PORT (DDP_STORE_PORT)",
      cxxopts::value<int>()->default_value(env.get("DDP_STORE_PORT").value_or("0")))(
      "bucket-cap-mb", "DDP gradient bucket size in MiB (first bucket 1 MiB)",
      cxxopts::value<double>()->default_value("25"))(
      "comm-hook",
      "what gradient buckets go through: allreduce (average), fp16 or bf16 (divide by the world "
      "size, round to 16 bits, sum: half the bytes; torch's fp16/bf16_compress_hook), powersgd "
      "(low-rank "
      "factors of each large gradient matrix with error feedback; torch's powerSGD_hook; CPU and "
      "CUDA models)",
      cxxopts::value<std::string>()->default_value("allreduce"))(
      "powersgd-rank",
      "--comm-hook powersgd: the rank of each gradient matrix's approximation (1-4 typical; "
      "higher is more accurate and sends more)",
      cxxopts::value<int>()->default_value("1"))(
      "powersgd-start-iter",
      "--comm-hook powersgd: plain all-reduce for this many steps first (torch's "
      "start_powerSGD_iter; >= 2)",
      cxxopts::value<long>()->default_value("1000"))(
      "find-unused-parameters",
      "allow parameters without a gradient in a step (torch's find_unused_parameters: "
      "one more small all-reduce per step; a parameter no rank used keeps no gradient)")(
      "static-graph",
      "every step uses the same parameters (torch's static_graph): unused ones are found in "
      "the first step and their all-reduce flag is skipped afterwards")(
      "gradient-as-bucket-view",
      "gradients live in DDP's buckets (torch's gradient_as_bucket_view): no copy "
      "into the bucket before the all-reduce nor back after it. Default: on for CPU models, off on "
      "CUDA "
      "(=false: copy, as torch's default)",
      cxxopts::value<std::string>()->implicit_value("true"))(
      "metrics-file", "append one JSON object per step to this file",
      cxxopts::value<std::string>()->default_value(""))(
      "tensorboard-dir",
      "rank 0 writes the per-step metrics as TensorBoard scalars to a new event file in this "
      "directory (created if missing; view with `tensorboard --logdir DIR`)",
      cxxopts::value<std::string>()->default_value(""))(
      "trace",
      "write a Chrome/Perfetto trace (JSON) of the --trace-steps steps of every rank to this file "
      "(rank 0 "
      "merges them): each module's forward and backward, each bucket's all-reduce, optimizer, data "
      "wait",
      cxxopts::value<std::string>()->default_value(""))(
      "trace-steps", "--trace: which steps, counted from 1 over all epochs: N or FIRST:LAST",
      cxxopts::value<std::string>()->default_value("3:5"));
}

// Reads the flags added by add_dist_options; ConfigError/ValueError on bad values.
inline DistFlags read_dist_flags(const cxxopts::ParseResult& args) {
  DistFlags f;
  f.backend = args["backend"].as<std::string>();
  const long t = args["timeout-ms"].as<long>();
  if (t <= 0)
    throw ConfigError(
        ddp::detail::str("ddp: --timeout-ms must be > 0, got ", t, " (DDP_TIMEOUT_MS)"));
  f.timeout = std::chrono::milliseconds(t);
  f.socket_ifname = args["socket-ifname"].as<std::string>();
  // "false" must not mean on
  f.shm = parse_flag_bool("--shm (DDP_SHM)", args["shm"].as<std::string>());
  f.comm_cpus = parse_cpu_list(args["comm-cpus"].as<std::string>(), "--comm-cpus (DDP_COMM_CPUS)");
  const int p = args["store-port"].as<int>();
  if (p < 0 || p > 65535)
    throw ConfigError(
        ddp::detail::str("ddp: --store-port must be in [0, 65535], got ", p, " (DDP_STORE_PORT)"));
  if (p > 0) f.store_port = static_cast<std::uint16_t>(p);
  f.ddp.bucket_cap_bytes = parallel::bucket_cap_bytes_from_mb(args["bucket-cap-mb"].as<double>());
  f.ddp.comm_hook = parallel::parse_comm_hook(args["comm-hook"].as<std::string>());
  f.ddp.powersgd.matrix_approximation_rank = args["powersgd-rank"].as<int>();
  f.ddp.powersgd.start_iter = args["powersgd-start-iter"].as<long>();
  parallel::validate_powersgd_options(f.ddp.powersgd);
  f.ddp.find_unused_parameters = args.count("find-unused-parameters") > 0;
  f.ddp.static_graph = args.count("static-graph") > 0;
  if (args.count("gradient-as-bucket-view"))
    f.ddp.gradient_as_bucket_view = parse_flag_bool(
        "--gradient-as-bucket-view", args["gradient-as-bucket-view"].as<std::string>());
  f.metrics_file = args["metrics-file"].as<std::string>();
  f.tensorboard_dir = args["tensorboard-dir"].as<std::string>();
  f.trace.path = args["trace"].as<std::string>();
  parse_trace_steps(args["trace-steps"].as<std::string>(), f.trace);
  return f;
}

}  // namespace ddp::train
