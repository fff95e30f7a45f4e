// data: one table of bad CIFAR-10 inputs (files of the wrong size or format, missing files and directories,
// corrupt labels, inconsistent options) with the exact error type and message each must give.
// SPDX-License-Identifier: MIT
//
// Every file row names the file and says what to do (--data-dir, which archive to download); every option
// row names the option and its valid range. The reader only reads, so the files are checked to be
// unchanged afterwards too.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <ddp/data/cifar10.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using ddp::data::CifarBinaryDataset;
using ddp::data::CifarOptions;

namespace {

struct BadCifarDir : ddp::test::TempDir {
  BadCifarDir() : ddp::test::TempDir("ddp_bad_cifar_") {}
};

// `records` records of `record_bytes` bytes each: label r % 10, then pixel bytes; `label_of` overrides labels.
void write_records(const std::string& path, int records, int record_bytes = 3073,
                   const std::function<int(int)>& label_of = nullptr) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (int r = 0; r < records; ++r) {
    out.put(static_cast<char>(label_of ? label_of(r) : r % 10));
    for (int i = 1; i < record_bytes; ++i) out.put(static_cast<char>((r * 31 + i) % 256));
  }
}

const std::string kRecordWords = "-byte record (1 label byte + ";
std::string wrong_size(const std::string& path, std::uintmax_t bytes, const std::string& record = "3073",
                       const std::string& layout = "3x32x32") {
  return "ddp: CIFAR-format file '" + path + "' has " + std::to_string(bytes) + " bytes, not a positive multiple of the " +
         record + kRecordWords + layout + " pixel bytes); the file is truncated or in another format";
}

std::string not_there(const std::string& path) {
  return "ddp: CIFAR-10 file '" + path +
         "' does not exist; download https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz, extract it and pass "
         "--data-dir <dir>/cifar-10-batches-bin";
}

}  // namespace

