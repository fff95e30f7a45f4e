// Metrics: one JSON object per line (--metrics-file) and the rank-0 progress line with step, loss, samples/s.
// SPDX-License-Identifier: MIT
//
//   ddp::train::MetricsWriter metrics(path);                 // empty path: disabled
//   metrics.write({{"step", 3}, {"loss", 2.31}, {"samples_per_sec", 812.5}});
//   -> {"loss":2.31,"samples_per_sec":812.5,"step":3}
//   ddp::train::progress_line(1, 3, 20, 2.31, 812.5) == "epoch 1 step 3/20 loss 2.3100 samples/s 812.5"
#pragma once

#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::train {

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // Opens `path` for appending; throws IoError if it cannot. Empty path: every write is a no-op.
  explicit MetricsWriter(const std::string& path) : path_(path) {
    if (path.empty()) return;
    out_.open(path, std::ios::app);
    if (!out_)
      throw IoError(ddp::detail::str("ddp: cannot open metrics file ", ddp::detail::quoted(path),
                                     " for appending; check the directory exists and is writable (--metrics-file)"));
  }
  bool enabled() const noexcept { return out_.is_open(); }
  // Writes one line and flushes (a crash loses at most the line being written).
  void write(const nlohmann::json& record) {
    if (!enabled()) return;
    out_ << record.dump() << '\n';
    out_.flush();
  }

 private:
  std::string path_;
  std::ofstream out_;
};

// "epoch 1 step 3/20 loss 2.3100 samples/s 812.5"
inline std::string progress_line(long long epoch, long long step, long long steps, double loss, double samples_per_sec) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "epoch %lld step %lld/%lld loss %.4f samples/s %.1f", epoch, step, steps, loss,
                samples_per_sec);
  return buf;
}

}  // namespace ddp::train
