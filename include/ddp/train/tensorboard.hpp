// TensorBoard event files of scalars, written without a protobuf library (docs/decisions/0040).
// SPDX-License-Identifier: MIT
//
//   ddp::train::TensorBoardWriter tb("runs/resnet18");     // creates the directory; "": disabled
//   tb.add_scalars(120, {{"loss", 2.31f}, {"lr", 0.1f}});  // one Event at step 120, two values
//   -> runs/resnet18/events.out.tfevents.1764000000.host.4242, read by `tensorboard --logdir runs`
//
// The file is a sequence of TFRecords (tensorflow's record_writer.cc), all little-endian:
//   uint64 length | uint32 masked_crc32c(length's 8 bytes) | data[length]
//   | uint32 masked_crc32c(data)
// each record's data one serialised tensorflow.Event (tensorflow/core/util/event.proto):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }      Value { string tag = 1; float simple_value = 2; }
// The first record carries file_version "brain.Event:2" (TensorBoard checks the format by it),
// each later one a Summary of simple values. Only these five fields are written, so their wire
// encoding is spelled out below. Records reach the file every `flush_every` events, at the first
// add `flush_interval` after the last flush, on flush() and on close()/destruction, so a clean exit
// (or an exception unwinding the loop) loses nothing and a crash at most the last few seconds.
// POSIX (gethostname, getpid) for the file name.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <unistd.h>

#include "ddp/core/crc32c.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::train {

// One named value of a step: TensorBoard's simple_value is a float.
struct Scalar {
  std::string tag;
  float value = 0.0f;
};

namespace tfevents {

// Protobuf wire types (protobuf.dev/programming-guides/encoding).
enum class Wire : std::uint8_t { Varint = 0, Fixed64 = 1, Bytes = 2, Fixed32 = 5 };

inline void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
inline void put_tag(std::string& out, std::uint32_t field, Wire w) {
  put_varint(out, (std::uint64_t{field} << 3) | static_cast<std::uint8_t>(w));
}
template <class U>
void put_le(std::string& out, U v) {  // U: uint32_t or uint64_t
  for (std::size_t i = 0; i < sizeof(U); ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
inline void put_double(std::string& out, std::uint32_t field, double v) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  put_tag(out, field, Wire::Fixed64);
  put_le(out, bits);
}
inline void put_float(std::string& out, std::uint32_t field, float v) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  put_tag(out, field, Wire::Fixed32);
  put_le(out, bits);
}
// int64 is a plain varint of the two's complement (a negative step takes 10 bytes).
inline void put_int64(std::string& out, std::uint32_t field, std::int64_t v) {
  put_tag(out, field, Wire::Varint);
  put_varint(out, static_cast<std::uint64_t>(v));
}
inline void put_bytes(std::string& out, std::uint32_t field, std::string_view bytes) {
  put_tag(out, field, Wire::Bytes);
  put_varint(out, bytes.size());
  out.append(bytes);
}

inline constexpr std::string_view kFileVersion = "brain.Event:2";

// The serialised Event: file_version (the first record of a file) or a Summary of `scalars`; step 0
// and an empty summary are omitted as proto3 omits defaults.
inline std::string encode_event(double wall_time, std::int64_t step, std::string_view file_version,
                                std::span<const Scalar> scalars) {
  std::string event;
  put_double(event, 1, wall_time);
  if (step != 0) put_int64(event, 2, step);
  if (!file_version.empty()) put_bytes(event, 3, file_version);
  if (!scalars.empty()) {
    std::string summary;
    for (const Scalar& s : scalars) {
      std::string value;
      put_bytes(value, 1, s.tag);
      put_float(value, 2, s.value);
      put_bytes(summary, 1, value);
    }
    put_bytes(event, 5, summary);
  }
  return event;
}

// One TFRecord around `data`: length, masked CRC32C of the length, data, masked CRC32C of the data.
inline std::string frame_record(std::string_view data) {
  std::string rec;
  rec.reserve(data.size() + 16);
  put_le(rec, static_cast<std::uint64_t>(data.size()));
  const auto as_bytes = [](std::string_view s) {
    return std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(s.data()), s.size());
  };
  put_le(rec, masked_crc32c(as_bytes(rec)));
  rec.append(data);
  put_le(rec, masked_crc32c(as_bytes(data)));
  return rec;
}

