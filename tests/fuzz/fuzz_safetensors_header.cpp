// libFuzzer target: the safetensors reader (train/safetensors.hpp), the code that parses checkpoint and
// snapshot files, which may come from another program, a torn copy or a flipped bit.
// SPDX-License-Identifier: MIT
//
// Input: the bytes of a file. Each input goes through both readers, parse_safetensors (a buffer, the
// snapshot broadcast path) and SafetensorsReader (a file: a memfd, so nothing touches the disk), then
// through load_snapshot_bytes into a tiny model. Besides "no crash, no UB, no leak, no allocation over
// -rss_limit_mb" (ASan/UBSan/libFuzzer; a forged 8-byte header length must not become an allocation) it
// checks the contract:
//   - the only exception is ddp::IoError, with a message (also from load_snapshot_bytes);
//   - both readers agree: the same error message or the same tensors;
//   - on success every tensor holds numel * dtype_size bytes, the tensors in file order tile the data
//     section exactly, and writing the file back (SafetensorsWriter) and parsing it gives the same content.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ddp/nn/linear.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/train/checkpoint.hpp>
#include <ddp/train/safetensors.hpp>
#include <exception>
#include <optional>
#include <span>
#include <string>

namespace train = ddp::train;

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "fuzz_safetensors_header: %s %s\n", what, detail.c_str());
  std::abort();
}

// One in-memory file for the whole run; /proc/self/fd/<fd> is a path SafetensorsReader can open.
struct MemFile {
  int fd = ::memfd_create("fuzz_safetensors", MFD_CLOEXEC);
  std::string path = "/proc/self/fd/" + std::to_string(fd);
  void write(std::span<const std::uint8_t> bytes) {
    if (fd < 0 || ::ftruncate(fd, 0) != 0) fail("memfd:", std::strerror(errno));
    std::size_t done = 0;
    while (done < bytes.size()) {
      const auto n = ::pwrite(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
      if (n <= 0) fail("memfd write:", std::strerror(errno));
      done += static_cast<std::size_t>(n);
    }
  }
};

bool same_entry(const train::TensorEntry& a, const train::TensorEntry& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.data == b.data;
}

bool same_file(const train::SafetensorsFile& a, const train::SafetensorsFile& b) {
  if (a.order != b.order || a.metadata != b.metadata || a.tensors.size() != b.tensors.size()) return false;
  for (const auto& [name, e] : a.tensors) {
    auto it = b.tensors.find(name);
    if (it == b.tensors.end() || !same_entry(e, it->second)) return false;
  }
  return true;
}

void check_parsed(const train::SafetensorsFile& f, std::span<const std::uint8_t> bytes) {
  if (f.order.size() != f.tensors.size()) fail("order and tensors differ in size");
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const std::span<const std::uint8_t> data = bytes.subspan(8 + static_cast<std::size_t>(n));
  std::size_t at = 0;
  for (const auto& name : f.order) {
    const auto& e = f.at(name);
    if (e.data.size() != e.numel() * ddp::dtype_size(e.dtype)) fail("tensor size != numel * dtype size:", name);
    if (at + e.data.size() > data.size() ||
        (!e.data.empty() && std::memcmp(data.data() + at, e.data.data(), e.data.size()) != 0))
      fail("tensor bytes are not the next bytes of the data section:", name);
    at += e.data.size();
  }
  if (at != data.size()) fail("the tensors do not cover the data section");
  (void)train::data_hash(f);

  // Round trip through the writer. The writer refuses the name "" that the reader accepts (as the
  // reference implementation does): that is its documented ValueError, not a defect.
  train::SafetensorsWriter w;
  try {
    for (const auto& name : f.order) {
      const auto& e = f.tensors.at(name);
      w.add(name, e.dtype, e.shape, e.data);
    }
  } catch (const ddp::ValueError& e) {
    if (!f.contains("")) fail("writer refused a parsed file:", e.what());
    return;
  }
  for (const auto& [k, v] : f.metadata) w.set_metadata(k, v);
  const auto again = w.serialize();
  train::SafetensorsFile g;
  try {
    g = train::parse_safetensors(again, "round trip");
  } catch (const ddp::IoError& e) {
    fail("the writer's output does not parse:", e.what());
  }
  if (!same_file(f, g)) fail("round trip changed the content");
}

// Loads the file as a snapshot of Linear(3, 2) with momentum: metadata integers, dtypes and shapes are
// checked against the model. Seeds in the corpus hold valid snapshots of exactly this model.
void try_snapshot(std::span<const std::uint8_t> bytes) {
  ddp::nn::Linear<float, ddp::Cpu> model({.in_features = 3, .out_features = 2});
  ddp::optim::SGD<float, ddp::Cpu> opt(model, {.lr = 0.1, .momentum = 0.9});
  try {
    (void)train::load_snapshot_bytes(bytes, model, opt);
  } catch (const ddp::IoError& e) {
    if (!*e.what()) fail("IoError without a message (snapshot)");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static MemFile file;
  const std::span<const std::uint8_t> bytes(data, size);
  std::optional<train::SafetensorsFile> mem;
  std::string mem_error, file_error;
  try {
    try {
      mem = train::parse_safetensors(bytes, file.path);  // same name in messages as the file reader
    } catch (const ddp::IoError& e) {
      mem_error = e.what();
      if (mem_error.empty()) fail("IoError without a message");
    }
    file.write(bytes);
    std::optional<train::SafetensorsFile> disk;
    try {
      disk = train::read_safetensors(file.path);
    } catch (const ddp::IoError& e) {
      file_error = e.what();
    }
    if (mem.has_value() != disk.has_value())
      fail("the readers disagree:", mem ? "file: " + file_error : "buffer: " + mem_error);
    if (!mem) {
      if (file_error != mem_error) fail("the readers give different errors:", mem_error + " | " + file_error);
      return 0;
    }
    if (!same_file(*mem, *disk)) fail("the readers read different content");
    check_parsed(*mem, bytes);
    try_snapshot(bytes);
  } catch (const std::exception& e) {
    fail("unexpected exception:", e.what());
  }
  return 0;
}
