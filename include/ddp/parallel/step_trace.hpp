// StepTrace: the last synchronised step as DDP's reducer saw it (bucket launch and completion
// times, the end of backward): the metrics' comm_ms and comm_exposed_ms and the trace's all-reduce
// events read it.
// SPDX-License-Identifier: MIT
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ddp/core/clock.hpp"

namespace ddp::parallel {

struct BucketTrace {
  std::size_t index = 0;
  std::int64_t numel = 0;
  std::size_t num_params = 0;
  Clock::time_point launched;  // when its all-reduce was issued
  // when the backend completed it; launched when the transport cannot tell (CUDA)
  Clock::time_point completed;
};
// The last synchronised step as seen by the schedule.
struct StepTrace {
  std::int64_t step = -1;
  Clock::time_point backward_start;  // prepare_step()
  Clock::time_point last_gradient;   // the last grad-ready hook of this backward
  Clock::time_point backward_end;    // finish() entered
  Clock::time_point finished;        // finish() returned: the averaged gradients are in grad()
  std::vector<BucketTrace> buckets;  // in launch order
  // The transport reports completion times (the CPU's; the CUDA transport's all-reduces end on a
  // stream, after finish() returns, so there BucketTrace::completed is the launch and the two
  // durations below mean nothing).
  bool completions_known = false;
  // How many buckets were launched before backward ended (the overlap).
  std::size_t launched_before_backward_end() const {
    std::size_t n = 0;
    for (const auto& b : buckets) n += b.launched < backward_end ? 1 : 0;
    return n;
  }
  // Seconds during which at least one bucket's all-reduce was in flight (the union of
  // launch..completion).
  double comm_seconds() const {
    double total = 0.0;
    // intervals come in launch order; completions are in order too (one queue)
    Clock::time_point covered{};
    for (const auto& b : buckets) {
      const Clock::time_point from = std::max(b.launched, covered);
      if (b.completed > from) total += std::chrono::duration<double>(b.completed - from).count();
      covered = std::max(covered, b.completed);
    }
    return total;
  }
  // Seconds the step spent in finish(): communication that backward did not hide, plus unpacking
  // the averages.
  double exposed_comm_seconds() const {
    return std::chrono::duration<double>(finished - backward_end).count();
  }
  // How many buckets were launched while backward was still producing gradients (strict overlap:
  // the bucket holding the last gradient can only start after it, so at most buckets.size() - 1).
  std::size_t launched_during_backward() const {
    std::size_t n = 0;
    for (const auto& b : buckets) n += b.launched < last_gradient ? 1 : 0;
    return n;
  }
};

}  // namespace ddp::parallel