// events.out.tfevents.<10-digit unix time>.<hostname>.<pid>: TensorBoard lists files whose name
// contains "tfevents", ordered by that time; the pid (as torch's SummaryWriter adds) keeps apart
// two writers started in the same second.
inline std::string event_file_name(std::time_t unix_time) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  char time_digits[32];
  std::snprintf(time_digits, sizeof time_digits, "%010lld", static_cast<long long>(unix_time));
  return ddp::detail::str("events.out.tfevents.", time_digits, '.', host, '.', ::getpid());
}

inline double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace tfevents

struct TensorBoardOptions {
  std::size_t flush_every = 32;                    // events buffered before they are written
  std::chrono::milliseconds flush_interval{2000};  // or this long after the last write
};

class TensorBoardWriter {
 public:
  TensorBoardWriter() = default;  // disabled: every call is a no-op
  // Creates `dir` (and parents) and a new event file in it; IoError if either fails. "": disabled.
  explicit TensorBoardWriter(const std::string& dir, TensorBoardOptions o = {}) : o_(o) {
    if (dir.empty()) return;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec)
      throw IoError(ddp::detail::str("ddp: cannot create the TensorBoard directory ",
                                     ddp::detail::quoted(dir), ": ", ec.message(),
                                     "; pass a writable --tensorboard-dir"));
    const double now = tfevents::unix_seconds();
    path_ = (std::filesystem::path(dir) / tfevents::event_file_name(static_cast<std::time_t>(now)))
                .string();
    out_.open(path_, std::ios::binary | std::ios::trunc);
    if (!out_)
      throw IoError(ddp::detail::str("ddp: cannot create the TensorBoard event file ",
                                     ddp::detail::quoted(path_),
                                     "; check that --tensorboard-dir is writable"));
    append(tfevents::encode_event(now, 0, tfevents::kFileVersion, {}));
    flush();  // the file is valid (and TensorBoard lists the run) before the first step
  }
  TensorBoardWriter(TensorBoardWriter&&) = default;
  TensorBoardWriter& operator=(TensorBoardWriter&& o) noexcept {
    if (this != &o) {
      close_quietly();
      o_ = o.o_;
      path_ = std::move(o.path_);
      out_ = std::move(o.out_);
      pending_ = std::move(o.pending_);
      pending_events_ = o.pending_events_;
      last_flush_ = o.last_flush_;
    }
    return *this;
  }
  ~TensorBoardWriter() { close_quietly(); }

  bool enabled() const noexcept { return out_.is_open(); }
  const std::string& path() const noexcept { return path_; }  // the event file ("" when disabled)

  // One Event at `step` holding every scalar (TensorBoard draws one curve per tag). wall_time:
  // seconds since the Unix epoch, now by default.
  void add_scalars(std::int64_t step, std::span<const Scalar> scalars,
                   double wall_time = tfevents::unix_seconds()) {
    if (!enabled() || scalars.empty()) return;
    append(tfevents::encode_event(wall_time, step, {}, scalars));
    if (pending_events_ >= o_.flush_every ||
        std::chrono::steady_clock::now() - last_flush_ >= o_.flush_interval)
      flush();
  }
  void add_scalars(std::int64_t step, std::initializer_list<Scalar> scalars) {
    add_scalars(step, std::span<const Scalar>(scalars.begin(), scalars.size()));
  }
  void add_scalar(std::string tag, float value, std::int64_t step) {
    const Scalar s{.tag = std::move(tag), .value = value};
    add_scalars(step, std::span<const Scalar>(&s, 1));
  }

  // Writes the buffered records through to the file; IoError if the write fails (disk full).
  void flush() {
    if (!enabled()) return;
    out_.write(pending_.data(), static_cast<std::streamsize>(pending_.size()));
    out_.flush();
    if (!out_)
      throw IoError(ddp::detail::str("ddp: writing the TensorBoard event file ",
                                     ddp::detail::quoted(path_),
                                     " failed; check the disk has space"));
    pending_.clear();
    pending_events_ = 0;
    last_flush_ = std::chrono::steady_clock::now();
  }
  // Flushes and closes; later calls are no-ops.
  void close() {
    if (!enabled()) return;
    flush();
    out_.close();
  }

 private:
  void append(const std::string& event) {
    pending_ += tfevents::frame_record(event);
    ++pending_events_;
  }
  void close_quietly() noexcept {
    try {
      close();
    } catch (...) {  // a destructor must not throw; the records flushed before stay readable
    }
  }

  TensorBoardOptions o_;
  std::string path_;
  std::ofstream out_;
  std::string pending_;  // framed records not yet written
  std::size_t pending_events_ = 0;
  std::chrono::steady_clock::time_point last_flush_ = std::chrono::steady_clock::now();
};

}  // namespace ddp::train