TEST_SUITE("data") {
  TEST_CASE("bad CIFAR-10 inputs: wrong sizes, formats, labels, missing files, bad options (table)") {
    BadCifarDir dir;
    // A complete, valid training set (one record per file) for the option rows.
    for (int k = 1; k <= 5; ++k) write_records(dir.file("data_batch_" + std::to_string(k) + ".bin"), 1);
    const auto train = ddp::data::cifar10_files(dir.path.string(), true);
    REQUIRE(CifarBinaryDataset(train, {}).size() == 5);

    const std::string cut = dir.file("cut.bin"), empty = dir.file("empty.bin"), extra = dir.file("extra.bin"),
                      c100 = dir.file("cifar100_train.bin"), label10 = dir.file("label10.bin"),
                      label255 = dir.file("label255.bin"), missing = dir.file("nope.bin"),
                      a_dir = dir.file("cifar-10-batches-bin"), dangling = dir.file("dangling.bin"),
                      no_batch3 = dir.file("no_batch3"), python = dir.file("cifar-10-batches-py");
    write_records(cut, 2);
    fs::resize_file(cut, 2 * 3073 - 5);
    write_records(empty, 0);
    write_records(extra, 1);
    std::ofstream(extra, std::ios::app).put('\n');  // a stray newline appended
    write_records(c100, 2, 3074);                      // CIFAR-100: coarse + fine label, then 3072 pixels
    write_records(label10, 3, 3073, [](int r) { return r == 2 ? 10 : r; });
    write_records(label255, 2, 3073, [](int r) { return r == 0 ? 255 : 1; });
    fs::create_directories(a_dir);
    fs::create_symlink(dir.file("gone.bin"), dangling);
    fs::create_directories(no_batch3);
    for (int k : {1, 2, 4, 5}) write_records(no_batch3 + "/data_batch_" + std::to_string(k) + ".bin", 1);
    // What `tar xzf cifar-10-python.tar.gz` gives: pickles without the .bin suffix.
    fs::create_directories(python);
    for (const char* f : {"data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5",
                          "test_batch", "batches.meta"})
      std::ofstream(python + "/" + f) << "\x80\x02}q\x00.";

    struct Row {
      const char* name;
      std::function<void()> run;
      std::string message;
      bool value_error = false;  // ValueError (bad options) rather than IoError (bad files)
    };
    auto open = [](std::vector<std::string> files, CifarOptions o = {}) {
      return [files = std::move(files), o] { (void)CifarBinaryDataset(files, o); };
    };
    const std::string digits_layout = "1x8x8";
    const Row rows[] = {
        {"two records cut 5 bytes short", open({cut}), wrong_size(cut, 6141)},
        {"an empty file", open({empty}), wrong_size(empty, 0)},
        {"one record plus a stray newline", open({extra}), wrong_size(extra, 3074)},
        {"a CIFAR-100 binary (3074-byte records)", open({c100}), wrong_size(c100, 6148)},
        {"a CIFAR-10 file read with the 8x8x1 digits format", open({extra}, {.format = {.height = 8, .width = 8,
                                                                                      .channels = 1},
                                                                           .mean = {0.5f}, .std = {0.5f}}),
         wrong_size(extra, 3074, "65", digits_layout)},
        {"label 10 in a 10-class file", open({label10}),
         "ddp: CIFAR-format file '" + label10 +
             "' record 2 has label 10 but the dataset has 10 classes; the file is corrupt or the record format is "
             "wrong"},
        {"label 255 in the first record", open({label255}),
         "ddp: CIFAR-format file '" + label255 +
             "' record 0 has label 255 but the dataset has 10 classes; the file is corrupt or the record format is "
             "wrong"},
        {"a missing file", open({missing}),
         "ddp: cannot read CIFAR-format file '" + missing + "': No such file or directory; check --data-dir"},
        {"a directory instead of a file", open({a_dir}),
         "ddp: cannot read CIFAR-format file '" + a_dir + "': Is a directory; check --data-dir"},
        {"a dangling symlink", open({dangling}),
         "ddp: cannot read CIFAR-format file '" + dangling + "': No such file or directory; check --data-dir"},
        {"a good file after a bad one", open({train[0], cut}), wrong_size(cut, 6141)},
        {"--data-dir without test_batch.bin", [&] { (void)ddp::data::cifar10_files(dir.path.string(), false); },
         not_there(dir.file("test_batch.bin"))},
        {"--data-dir without data_batch_3.bin", [&] { (void)ddp::data::cifar10_files(no_batch3, true); },
         not_there(no_batch3 + "/data_batch_3.bin")},
        {"--data-dir of the python version", [&] { (void)ddp::data::cifar10_files(python, true); },
         not_there(python + "/data_batch_1.bin")},
        {"--data-dir that does not exist", [&] { (void)ddp::data::cifar10_files(dir.file("nowhere"), false); },
         not_there(dir.file("nowhere") + "/test_batch.bin")},
        // ---- options ----
        {"one mean for three channels", open(train, {.mean = {0.5f}}),
         "ddp: CIFAR-format dataset has 3 channels but 1 means and 3 standard deviations were given", true},
        {"two stds for three channels", open(train, {.std = {0.2f, 0.2f}}),
         "ddp: CIFAR-format dataset has 3 channels but 3 means and 2 standard deviations were given", true},
        {"std 0", open(train, {.std = {1.0f, 0.0f, 1.0f}}), "ddp: normalisation std 0 must be > 0", true},
        {"negative std", open(train, {.std = {1.0f, 1.0f, -0.5f}}), "ddp: normalisation std -0.5 must be > 0", true},
        {"NaN std", open(train, {.std = {std::nanf(""), 1.0f, 1.0f}}), "ddp: normalisation std nan must be > 0", true},
        {"negative crop padding", open(train, {.crop_padding = -1}), "ddp: crop padding -1 must be >= 0", true},
        {"no files", open({}), "ddp: CifarBinaryDataset needs at least one file", true},
        {"0 classes", open(train, {.format = {.num_classes = 0}}),
         "ddp: CIFAR-format record of 32x32x3 with 0 classes is invalid (extents > 0, 1..256 classes)", true},
        {"257 classes (labels are bytes)", open(train, {.format = {.num_classes = 257}}),
         "ddp: CIFAR-format record of 32x32x3 with 257 classes is invalid (extents > 0, 1..256 classes)", true},
        {"height 0", open(train, {.format = {.height = 0}}),
         "ddp: CIFAR-format record of 0x32x3 with 10 classes is invalid (extents > 0, 1..256 classes)", true},
        {"sample index past the end", [&] { (void)CifarBinaryDataset(train, {}).get(5); },
         "ddp: dataset index 5 is out of range for a dataset of 5 samples; the sampler was built for a different "
         "dataset size",
         true},
    };
    const auto sizes_before = [&] {
      std::vector<std::uintmax_t> s;
      for (const auto& f : {cut, empty, extra, c100, label10, label255}) s.push_back(fs::file_size(f));
      return s;
    };
    const auto before = sizes_before();
    for (const auto& r : rows) {
      const std::string row = r.name;
      CAPTURE(row);
      if (r.value_error)
        CHECK_THROWS_WITH_AS(r.run(), r.message.c_str(), ddp::ValueError);
      else
        CHECK_THROWS_WITH_AS(r.run(), r.message.c_str(), ddp::IoError);
    }
    CHECK(sizes_before() == before);
  }
}
