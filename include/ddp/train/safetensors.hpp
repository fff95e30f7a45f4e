// Reading and writing safetensors files (the format of Hugging Face's `safetensors` package): names
// -> (dtype, shape, little-endian bytes) plus string metadata. Checkpoints and PyTorch interop go
// through it.
// SPDX-License-Identifier: MIT
//
// File layout:
//   bytes [0, 8)        N, the header length, unsigned 64-bit little-endian
//   bytes [8, 8 + N)    JSON header, UTF-8, padded with spaces so that 8 + N is a multiple of 8:
//     {"__metadata__": {"epoch": "3"},
//      "fc.bias":   {"dtype": "F32", "shape": [10],    "data_offsets": [0, 40]},
//      "fc.weight": {"dtype": "F32", "shape": [10, 4], "data_offsets": [40, 200]}}
//   bytes [8 + N, end)  the data section; data_offsets are [begin, end) byte offsets from its start
// Example: a 200-byte data section and a 170-byte header JSON padded to N = 176 make a 384-byte
// file; "fc.weight" lives at file bytes [224, 384).
//
// Validation on read follows the reference implementation: the header length must fit in the file
// (and under kMaxHeaderBytes), the header must be a JSON object without duplicate names, every
// entry needs a known dtype, a shape of non-negative integers and offsets with begin <= end, shape
// * dtype size must equal end - begin, and the entries sorted by begin must tile the data section
// exactly (no gap, no overlap, no trailing bytes). Any violation is an IoError naming the file and
// the tensor; nothing is allocated before the file is known to back the sizes.
// Writing: train/safetensors_writer.hpp. Builds only on little-endian hosts (x86, ARM).
#pragma once

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ddp/core/dtype.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::train {

static_assert(
    std::endian::native == std::endian::little,
    "ddp: safetensors I/O writes host bytes as little-endian; big-endian hosts are not supported");

// The reference implementation's limit: a corrupt length must not become a 16 EiB allocation.
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorInfo {
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // byte offset of the first element, relative to the data section
  std::uint64_t end = 0;    // one past the last byte

  std::uint64_t numel() const {
    std::uint64_t n = 1;
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    return n;
  }
  std::uint64_t nbytes() const { return end - begin; }
};

struct TensorEntry {
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> data;  // numel * dtype_size bytes, little-endian

  std::uint64_t numel() const {
    std::uint64_t n = 1;
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    return n;
  }
  // The elements as T; throws ValueError when T does not match the stored dtype.
  template <class T>
  std::vector<T> as() const {
    if (dtype_of<T> != dtype)
      throw ValueError(ddp::detail::str(
          "ddp: tensor holds ", dtype_name(dtype), " but was read as ", dtype_name(dtype_of<T>),
          "; convert explicitly or read it with the matching element type."));
    std::vector<T> out(data.size() / sizeof(T));
    if (!data.empty()) std::memcpy(out.data(), data.data(), data.size());
    return out;
  }
};

// A whole file read into memory. `order` lists the tensor names by data offset (the file's order).
struct SafetensorsFile {
  std::map<std::string, TensorEntry> tensors;
  std::map<std::string, std::string> metadata;
  std::vector<std::string> order;

  bool contains(const std::string& name) const { return tensors.count(name) != 0; }
  // Throws IoError naming the missing tensor and a few that exist.
  const TensorEntry& at(const std::string& name) const;
};

// The inverse of dtype_name(); nullopt for names ddp has no type for (BOOL, I8, I16, U16, U32,
// U64, F8_*) and for garbage.
inline std::optional<DType> parse_dtype_name(std::string_view s) {
  for (DType t :
       {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8})
    if (dtype_name(t) == s) return t;
  return std::nullopt;
}

namespace detail {

inline IoError st_error(std::string_view path, std::string_view what) {
  return IoError(ddp::detail::str("ddp: safetensors file '", path, "': ", what));
}

inline std::string shape_str(const std::vector<std::int64_t>& shape) {
  return ddp::detail::str('[', ddp::detail::join(shape, ", "), ']');
}

// Checks one header entry and returns its TensorInfo; `data_bytes` is the size of the data section.
inline TensorInfo parse_entry(std::string_view path, const std::string& name,
                              const nlohmann::json& j) {
  auto bad = [&](std::string_view what) {
    return st_error(path, ddp::detail::str("tensor '", name, "': ", what));
  };
  if (!j.is_object())
    throw bad("header entry is not a JSON object; the file is corrupt or not safetensors");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!j.contains(key))
      throw bad(ddp::detail::str("header entry has no \"", key, "\"; the file is corrupt"));
  const auto& jd = j["dtype"];
  if (!jd.is_string()) throw bad("\"dtype\" is not a string");
  auto dtype = parse_dtype_name(jd.get_ref<const std::string&>());
  if (!dtype)
    throw bad(ddp::detail::str("dtype ", ddp::detail::quoted(jd.get_ref<const std::string&>()),
                               " is not supported (ddp reads F32, F64, BF16, F16, I32, I64, U8)"));
  TensorInfo info{.dtype = *dtype};
  const auto& js = j["shape"];
  if (!js.is_array()) throw bad("\"shape\" is not an array");
  // numel * dtype_size must not overflow: bound it by 2^62 as we go.
  std::uint64_t bytes = dtype_size(*dtype);
  constexpr std::uint64_t kLimit = std::uint64_t{1} << 62;
  for (const auto& d : js) {
    if (!d.is_number_unsigned())
      throw bad(ddp::detail::str("shape ", js.dump(), " holds a non-integer or negative size"));
    auto v = d.get<std::uint64_t>();
    if (v > kLimit) throw bad(ddp::detail::str("shape ", js.dump(), " is too large"));
    info.shape.push_back(static_cast<std::int64_t>(v));
    if (v != 0 && bytes > kLimit / v)
      throw bad(ddp::detail::str("shape ", js.dump(), " is too large"));
    bytes *= v;
  }
  const auto& jo = j["data_offsets"];
  if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() ||
      !jo[1].is_number_unsigned())
    throw bad(ddp::detail::str("\"data_offsets\" ", jo.dump(),
                               " is not a pair of non-negative integers"));
  info.begin = jo[0].get<std::uint64_t>();
  info.end = jo[1].get<std::uint64_t>();
  if (info.end < info.begin)
    throw bad(
        ddp::detail::str("data_offsets [", info.begin, ", ", info.end, "] end before they begin"));
  if (info.end - info.begin != bytes)
    throw bad(ddp::detail::str("shape ", shape_str(info.shape), " x ", dtype_name(*dtype),
                               " needs ", bytes, " bytes but data_offsets [", info.begin, ", ",
                               info.end, "] hold ", info.end - info.begin));
  return info;
}

