// Metrics: one JSON object per line (--metrics-file) and the same records as TensorBoard scalars
// (--tensorboard-dir). The rank-0 progress line is train/progress.hpp's.
// SPDX-License-Identifier: MIT
//
//   ddp::train::MetricsWriter metrics(path, tensorboard_dir);  // empty: that output disabled
//   metrics.write({{"global_step", 23}, {"step", 3}, {"loss", 2.31}, {"samples_per_sec", 812.5}});
//   -> {"global_step":23,"loss":2.31,"samples_per_sec":812.5,"step":3}
//   -> TensorBoard step 23: loss 2.31, samples_per_sec 812.5 (every number but the step fields)
//   // a training loop's record, + step_ms, data_ms, comm_*, gpu_memory_* (MiB):
//   metrics.write(train::step_record({{"epoch", 1}, {"step", 3}, {"loss", 2.31}},
//                                    {.start = ts, .got_batch = got_batch, .done = now},
//                                    model.last_trace(), s.device_memory));
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ddp/core/clock.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/parallel/step_trace.hpp"
#include "ddp/tensor/caching_pool.hpp"
#include "ddp/train/tensorboard.hpp"

namespace ddp::train {

// DDP step `t`'s communication as two fields: comm_ms, the time some bucket's all-reduce was in
// flight, and comm_exposed_ms, the time the step waited for them after backward. Neither before the
// first synchronised step, nor where all-reduces cannot be timed (CUDA: they end on a stream;
// StepTrace::completions_known).
inline void add_comm_metrics(nlohmann::json& record, const parallel::StepTrace& t) {
  if (t.step < 0 || !t.completions_known) return;
  record["comm_ms"] = t.comm_seconds() * 1e3;
  record["comm_exposed_ms"] = t.exposed_comm_seconds() * 1e3;
}

// When a step began (before waiting for its batch), when its batch was there, and when it ended.
struct StepTimes {
  Clock::time_point start;
  // none: the record gets no data_ms (multinode builds its batch)
  std::optional<Clock::time_point> got_batch;
  Clock::time_point done;
};

// `head` (epoch, step, loss, lr, ...) plus what every example adds: step_ms (start to done),
// data_ms (start to got_batch), add_comm_metrics' fields, and where `device_memory` is given the
// device's tensor memory now and at peak, gpu_memory_mib and gpu_memory_peak_mib (MiB, 2^20 bytes).
inline nlohmann::json step_record(nlohmann::json head, const StepTimes& t,
                                  const parallel::StepTrace& trace,
                                  MemoryStats (*device_memory)() = nullptr) {
  using ms = std::chrono::duration<double, std::milli>;
  head["step_ms"] = ms(t.done - t.start).count();
  if (t.got_batch) head["data_ms"] = ms(*t.got_batch - t.start).count();
  add_comm_metrics(head, trace);
  if (device_memory) {
    const MemoryStats m = device_memory();
    head["gpu_memory_mib"] = static_cast<double>(m.current_bytes) / (1 << 20);
    head["gpu_memory_peak_mib"] = static_cast<double>(m.peak_bytes) / (1 << 20);
  }
  return head;
}

// TensorBoard's view of a record: every number but the step fields, tagged by its key. Its step
// (tensorboard_step) is "global_step" (curves do not restart each epoch), else "step", else
// `fallback`.
inline std::vector<Scalar> tensorboard_scalars(const nlohmann::json& record) {
  std::vector<Scalar> out;
  for (const auto& [key, v] : record.items())
    if (v.is_number() && key != "step" && key != "global_step")
      out.push_back({.tag = key, .value = v.get<float>()});
  return out;
}
inline std::int64_t tensorboard_step(const nlohmann::json& record, std::int64_t fallback) {
  for (const char* key : {"global_step", "step"})
    if (auto it = record.find(key); it != record.end() && it->is_number_integer())
      return it->get<std::int64_t>();
  return fallback;
}

// Where a training program's per-step metrics go: JSON lines, TensorBoard, both or neither.
class MetricsWriter {
 public:
  MetricsWriter() = default;
  // Opens `path` for appending and creates an event file in `tensorboard_dir`; throws IoError if
  // either cannot be. An empty path or directory disables that output.
  explicit MetricsWriter(const std::string& path, const std::string& tensorboard_dir = {})
      : path_(path), tensorboard_(tensorboard_dir) {
    if (path.empty()) return;
    out_.open(path, std::ios::app);
    if (!out_)
      throw IoError(ddp::detail::str(
          "ddp: cannot open metrics file ", ddp::detail::quoted(path),
          " for appending; check the directory exists and is writable (--metrics-file)"));
  }
  bool enabled() const noexcept { return out_.is_open() || tensorboard_.enabled(); }
  const TensorBoardWriter& tensorboard() const noexcept { return tensorboard_; }
  // Writes one line and flushes (a crash loses at most that line), and the numbers as one
  // TensorBoard event (flushed by TensorBoardWriter's policy and at destruction).
  void write(const nlohmann::json& record) {
    if (out_.is_open()) {
      out_ << record.dump() << '\n';
      out_.flush();
    }
    if (tensorboard_.enabled())
      tensorboard_.add_scalars(tensorboard_step(record, records_), tensorboard_scalars(record));
    ++records_;
  }

 private:
  std::string path_;
  std::ofstream out_;
  TensorBoardWriter tensorboard_;
  std::int64_t records_ = 0;  // the TensorBoard step of a record without one
};

}  // namespace ddp::train
