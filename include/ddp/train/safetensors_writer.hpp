// SafetensorsWriter: collects tensors and metadata, then writes one safetensors file (the format
// and the reader: train/safetensors.hpp).
// SPDX-License-Identifier: MIT
//
// Writing is atomic (train/atomic_file.hpp): the bytes go to `<path>.tmp`, which is fsync'ed and
// renamed over `<path>`, and the directory is fsync'ed, so a reader sees either the old file or the
// new one, never a torn one. With keep_previous the old file stays available as `<path>.prev`. Data
// is written in the order tensors were added; header keys keep that order, `__metadata__` first.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddp/train/atomic_file.hpp"
#include "ddp/train/safetensors.hpp"

namespace ddp::train {

// Collects tensors and metadata, then writes one file. add() copies the bytes; add_view() borrows
// them (the caller keeps them alive until write()). Names must be unique and must not be
// "__metadata__".
class SafetensorsWriter {
 public:
  SafetensorsWriter() = default;
  // items_ point into owned_: copying would alias
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  // moving a vector keeps its buffer, so views stay valid
  SafetensorsWriter(SafetensorsWriter&&) = default;
  SafetensorsWriter& operator=(SafetensorsWriter&&) = default;

  void add(std::string name, DType dtype, std::vector<std::int64_t> shape,
           std::span<const std::uint8_t> bytes) {
    owned_.emplace_back(bytes.begin(), bytes.end());
    add_view(std::move(name), dtype, std::move(shape),
             std::span<const std::uint8_t>(owned_.back()));
  }
  template <class T>
  void add(std::string name, std::vector<std::int64_t> shape, std::span<const T> values) {
    add(std::move(name), dtype_of<T>, std::move(shape),
        std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(values.data()),
                                      values.size_bytes()));
  }
  template <class T>
  void add(std::string name, std::vector<std::int64_t> shape, const std::vector<T>& values) {
    add<T>(std::move(name), std::move(shape), std::span<const T>(values));
  }
  void add_view(std::string name, DType dtype, std::vector<std::int64_t> shape,
                std::span<const std::uint8_t> bytes) {
    if (name == "__metadata__" || name.empty())
      throw ValueError(ddp::detail::str("ddp: ", ddp::detail::quoted(name),
                                        " cannot be a tensor name in a safetensors file"));
    if (!names_.insert(name).second)
      throw ValueError(ddp::detail::str(
          "ddp: tensor '", name, "' was added twice to a safetensors file; names must be unique"));
    std::uint64_t numel = 1;
    for (auto d : shape) {
      if (d < 0)
        throw ValueError(ddp::detail::str("ddp: tensor '", name, "' has a negative size in shape ",
                                          detail::shape_str(shape)));
      numel *= static_cast<std::uint64_t>(d);
    }
    if (numel * dtype_size(dtype) != bytes.size())
      throw ValueError(ddp::detail::str(
          "ddp: tensor '", name, "': shape ", detail::shape_str(shape), " x ", dtype_name(dtype),
          " needs ", numel * dtype_size(dtype), " bytes but ", bytes.size(), " were given"));
    items_.push_back(
        Item{.name = std::move(name), .dtype = dtype, .shape = std::move(shape), .bytes = bytes});
  }
  void set_metadata(std::string key, std::string value) {
    metadata_[std::move(key)] = std::move(value);
  }

  std::size_t size() const { return items_.size(); }

  // detail::hash_bytes of every tensor's bytes chained in file order; data_hash(parse_safetensors(
  // serialize())) gives the same value, so a snapshot can carry it in its metadata.
  std::uint64_t data_hash() const {
    std::uint64_t h = 0;
    for (const auto& it : items_) h = detail::chain_hash(h, detail::hash_bytes(it.bytes));
    return h;
  }

  // The JSON header, already padded with spaces to a multiple of 8 bytes.
  std::string header() const {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    if (!metadata_.empty()) {
      j["__metadata__"] = nlohmann::ordered_json::object();
      for (const auto& [k, v] : metadata_) j["__metadata__"][k] = v;
    }
    std::uint64_t offset = 0;
    for (const auto& it : items_) {
      nlohmann::ordered_json e;
      e["dtype"] = std::string(dtype_name(it.dtype));
      e["shape"] = it.shape;
      e["data_offsets"] = {offset, offset + it.bytes.size()};
      offset += it.bytes.size();
      j[it.name] = std::move(e);
    }
    std::string h = j.dump();
    h.append((8 - h.size() % 8) % 8, ' ');
    return h;
  }

  // The whole file as bytes (for tests, or to broadcast a snapshot without touching disk).
  std::vector<std::uint8_t> serialize() const {
    std::string h = header();
    std::uint64_t n = h.size(), total = 8 + n;
    for (const auto& it : items_) total += it.bytes.size();
    std::vector<std::uint8_t> out(static_cast<std::size_t>(total));
    std::uint8_t* p = out.data();
    std::memcpy(p, &n, 8);
    std::memcpy(p + 8, h.data(), h.size());
    p += 8 + n;
    for (const auto& it : items_) {
      if (!it.bytes.empty()) std::memcpy(p, it.bytes.data(), it.bytes.size());
      p += it.bytes.size();
    }
    return out;
  }

  // Atomically replaces `path` (see the file comment). Throws IoError naming the path and the OS
  // error.
  void write(const std::string& path, const WriteOptions& options = {}) const;

 private:
  struct Item {
    std::string name;
    DType dtype;
    std::vector<std::int64_t> shape;
    std::span<const std::uint8_t> bytes;
  };
  std::vector<Item> items_;
  std::set<std::string> names_;
  std::map<std::string, std::string> metadata_;
  // add()'s copies; vector<vector> keeps inner buffers stable
  std::vector<std::vector<std::uint8_t>> owned_;
};

// Streams the length, the header and every tensor's bytes into write_file_atomic: no staging copy.
inline void SafetensorsWriter::write(const std::string& path, const WriteOptions& options) const {
  const std::string h = header();
  const std::uint64_t n = h.size();
  std::vector<std::span<const std::uint8_t>> chunks;
  chunks.reserve(items_.size() + 2);
  chunks.emplace_back(reinterpret_cast<const std::uint8_t*>(&n), 8);
  chunks.emplace_back(reinterpret_cast<const std::uint8_t*>(h.data()), h.size());
  for (const auto& it : items_) chunks.push_back(it.bytes);
  write_file_atomic(path, chunks, options, "safetensors file");
}

}  // namespace ddp::train
