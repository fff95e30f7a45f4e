// libFuzzer target: launcher detection (env/detect.hpp and the policies, host lists, launch flags), the code
// that turns whatever environment and command line a process was started with into its place in the job.
// SPDX-License-Identifier: MIT
//
// Input: text, one item per line (so the seeds are readable environments captured from real launchers;
// NUL ends a line too, as neither argv nor environ can hold one):
//   NAME=value     an environment variable (value: any bytes but '\n' and NUL; later lines win)
//   -...           an argv entry after the program name (--rank=1, --local_rank 0, --, ...)
//   @need_master   DetectOptions::need_master_addr = true (as for --backend tcp / nccl)
//   @no_default    DetectOptions::default_local_master = false
// Names are not restricted to the ones the policies read, but the seeds and tests/fuzz/
// fuzz_launcher_detect.dict steer the fuzzer to them (TORCHELASTIC_*, RANK, OMPI_COMM_WORLD_*, PMI_*,
// MV2_*, SLURM_*, MASTER_*, GROUP_*). Besides "no crash, no UB, no leak" it checks the contract:
//   - the only exceptions are ddp::ConfigError (ValueError from the JSON round trip), with a message;
//   - extract_launch_flags on a vector and on a C argv agree, and remove exactly the launch flags;
//   - on success: 1 <= world_size, 0 <= rank < world_size, 1 <= local_world_size <= world_size,
//     0 <= local_rank < local_world_size, 0 <= node_rank < nnodes <= world_size; a flag that was given
//     is the value used; a job that needs a store (need_master, world_size > 1) has an address and a
//     port; no launcher and no flags is exactly the single-process default; detect() is deterministic;
//     describe() works and to_json / launch_info_from_json round-trip.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ddp/core/log.hpp>
#include <ddp/env/describe.hpp>
#include <ddp/env/detect.hpp>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

namespace env = ddp::env;

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "fuzz_launcher_detect: %s %s\n", what, detail.c_str());
  std::abort();
}

bool same(const env::LaunchInfo& a, const env::LaunchInfo& b) {
  return a.rank == b.rank && a.world_size == b.world_size && a.local_rank == b.local_rank &&
         a.local_world_size == b.local_world_size && a.node_rank == b.node_rank && a.nnodes == b.nnodes &&
         a.master_addr == b.master_addr && a.master_port == b.master_port && a.restart_count == b.restart_count &&
         a.run_id == b.run_id && a.launcher_owns_store == b.launcher_owns_store && a.source == b.source;
}

