// hydra_env_test: under the real mpiexec.mpich, compares the environment Hydra gave this process with the
// captured table of tests/unit/env/launch_envs.hpp, variable by variable, then prints what detect() reads.
// SPDX-License-Identifier: MIT
//
// Usage (mpich_tests.py starts it with a clean environment: PATH and HOME only):
//   mpiexec.mpich -n 2 hydra_env_test local
//   mpiexec.mpich -launcher fork -hosts ddp-node-a,ddp-node-b -ppn 2 -n 4 hydra_env_test two_hosts
//   mpiexec.mpich -launcher fork -hosts ddp-node-a:1,ddp-node-b:3 -n 4 hydra_env_test uneven
//   mpiexec.mpich -pmi-port -n 2 hydra_env_test pmi_port
// Every rank checks that it has exactly the table's variable names (besides PATH, HOME and PWD, which are
// ours or Hydra's working directory); the rank the table was captured from also checks every value, except
// the descriptors and the PMI port (PMI_FD, HYDI_CONTROL_FD, PMI_PORT: numbers that differ run to run, so
// only their shape is checked) and, for one-host layouts, the host name (this machine's, not the capture's).
// Output, per rank: `hydra_env: host=<MPIR_CVAR_CH3_INTERFACE_HOSTNAME> {LaunchInfo JSON}`; the driver checks
// the ranks and local ranks across processes. A detect() error is printed as `hydra_env: error: <message>`
// (expected for pmi_port). Exit 0 when the table matched, 1 otherwise.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <set>
#include <string>
#include <string_view>

#include <ddp/core/error.hpp>
#include <ddp/env/describe.hpp>
#include <ddp/env/detect.hpp>
#include <ddp/env/env.hpp>

#include "launch_envs.hpp"

namespace {

using ddp::env::Env;

struct Table {
  Env env;
  bool host_is_this_machine;  // one-host layouts: Hydra names the host by gethostname()
};

Table table_for(std::string_view name) {
  if (name == "local") return {ddp_test::mpich_hydra_local_rank1(), true};
  if (name == "two_hosts") return {ddp_test::mpich_hydra_rank3(), false};
  if (name == "uneven") return {ddp_test::mpich_hydra_uneven_rank0(), false};
  if (name == "pmi_port") return {ddp_test::mpich_hydra_pmi_port_rank1(), true};
  throw ddp::ConfigError("hydra_env_test: unknown table '" + std::string(name) +
                         "'; use local, two_hosts, uneven or pmi_port");
}

bool all_digits(std::string_view s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos;
}

// "" when `value` is what the table's `expected` stands for, else why not.
std::string value_mismatch(std::string_view name, std::string_view value, std::string_view expected,
                           bool host_is_this_machine) {
  if (name == "PMI_FD" || name == "HYDI_CONTROL_FD")
    return all_digits(value) ? "" : "not a descriptor number";
  if (name == "PMI_PORT") {
    auto colon = value.rfind(':');
    return colon != std::string_view::npos && colon > 0 && all_digits(value.substr(colon + 1)) ? "" : "not <host>:<port>";
  }
  std::string want(expected);
  if (name == "MPIR_CVAR_CH3_INTERFACE_HOSTNAME" && host_is_this_machine) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    want = host;
  }
  return value == want ? "" : "expected '" + want + "'";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: mpiexec.mpich ... hydra_env_test local|two_hosts|uneven|pmi_port\n";
    return 2;
  }
  const Env real = Env::process();
  const Table table = table_for(argv[1]);
  const std::string me = real.get("PMI_RANK").value_or(real.get("PMI_ID").value_or("?"));
  const std::string table_rank = table.env.get("PMI_RANK").value_or(table.env.get("PMI_ID").value_or("?"));
  const std::set<std::string, std::less<>> ours = {"PATH", "HOME", "PWD"};

  int failures = 0;
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "hydra_env: rank %s: %s\n", me.c_str(), what.c_str());
    ++failures;
  };
  for (const auto& [name, value] : real.vars()) {
    if (ours.contains(name)) continue;
    auto expected = table.env.get(name);
    if (!expected) {
      fail("Hydra exports " + name + "=" + value + ", which the table " + argv[1] + " lacks");
      continue;
    }
    if (me != table_rank) continue;
    if (auto why = value_mismatch(name, value, *expected, table.host_is_this_machine); !why.empty())
      fail(name + "=" + value + ": " + why);
  }
  for (const auto& [name, value] : table.env.vars())
    if (!real.has(name)) fail("the table " + std::string(argv[1]) + " has " + name + "=" + value + ", Hydra did not export it");

  const std::string host = real.get("MPIR_CVAR_CH3_INTERFACE_HOSTNAME").value_or("?");
  try {
    const ddp::env::LaunchInfo info = ddp::env::detect(real);
    std::cout << "hydra_env: host=" << host << ' ' << ddp::env::to_json(info) << std::endl;
  } catch (const ddp::ConfigError& e) {
    std::cout << "hydra_env: error: " << e.what() << std::endl;
  }
  return failures == 0 ? 0 : 1;
}