// Parses and validates a header. `data_bytes`: size of the data section (file size - 8 - N).
inline void parse_header(std::string_view path, std::string_view header, std::uint64_t data_bytes,
                         std::map<std::string, TensorInfo>& tensors,
                         std::map<std::string, std::string>& metadata,
                         std::vector<std::string>& order) {
  // nlohmann::json silently keeps the last duplicate; a parser callback sees every top-level key.
  std::set<std::string> seen;
  std::string duplicate;
  auto cb = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    if (ev == nlohmann::json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      if (!seen.insert(parsed.get<std::string>()).second && duplicate.empty())
        duplicate = parsed.get<std::string>();
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header.begin(), header.end(), cb);
  } catch (const nlohmann::json::exception& e) {
    throw st_error(
        path, ddp::detail::str("the ", header.size(), "-byte header is not valid JSON (", e.what(),
                               "); the file is corrupt or not a safetensors file"));
  }
  if (!j.is_object())
    throw st_error(path, "the header is not a JSON object; this is not a safetensors file");
  if (!duplicate.empty())
    throw st_error(path, ddp::detail::str("tensor '", duplicate,
                                          "' appears twice in the header; the file is corrupt"));
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object())
        throw st_error(path, "\"__metadata__\" is not a JSON object of strings");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string())
          throw st_error(path,
                         ddp::detail::str("metadata '", m.key(), "' is ", m.value().dump(),
                                          ", not a string (safetensors metadata is str -> str)"));
        metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    tensors.emplace(it.key(), parse_entry(path, it.key(), it.value()));
  }
  // The entries sorted by begin must tile [0, data_bytes) exactly.
  std::vector<std::pair<std::uint64_t, std::string>> by_offset;
  by_offset.reserve(tensors.size());
  for (const auto& [name, info] : tensors) by_offset.emplace_back(info.begin, name);
  std::sort(by_offset.begin(), by_offset.end(), [&](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first < b.first;
    // empty tensors first at the same offset
    return tensors.at(a.second).end < tensors.at(b.second).end;
  });
  std::uint64_t expected = 0;
  std::string prev;
  for (const auto& [begin, name] : by_offset) {
    const auto& info = tensors.at(name);
    if (begin < expected)
      throw st_error(
          path, ddp::detail::str("tensor '", name, "': data_offsets [", info.begin, ", ", info.end,
                                 "] overlap tensor '", prev, "' (which ends at ", expected,
                                 "); the file is corrupt"));
    if (begin > expected)
      throw st_error(path, ddp::detail::str("tensor '", name, "': data_offsets [", info.begin, ", ",
                                            info.end, "] leave a gap: the previous tensor ends at ",
                                            expected, "; the file is corrupt"));
    if (info.end > data_bytes)
      throw st_error(path, ddp::detail::str("tensor '", name, "': data_offsets [", info.begin, ", ",
                                            info.end, "] run past the data section of ", data_bytes,
                                            " bytes; the file is truncated"));
    expected = info.end;
    prev = name;
    order.push_back(name);
  }
  if (expected != data_bytes)
    throw st_error(
        path, ddp::detail::str("the tensors cover ", expected, " bytes but the data section holds ",
                               data_bytes, "; the file has trailing garbage or a wrong header"));
}