bool is_valid_utf8(std::string_view s) {
  try {
    (void)nlohmann::json(std::string(s)).dump();
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

bool looks_like_launch_flag(std::string_view a) {
  for (std::string_view f : {"--rank", "--world-size", "--local-rank", "--local_rank", "--local-world-size",
                             "--master-addr", "--master-port"})
    if (a == f || (a.starts_with(f) && a.size() > f.size() && a[f.size()] == '=')) return true;
  return false;
}

void check_info(const env::LaunchInfo& info, const env::LaunchFlags& flags, const env::DetectOptions& opts,
                const env::Env& e) {
  const std::string d = env::describe(info);
  if (info.world_size < 1 || info.rank < 0 || info.rank >= info.world_size) fail("rank out of range:", d);
  if (info.local_world_size < 1 || info.local_world_size > info.world_size) fail("local world size out of range:", d);
  if (info.local_rank < 0 || info.local_rank >= info.local_world_size) fail("local rank out of range:", d);
  if (info.nnodes < 1 || info.nnodes > info.world_size || info.node_rank < 0 || info.node_rank >= info.nnodes)
    fail("node out of range:", d);
  if (info.source.empty()) fail("no source:", d);
  if (flags.rank && info.rank != *flags.rank) fail("--rank not applied:", d);
  if (flags.world_size && info.world_size != *flags.world_size) fail("--world-size not applied:", d);
  if (flags.local_rank && info.local_rank != *flags.local_rank) fail("--local-rank not applied:", d);
  if (flags.local_world_size && info.local_world_size != *flags.local_world_size)
    fail("--local-world-size not applied:", d);
  if (flags.master_addr && info.master_addr != *flags.master_addr) fail("--master-addr not applied:", d);
  if (flags.master_port && info.master_port != *flags.master_port) fail("--master-port not applied:", d);
  if (opts.need_master_addr && info.world_size > 1 && (info.master_addr.empty() || info.master_port == 0))
    fail("a job that needs a store has no store address:", d);
  if (flags.empty() && !env::Torchrun::detected(e) && !env::EnvUrl::detected(e) && !env::OpenMpi::detected(e) &&
      !env::Pmi::detected(e) && !env::Mvapich::detected(e) && !env::Slurm::detected(e) &&
      !same(info, env::LaunchInfo{}))
    fail("no launcher and no flags, but not the single-process default:", d);
  // JSON round trip (probes print it, tests read it back); only for UTF-8 strings, which JSON can carry.
  if (is_valid_utf8(info.master_addr) && is_valid_utf8(info.run_id) && is_valid_utf8(info.source)) {
    if (!same(env::launch_info_from_json(env::to_json(info)), info)) fail("JSON round trip changed:", d);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool quiet = (ddp::log::set_level(ddp::log::Level::Off), true);  // detect() may log on rank 0
  (void)quiet;
  env::Env::Map vars;
  std::vector<std::string> args{"prog"};
  env::DetectOptions opts{.need_master_addr = false, .backend = "tcp", .default_local_master = true};
  std::string_view text(reinterpret_cast<const char*>(data), size);
  while (!text.empty()) {
    const auto nl = text.find_first_of(std::string_view("\n\0", 2));  // NUL ends a C string: argv and environ
    const std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (line == "@need_master") {
      opts.need_master_addr = true;
    } else if (line == "@no_default") {
      opts.default_local_master = false;
    } else if (line.starts_with("-")) {
      args.emplace_back(line);
    } else if (const auto eq = line.find('='); eq != std::string_view::npos && eq > 0) {
      vars.insert_or_assign(std::string(line.substr(0, eq)), std::string(line.substr(eq + 1)));
    }
  }
  const env::Env e(std::move(vars));
  try {
    // The flags, taken out of argv both ways; both must agree.
    std::vector<std::string> kept = args;
    env::LaunchFlags flags;
    try {
      flags = env::extract_launch_flags(kept);
    } catch (const ddp::ConfigError& x) {
      if (!*x.what()) fail("ConfigError without a message (flags)");
      std::vector<char*> argv;  // the C form must refuse the same argv
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      int argc = static_cast<int>(args.size());
      try {
        (void)env::extract_launch_flags(argc, argv.data());
      } catch (const ddp::ConfigError&) {
        return 0;
      }
      fail("the C argv form accepted flags that the vector form refused:", x.what());
    }
    {
      std::vector<std::string> copy = args;
      std::vector<char*> argv;
      for (auto& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      int argc = static_cast<int>(copy.size());
      (void)env::extract_launch_flags(argc, argv.data());
      if (argv[argc] != nullptr || static_cast<std::size_t>(argc) != kept.size()) fail("argc/argv not compacted");
      for (int i = 0; i < argc; ++i)
        if (kept[static_cast<std::size_t>(i)] != argv[i]) fail("the C argv form kept different arguments");
    }
    const auto dashdash = std::find(kept.begin(), kept.end(), std::string("--"));
    for (auto it = kept.begin() + 1; it != dashdash; ++it)
      if (looks_like_launch_flag(*it)) fail("a launch flag was left in argv:", *it);

    env::LaunchInfo info;
    try {
      info = env::detect(e, flags, opts);
    } catch (const ddp::ConfigError& x) {
      if (!*x.what()) fail("ConfigError without a message");
      try {
        (void)env::detect(e, flags, opts);
      } catch (const ddp::ConfigError& y) {
        if (std::string(x.what()) != y.what()) fail("detect() is not deterministic:", x.what());
        return 0;
      }
      fail("detect() threw once and then succeeded:", x.what());
    }
    if (!same(env::detect(e, flags, opts), info)) fail("detect() is not deterministic");
    check_info(info, flags, opts, e);
  } catch (const ddp::ConfigError& x) {
    fail("ConfigError outside detect():", x.what());
  } catch (const std::exception& x) {
    fail("unexpected exception:", x.what());
  }
  return 0;
}
