// LinePrefixer: turns a worker's raw output bytes into whole lines that start with its rank prefix.
// SPDX-License-Identifier: MIT
//
// How it works: bytes arrive in arbitrary chunks (a pipe read may end mid-line). feed() appends
// them to pending_ and returns every complete line, each with the prefix in front and its '\n'
// kept; the tail without '\n' waits for the next chunk. finish() returns that tail with a '\n'
// added (the worker ended without a newline). A line longer than max_line bytes is cut there, so a
// worker that never prints '\n' cannot grow the buffer without bound. Example, prefix "[rank1]: ":
//   feed("a\nb")  -> "[rank1]: a\n"        pending_ = "b"
//   feed("c\n")   -> "[rank1]: bc\n"       pending_ = ""
//   feed("tail")  -> ""                     finish() -> "[rank1]: tail\n"
// The caller writes each returned block with one write(2) call, so lines from different workers
// never interleave mid-line. Status lines: a worker that redraws one line in place (train::Progress
// on a terminal: '\r', the text, "\x1b[K", and '\n' only when the line is final) leaves a tail with
// '\r' in it. Its last redraw is the status (take_status(), prefixed, escapes removed; the pending
// bytes keep only that redraw, so an hour of redraws does not grow the buffer or hit max_line), and
// a completed line keeps only the text after its last '\r':
//   feed("\rstep 1\x1b[K")  -> ""   take_status() -> "[rank0]: step 1"
//   feed("\rstep 2\x1b[K\n") -> "[rank0]: step 2\n"   take_status() -> "" (cleared)
#pragma once

#include <cstddef>
#include <optional>
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
      out += last_redraw(std::string_view(pending_).substr(start, take));
      out += '\n';
      start += take;
      // consume the '\n'
      if (start < pending_.size() && pending_[start] == '\n' && take == avail) ++start;
      set_status({});  // a finished line ends any redrawn one
    }
    pending_.erase(0, start);
    if (const std::size_t cr = pending_.rfind('\r'); cr != std::string::npos) {
      pending_.erase(0, cr);  // only the last redraw matters
      set_status(prefix_ + last_redraw(pending_));
    }
    return out;
  }

  // The status line (prefixed; empty: none) if it changed since the last call.
  std::optional<std::string> take_status() {
    if (!status_changed_) return std::nullopt;
    status_changed_ = false;
    return status_;
  }

  // The unterminated tail, prefixed and terminated; empty when nothing is pending. Resets the
  // buffer.
  std::string finish() {
    if (pending_.empty()) return {};
    std::string out = prefix_ + last_redraw(pending_) + '\n';
    pending_.clear();
    set_status({});
    return out;
  }

  const std::string& prefix() const noexcept { return prefix_; }

 private:
  // The text after the last '\r' of a line (a trailing "\r" of a CRLF line ignored), without
  // "\x1b[K".
  static std::string last_redraw(std::string_view line) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (const std::size_t cr = line.rfind('\r'); cr != std::string_view::npos)
      line.remove_prefix(cr + 1);
    std::string out(line);
    for (std::size_t at; (at = out.find("\x1b[K")) != std::string::npos;) out.erase(at, 3);
    return out;
  }
  void set_status(std::string s) {
    if (s == status_) return;
    status_ = std::move(s);
    status_changed_ = true;
  }

  std::string prefix_;
  std::size_t max_line_;
  // bytes after the last '\n' seen (from the last '\r' on, when there is one)
  std::string pending_;
  std::string status_;  // prefixed status line; empty: none
  bool status_changed_ = false;
};

}  // namespace ddp::launch
