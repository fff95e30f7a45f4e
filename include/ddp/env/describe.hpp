// One-line and JSON descriptions of a LaunchInfo, and the start-up log line rank 0 prints.
// SPDX-License-Identifier: MIT
//
//   describe(info) == "launch via torchrun: rank 0/8, local 0/4, node 0/2, store 10.0.0.1:29500
//     (owned by torchrun)"
//   log_launch(info)   // rank 0 only: "ddp: INFO: launch via torchrun: ..." (or "ddp[rank 0/8]
//     INFO: ...")
//   to_json(info)      // {"rank":0,"world_size":8,...,"source":"torchrun"}: every field, flat,
//     stable keys
//   launch_info_from_json(to_json(info)) == info   (field by field; for tests that collect probes'
//     output)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "ddp/core/error.hpp"
#include "ddp/core/log.hpp"
#include "ddp/core/str.hpp"
#include "ddp/env/launch_info.hpp"

namespace ddp::env {

inline std::string describe(const LaunchInfo& info) {
  using ddp::detail::str;
  std::string store;
  if (info.master_addr.empty())
    store = info.world_size > 1 ? "no store address" : "no store needed";
  else
    store = str("store ", info.master_addr, ':', info.master_port,
                info.launcher_owns_store ? str(" (owned by ", info.source, ")")
                                         : std::string(" (hosted by rank 0)"));
  std::string extra;
  if (info.restart_count > 0) extra += str(", restart ", info.restart_count);
  if (!info.run_id.empty()) extra += str(", run ", info.run_id);
  return str("launch via ", info.source, ": rank ", info.rank, '/', info.world_size, ", local ",
             info.local_rank, '/', info.local_world_size, ", node ", info.node_rank, '/',
             info.nnodes, ", ", store, extra);
}

// Logs describe(info) at INFO level on global rank 0 only, so a job prints it once. Call it once,
// after detect(). Never throws.
inline void log_launch(const LaunchInfo& info) noexcept {
  if (info.rank != 0) return;
  try {
    DDP_LOG_INFO(describe(info));
  } catch (...) {  // out of memory while formatting: a log line is not worth failing start-up for
  }
}

inline nlohmann::ordered_json to_json_value(const LaunchInfo& info) {
  return nlohmann::ordered_json{{"rank", info.rank},
                                {"world_size", info.world_size},
                                {"local_rank", info.local_rank},
                                {"local_world_size", info.local_world_size},
                                {"node_rank", info.node_rank},
                                {"nnodes", info.nnodes},
                                {"master_addr", info.master_addr},
                                {"master_port", info.master_port},
                                {"restart_count", info.restart_count},
                                {"run_id", info.run_id},
                                {"launcher_owns_store", info.launcher_owns_store},
                                {"source", info.source}};
}

// Compact JSON, one line, keys in the order above.
inline std::string to_json(const LaunchInfo& info) { return to_json_value(info).dump(); }

// The inverse of to_json. Throws ValueError naming the problem for text that is not such an object.
inline LaunchInfo launch_info_from_json(std::string_view text) {
  try {
    auto j = nlohmann::json::parse(text);
    return LaunchInfo{.rank = j.at("rank").get<int>(),
                      .world_size = j.at("world_size").get<int>(),
                      .local_rank = j.at("local_rank").get<int>(),
                      .local_world_size = j.at("local_world_size").get<int>(),
                      .node_rank = j.at("node_rank").get<int>(),
                      .nnodes = j.at("nnodes").get<int>(),
                      .master_addr = j.at("master_addr").get<std::string>(),
                      .master_port = j.at("master_port").get<std::uint16_t>(),
                      .restart_count = j.at("restart_count").get<int>(),
                      .run_id = j.at("run_id").get<std::string>(),
                      .launcher_owns_store = j.at("launcher_owns_store").get<bool>(),
                      .source = j.at("source").get<std::string>()};
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(ddp::detail::str("ddp: ", ddp::detail::quoted(text.substr(0, 200)),
                                      " is not a LaunchInfo JSON object: ", e.what()));
  }
}

}  // namespace ddp::env
