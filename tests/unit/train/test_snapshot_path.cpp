// train::prepare_snapshot_path: a snapshot path whose directory cannot be made or written is an IoError that
// names the flag, the rank and the cause (docs/decisions/0066). Before, save_snapshot_on_rank0 let through
// std::filesystem's "filesystem error: cannot create directories: Not a directory [<dir>]", with no rank and no
// flag, at the end of the first epoch.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>
#include <unistd.h>

#include <ddp/train/snapshot_io.hpp>
#include <filesystem>
#include <fstream>
#include <string>

namespace test_snapshot_path {
namespace fs = std::filesystem;

struct TempDir {
  fs::path dir = fs::temp_directory_path() / ("ddp_snapshot_path_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(dir); }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};
}  // namespace test_snapshot_path

TEST_SUITE("train") {
  TEST_CASE("prepare_snapshot_path: a directory that is a file names the flag, the rank and the file") {
    using namespace test_snapshot_path;
    TempDir tmp;
    const std::string file = (tmp.dir / "runs").string();
    std::ofstream(file) << "not a directory";
    const std::string path = file + "/a/snapshot.safetensors";
    CHECK_THROWS_WITH_AS(ddp::train::prepare_snapshot_path(path, "--snapshot_path", 0, 2),
                         ("ddp[rank 0/2]: --snapshot_path '" + path + "': cannot create its directory '" + file +
                          "/a': '" + file + "' is a file, not a directory. Give --snapshot_path a file in a writable "
                          "directory.").c_str(),
                         ddp::IoError);
    // Only rank 0 writes snapshots: other ranks do not look.
    CHECK_NOTHROW(ddp::train::prepare_snapshot_path(path, "--snapshot_path", 1, 2));
    // Without a flag (save_snapshot_on_rank0's own call) the message says "the snapshot path".
    CHECK_THROWS_WITH_AS(ddp::train::prepare_snapshot_path(path, {}, 0, 1),
                         doctest::Contains("ddp[rank 0/1]: the snapshot path '"), ddp::IoError);
  }

  TEST_CASE("prepare_snapshot_path: a filesystem that refuses the directory gives its reason") {
    // /proc refuses every new directory (ENOENT), as a read-only filesystem refuses it with EROFS.
    CHECK_THROWS_WITH_AS(
        ddp::train::prepare_snapshot_path("/proc/ddp_no_such_dir/s.safetensors", "--model_dir/--model_filename", 0, 4),
        "ddp[rank 0/4]: --model_dir/--model_filename '/proc/ddp_no_such_dir/s.safetensors': cannot create its "
        "directory '/proc/ddp_no_such_dir': No such file or directory. Give --model_dir/--model_filename a file in a "
        "writable directory.",
        ddp::IoError);
  }

  TEST_CASE("prepare_snapshot_path: a missing directory is made") {
    using namespace test_snapshot_path;
    TempDir tmp;
    const fs::path dir = tmp.dir / "x" / "y";
    ddp::train::prepare_snapshot_path((dir / "s.safetensors").string(), "--snapshot_path", 0, 2);
    CHECK(fs::is_directory(dir));
  }
}
