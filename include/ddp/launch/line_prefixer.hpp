// LinePrefixer: turns a worker's raw output bytes into whole lines that start with its rank prefix.
// SPDX-License-Identifier: MIT
//
// How it works: bytes arrive in arbitrary chunks (a pipe read may end mid-line). feed() appends them to
// pending_ and returns every complete line, each with the prefix in front and its '\n' kept; the tail
// without '\n' waits for the next chunk. finish() returns that tail with a '\n' added (the worker ended
// without a newline). A line longer than max_line bytes is cut there, so a worker that never prints
// '\n' cannot grow the buffer without bound. Example, prefix "[rank1]: ":
//   feed("a\nb")  -> "[rank1]: a\n"        pending_ = "b"
//   feed("c\n")   -> "[rank1]: bc\n"       pending_ = ""
//   feed("tail")  -> ""                     finish() -> "[rank1]: tail\n"
// The caller writes each returned block with one write(2) call, so lines from different workers never
// interleave mid-line.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

namespace ddp::launch {

class LinePrefixer {
 public:
  static constexpr std::size_t kDefaultMaxLine = 64 * 1024;  // bytes

  explicit LinePrefixer(std::string prefix, std::size_t max_line = kDefaultMaxLine)
      : prefix_(std::move(prefix)), max_line_(max_line == 0 ? 1 : max_line) {}

  // Complete lines (prefixed, '\n'-terminated) contained in what has arrived so far; may be empty.
  std::string feed(std::string_view bytes) {
    pending_.append(bytes);
    std::string out;
    std::size_t start = 0;
    while (start < pending_.size()) {
      const std::size_t nl = pending_.find('\n', start);
      const std::size_t avail = (nl == std::string::npos ? pending_.size() : nl) - start;
      if (nl == std::string::npos && avail < max_line_) break;  // wait for the rest of the line
      const std::size_t take = avail < max_line_ ? avail : max_line_;
      out += prefix_;
      out.append(pending_, start, take);
      out += '\n';
      start += take;
      if (start < pending_.size() && pending_[start] == '\n' && take == avail) ++start;  // consume the '\n'
    }
    pending_.erase(0, start);
    return out;
  }

  // The unterminated tail, prefixed and terminated; empty when nothing is pending. Resets the buffer.
  std::string finish() {
    if (pending_.empty()) return {};
    std::string out = prefix_ + pending_ + '\n';
    pending_.clear();
    return out;
  }

  const std::string& prefix() const noexcept { return prefix_; }

 private:
  std::string prefix_;
  std::size_t max_line_;
  std::string pending_;  // bytes after the last '\n' seen
};

}  // namespace ddp::launch