// A 64-bit hash against corruption (not an adversary): four lanes of multiply-xorshift over 8-byte
// words (a ~90 MB ResNet-18 snapshot in tens of ms). Any single flipped bit changes it. Tensors are
// hashed one by one and chained (chain_hash()): the reader needs no copy of the data section.
inline std::uint64_t hash_bytes(std::span<const std::uint8_t> b) {
  constexpr std::uint64_t kMul = 0x9E3779B97F4A7C15ull;
  std::uint64_t lane[4] = {0x243F6A8885A308D3ull, 0x13198A2E03707344ull, 0xA4093822299F31D0ull,
                           0x082EFA98EC4E6C89ull};
  auto mix = [](std::uint64_t h, std::uint64_t w) {
    h = (h ^ w) * kMul;
    return h ^ (h >> 29);
  };
  std::size_t i = 0;
  for (; i + 32 <= b.size(); i += 32)
    for (int k = 0; k < 4; ++k) {
      std::uint64_t w;
      std::memcpy(&w, b.data() + i + 8 * static_cast<std::size_t>(k), 8);
      lane[k] = mix(lane[k], w);
    }
  std::uint64_t h = mix(mix(mix(lane[0], lane[1]), lane[2]), lane[3]);
  for (; i < b.size(); ++i) h = mix(h, b[i] | (std::uint64_t{1} << 8));  // tail bytes, one by one
  return mix(h, b.size());
}

inline std::uint64_t chain_hash(std::uint64_t running, std::uint64_t next) {
  std::uint64_t h = (running ^ next) * 0xC2B2AE3D27D4EB4Full;
  return h ^ (h >> 31);
}

inline std::uint64_t read_u64_le(const std::uint8_t* p) {
  std::uint64_t v = 0;
  std::memcpy(&v, p, 8);
  return v;
}

// Validates the 8-byte prefix against the file size and returns N.
inline std::uint64_t check_header_length(std::string_view path, std::uint64_t n,
                                         std::uint64_t file_bytes) {
  if (n > kMaxHeaderBytes)
    throw st_error(path,
                   ddp::detail::str("header length ", n, " exceeds the limit of ", kMaxHeaderBytes,
                                    " bytes; the file is corrupt or not a safetensors file"));
  if (n > file_bytes - 8)
    throw st_error(path,
                   ddp::detail::str("header length ", n, " runs past the end of the ", file_bytes,
                                    "-byte file; the file is truncated or not a safetensors file"));
  if (n < 2)
    throw st_error(path, ddp::detail::str("header length ", n, " is too small for a JSON object"));
  return n;
}

// Returns the size; IoError if missing, not a regular file (a directory, a FIFO) or unreadable.
inline std::uint64_t open_for_read(const std::string& path, std::ifstream& in) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
    throw st_error(path,
                   "is not a regular file (a directory?); check the path (the program's snapshot "
                   "or weights file flag)");
  in.open(path, std::ios::binary | std::ios::ate);
  if (!in)
    throw st_error(
        path, ddp::detail::str("cannot open it for reading (", std::strerror(errno),
                               "); check the path (the program's snapshot or weights file flag)"));
  const auto size = in.tellg();
  if (size < 0) throw st_error(path, "cannot determine its size; is it a regular file?");
  in.seekg(0);
  return static_cast<std::uint64_t>(size);
}

}  // namespace detail

inline const TensorEntry& SafetensorsFile::at(const std::string& name) const {
  auto it = tensors.find(name);
  if (it != tensors.end()) return it->second;
  std::vector<std::string> some;
  for (const auto& n : order) {
    if (some.size() == 5) {
      some.push_back("...");
      break;
    }
    some.push_back(n);
  }
  throw IoError(ddp::detail::str("ddp: tensor '", name,
                                 "' is not in the safetensors file (it holds ", tensors.size(),
                                 " tensors: ", ddp::detail::join(some, ", "), ")"));
}

