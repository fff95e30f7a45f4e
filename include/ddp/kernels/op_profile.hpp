// OpTimeline and OpProfile: the host side of the per-op-class GPU time profile (--profile of
// bench_resnet_gpu): which op class the device runs between consecutive timing events, and the
// milliseconds per class summed over steps. Plain C++, so its bookkeeping is tested without a GPU.
// SPDX-License-Identifier: MIT
//
// Every scope boundary records one device event (begin, phase, end); for each event i the timeline
// keeps the label of the work between events i and i + 1: the innermost open scope's class, plus
// ".<phase>" once a phase was named inside it. Time is exclusive: a nested scope takes its time out
// of the outer one, whose label resumes at the inner end. Work outside every scope is kUnscoped.
// The device side measures the gaps between consecutive events and hands them to OpProfile::add.
// Example: begin("conv") e0, phase("fprop.cudnn") e1, end() e2, begin("bn_forward", "stats") e3,
// end() e4 gives "conv" e0->e1, "conv.fprop.cudnn" e1->e2, kUnscoped e2->e3, "bn_forward.stats"
// e3->e4. Labels must be string literals (stored as pointers: no allocation per event).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::kernels {

inline constexpr const char* kUnscoped = "(unscoped)";

// The labels of one stretch of recorded events (one profiled step or several).
class OpTimeline {
 public:
  // Each returns the index of the event the caller records now.
  std::size_t begin(const char* cls, const char* phase = nullptr) {
    open_.push_back({cls, phase});
    return mark(true);
  }
  // Names the innermost open scope's phase from here on; false (nothing recorded) if none is open.
  bool phase(const char* phase) {
    if (open_.empty()) return false;
    open_.back().phase = phase;
    mark(true);
    return true;
  }
  std::size_t end() {
    if (open_.empty())
      throw ValueError("ddp: OpTimeline::end without an open scope (an OpScope closed twice?)");
    open_.pop_back();
    return mark(false);  // the outer scope resumes: not a new call of it
  }
  std::size_t events() const noexcept { return marks_.size(); }
  std::size_t open_scopes() const noexcept { return open_.size(); }
  // The label of the work between event i and event i + 1.
  std::string label(std::size_t i) const {
    const Mark& m = marks_.at(i);
    if (!m.cls) return kUnscoped;
    return m.phase ? ddp::detail::str(m.cls, '.', m.phase) : std::string(m.cls);
  }
  // Whether event i starts a call of its label (begin, phase), not a resume after a nested scope.
  bool starts_call(std::size_t i) const { return marks_.at(i).entered; }
  // Forgets the events; the open scopes stay open (a new stretch starts inside them).
  void clear() noexcept { marks_.clear(); }

 private:
  struct Open {
    const char* cls;
    const char* phase;
  };
  struct Mark {
    const char* cls;    // nullptr: outside every scope
    const char* phase;  // nullptr: no phase named yet
    bool entered;
  };
  std::size_t mark(bool entered) {
    const Open top = open_.empty() ? Open{nullptr, nullptr} : open_.back();
    marks_.push_back({top.cls, top.phase, entered && top.cls});
    return marks_.size() - 1;
  }
  std::vector<Open> open_;
  std::vector<Mark> marks_;
};

// Milliseconds and calls per label, summed over the timelines added, with the steps they cover.
class OpProfile {
 public:
  struct Entry {
    std::string label;
    double ms = 0.0;
    std::int64_t calls = 0;
  };

  // gaps_ms[i]: the device time from event i to event i + 1 of `t` (t.events() - 1 values);
  // `steps`: how many training steps the timeline covers.
  void add(const OpTimeline& t, std::span<const double> gaps_ms, int steps) {
    if (t.events() == 0) return;
    if (gaps_ms.size() + 1 != t.events())
      throw ValueError(ddp::detail::str("ddp: OpProfile::add: ", gaps_ms.size(), " times for ",
                                        t.events(),
                                        " events (expected one per pair of consecutive events)"));
    for (std::size_t i = 0; i < gaps_ms.size(); ++i) {
      Entry& e = by_label_[t.label(i)];
      e.ms += gaps_ms[i];
      e.calls += t.starts_call(i) ? 1 : 0;
      total_ms_ += gaps_ms[i];
    }
    steps_ += steps;
  }
  int steps() const noexcept { return steps_; }
  double total_ms() const noexcept { return total_ms_; }

  // Every label, most time first.
  std::vector<Entry> entries() const {
    std::vector<Entry> v;
    for (const auto& [label, e] : by_label_) v.push_back({label, e.ms, e.calls});
    std::stable_sort(v.begin(), v.end(),
                     [](const Entry& a, const Entry& b) { return a.ms > b.ms; });
    return v;
  }

  // {"steps": S, "ms_per_step": total, "classes": {"<label>": {"ms_per_step": m,
  //  "calls_per_step": c, "share": m / total}, ...}}, classes most time first.
  std::string json() const {
    const double s = std::max(1, steps_);
    std::string out = ddp::detail::str("{\"steps\":", steps_,
                                       ",\"ms_per_step\":", num(total_ms_ / s), ",\"classes\":{");
    bool first = true;
    for (const Entry& e : entries()) {
      out += ddp::detail::str(first ? "" : ",", '"', escaped(e.label),
                              "\":{\"ms_per_step\":", num(e.ms / s),
                              ",\"calls_per_step\":", num(static_cast<double>(e.calls) / s),
                              ",\"share\":", num(total_ms_ > 0 ? e.ms / total_ms_ : 0.0), '}');
      first = false;
    }
    return out + "}}";
  }

  // A fixed-width table, one class a line, most time first, e.g.
  //   op class                         ms/step  calls/step  share
  //   conv.wgrad.cudnn                  21.340        53.0  24.1%
  std::string table() const {
    const double s = std::max(1, steps_);
    std::string out = ddp::detail::str(pad("op class", 36), pad_left("ms/step", 10),
                                       pad_left("calls/step", 12), pad_left("share", 8), '\n');
    for (const Entry& e : entries())
      out += ddp::detail::str(
          pad(e.label, 36), pad_left(fixed(e.ms / s, 3), 10),
          pad_left(fixed(static_cast<double>(e.calls) / s, 1), 12),
          pad_left(fixed(total_ms_ > 0 ? 100.0 * e.ms / total_ms_ : 0.0, 1) + "%", 8), '\n');
    out += ddp::detail::str(pad("total", 36), pad_left(fixed(total_ms_ / s, 3), 10), '\n');
    return out;
  }

 private:
  static std::string num(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return buf;
  }
  static std::string fixed(double v, int digits) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.*f", digits, v);
    return buf;
  }
  static std::string pad(const std::string& s, std::size_t w) {
    return s.size() >= w ? s + ' ' : s + std::string(w - s.size(), ' ');
  }
  static std::string pad_left(const std::string& s, std::size_t w) {
    return s.size() >= w ? ' ' + s : std::string(w - s.size(), ' ') + s;
  }
  static std::string escaped(const std::string& s) {
    std::string o;
    for (char c : s) {
      if (c == '"' || c == '\\') o += '\\';
      o += c;
    }
    return o;
  }
  std::map<std::string, Entry> by_label_;
  double total_ms_ = 0.0;
  int steps_ = 0;
};

}  // namespace ddp::kernels
