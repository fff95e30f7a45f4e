// Runs a reference program (a PyTorch script in a child python) and returns the first line it prints, parsed
// as JSON; on failure {"torch_error": <what it printed or why it did not start>}. Shared by the benches that
// put ddp beside PyTorch in one run.
// SPDX-License-Identifier: MIT
#pragma once

#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace ddp_bench {

inline nlohmann::json run_child_json(const std::string& cmd) {
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  if (!p) return {{"torch_error", "popen failed: " + cmd}};
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p.get())) out += buf;
  try {
    return nlohmann::json::parse(out.substr(0, out.find('\n')));
  } catch (const std::exception&) {
    return {{"torch_error", out}};
  }
}

}  // namespace ddp_bench
