// Crash-safe file replacement: write `<path>.tmp`, fsync, rename over `<path>`, fsync the
// directory.
// SPDX-License-Identifier: MIT
//
// How it works: the new bytes go to `<path>.tmp`, which is fsync'ed; with keep_previous the current
// `<path>` is hard-linked to `<path>.prev.tmp` and that renamed over `<path>.prev` (so `.prev` is
// always a complete file, the older or the newer one, and `<path>` never disappears); then
// rename(2) atomically swaps `.tmp` in and the directory is fsync'ed so the rename itself is
// durable. A crash at any point leaves `<path>` either the old complete file or the new complete
// file, never a torn one; a failed write removes `.tmp` and leaves `<path>` untouched.
// Example: write_file_atomic("snap.safetensors", {header, data}, {.keep_previous = true}) with an
//   older
// snap.safetensors present leaves snap.safetensors (new) and snap.safetensors.prev (old).
// POSIX only (open/fsync/link/rename), like the rest of ddp's process and socket code.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include <fcntl.h>
#include <unistd.h>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::train {

struct WriteOptions {
  bool keep_previous = false;  // keep the file being replaced as `<path>.prev`
};

namespace detail {

// `what` names the kind of file in messages ("safetensors file", "metrics file").
inline IoError write_error(std::string_view what, std::string_view path, std::string_view step) {
  const int e = errno;
  return IoError(ddp::detail::str("ddp: cannot write ", what, " '", path, "': ", step,
                                  " failed: ", std::strerror(e),
                                  "; check that the directory exists, is writable and has space"));
}

inline void write_all(int fd, std::span<const std::uint8_t> bytes, std::string_view what,
                      std::string_view path, std::string_view tmp) {
  const std::uint8_t* p = bytes.data();
  std::size_t n = bytes.size();
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw write_error(what, path, ddp::detail::str("write('", tmp, "')"));
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

// fsync the directory holding `path` so that a rename survives a crash.
inline void fsync_parent(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) parent = ".";
  const int fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY);
  // some filesystems refuse to open directories; the data itself is already synced
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace detail

// Atomically replaces `path` with the concatenation of `chunks`. Throws IoError naming the path,
// the failed system call and the OS error.
inline void write_file_atomic(const std::string& path,
                              std::span<const std::span<const std::uint8_t>> chunks,
                              const WriteOptions& options = {}, std::string_view what = "file") {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw detail::write_error(what, path, ddp::detail::str("open('", tmp, "')"));
  try {
    for (const auto& c : chunks) detail::write_all(fd, c, what, path, tmp);
    if (::fsync(fd) != 0)
      throw detail::write_error(what, path, ddp::detail::str("fsync('", tmp, "')"));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    auto err = detail::write_error(what, path, ddp::detail::str("close('", tmp, "')"));
    ::unlink(tmp.c_str());
    throw err;
  }
  // Only a regular file is kept as .prev: a directory at `path` must not be moved aside by the
  // rename fallback below; the rename over it then fails with EISDIR, as without keep_previous.
  std::error_code ec;
  if (options.keep_previous && std::filesystem::is_regular_file(path, ec)) {
    const std::string prev = path + ".prev";
    // Every failure here leaves `path` as it was; remove the finished .tmp too, so a full-size copy
    // does not linger next to it.
    auto fail = [&](std::string step) {
      auto err = detail::write_error(what, path, step);
      ::unlink(tmp.c_str());
      return err;
    };
    // `path` is linked to `<path>.prev.tmp`, which is then renamed over `.prev`: a crash at any
    // point leaves a complete `.prev` (the older one until the rename), where unlinking `.prev`
    // first left none for a moment (the fault matrix killed a job in that window).
    const std::string prev_tmp = prev + ".tmp";
    if (::unlink(prev_tmp.c_str()) != 0 && errno != ENOENT)
      throw fail(ddp::detail::str("unlink('", prev_tmp, "')"));
    if (::link(path.c_str(), prev_tmp.c_str()) == 0) {
      if (::rename(prev_tmp.c_str(), prev.c_str()) != 0) {
        auto err = fail(ddp::detail::str("rename('", prev_tmp, "', '", prev, "')"));
        ::unlink(prev_tmp.c_str());
        throw err;
      }
    } else if (::rename(path.c_str(), prev.c_str()) != 0) {
      // Filesystems without hard links: fall back to a rename (brief window without `path`).
      throw fail(ddp::detail::str("rename('", path, "', '", prev, "')"));
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    auto err =
        detail::write_error(what, path, ddp::detail::str("rename('", tmp, "', '", path, "')"));
    ::unlink(tmp.c_str());
    throw err;
  }
  detail::fsync_parent(path);
}

inline void write_file_atomic(const std::string& path,
                              std::initializer_list<std::span<const std::uint8_t>> chunks,
                              const WriteOptions& options = {}, std::string_view what = "file") {
  write_file_atomic(path,
                    std::span<const std::span<const std::uint8_t>>(chunks.begin(), chunks.size()),
                    options, what);
}

}  // namespace ddp::train