// Parses a whole file held in memory; `source` names it in errors. Throws IoError.
inline SafetensorsFile parse_safetensors(std::span<const std::uint8_t> bytes,
                                         std::string_view source = "<memory>") {
  if (bytes.size() < 8)
    throw detail::st_error(
        source,
        ddp::detail::str("only ", bytes.size(),
                         " bytes, too short for the 8-byte header length; the file is truncated"));
  std::uint64_t n =
      detail::check_header_length(source, detail::read_u64_le(bytes.data()), bytes.size());
  SafetensorsFile f;
  std::map<std::string, TensorInfo> infos;
  std::string_view header(reinterpret_cast<const char*>(bytes.data() + 8),
                          static_cast<std::size_t>(n));
  std::uint64_t data_bytes = bytes.size() - 8 - n;
  detail::parse_header(source, header, data_bytes, infos, f.metadata, f.order);
  const std::uint8_t* data = bytes.data() + 8 + n;
  for (auto& [name, info] : infos) {
    TensorEntry e{.dtype = info.dtype, .shape = std::move(info.shape)};
    e.data.assign(data + info.begin, data + info.end);
    f.tensors.emplace(name, std::move(e));
  }
  return f;
}

// Reads the header, then single tensors on demand straight into caller memory (no copy of the
// whole file). Not thread-safe: one reader per thread. Throws IoError.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(std::string path) : path_(std::move(path)) {
    file_bytes_ = detail::open_for_read(path_, in_);
    if (file_bytes_ < 8)
      throw detail::st_error(
          path_, ddp::detail::str(
                     "only ", file_bytes_,
                     " bytes, too short for the 8-byte header length; the file is truncated"));
    std::uint8_t prefix[8];
    read_at(0, prefix, 8);
    header_bytes_ = detail::check_header_length(path_, detail::read_u64_le(prefix), file_bytes_);
    std::string header(static_cast<std::size_t>(header_bytes_), '\0');
    read_at(8, header.data(), header.size());
    detail::parse_header(path_, header, file_bytes_ - 8 - header_bytes_, tensors_, metadata_,
                         order_);
  }

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::vector<std::string>& order() const { return order_; }  // names by data offset
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }

  const TensorInfo& info(const std::string& name) const {
    auto it = tensors_.find(name);
    if (it == tensors_.end())
      throw detail::st_error(
          path_,
          ddp::detail::str("tensor '", name, "' is not in the file (it holds ", tensors_.size(),
                           " tensors); the checkpoint is for a different model or was written "
                           "by another program"));
    return it->second;
  }

  // Copies the tensor's bytes into `dst`, whose size must equal info(name).nbytes().
  void read_into(const std::string& name, std::span<std::uint8_t> dst) {
    const TensorInfo& i = info(name);
    if (dst.size() != i.nbytes())
      throw ValueError(ddp::detail::str("ddp: safetensors file '", path_, "': tensor '", name,
                                        "' has ", i.nbytes(), " bytes (", dtype_name(i.dtype), ' ',
                                        detail::shape_str(i.shape), ") but the destination holds ",
                                        dst.size()));
    read_at(8 + header_bytes_ + i.begin, dst.data(), dst.size());
  }

  TensorEntry read(const std::string& name) {
    const TensorInfo& i = info(name);
    TensorEntry e{.dtype = i.dtype, .shape = i.shape};
    e.data.resize(static_cast<std::size_t>(i.nbytes()));  // bounded by the file size (validated)
    read_into(name, e.data);
    return e;
  }

 private:
  void read_at(std::uint64_t offset, void* dst, std::size_t n) {
    in_.seekg(static_cast<std::streamoff>(offset));
    in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    if (!in_ || static_cast<std::size_t>(in_.gcount()) != n)
      throw detail::st_error(path_, ddp::detail::str("short read of ", n, " bytes at offset ",
                                                     offset, "; the file changed or is truncated"));
  }

  std::string path_;
  std::ifstream in_;
  std::uint64_t file_bytes_ = 0;
  std::uint64_t header_bytes_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  std::vector<std::string> order_;
};

// Reads a whole file into memory. Throws IoError naming the file (and the tensor) on any defect.
inline SafetensorsFile read_safetensors(const std::string& path) {
  SafetensorsReader r(path);
  SafetensorsFile f;
  f.metadata = r.metadata();
  f.order = r.order();
  for (const auto& name : r.order()) f.tensors.emplace(name, r.read(name));
  return f;
}

// Unvalidated bytes, e.g. for rank 0 to broadcast a snapshot the others parse_safetensors (no
// shared filesystem needed). Throws IoError.
inline std::vector<std::uint8_t> read_file_bytes(const std::string& path) {
  std::ifstream in;
  const auto n = static_cast<std::size_t>(detail::open_for_read(path, in));
  std::vector<std::uint8_t> bytes(n);  // the file's own size
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(n));
  if (!in)
    throw detail::st_error(
        path, ddp::detail::str("short read of ", n, " bytes; the file changed while being read"));
  return bytes;
}

// The same hash as SafetensorsWriter::data_hash, over a file read back (tensors in file order).
inline std::uint64_t data_hash(const SafetensorsFile& f) {
  std::uint64_t h = 0;
  for (const auto& name : f.order)
    h = detail::chain_hash(h, detail::hash_bytes(f.tensors.at(name).data));
  return h;
}

}  // namespace ddp::train
