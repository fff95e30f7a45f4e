// Reader for the CIFAR-10 binary format (and same-layout files of other sizes), with normalisation
// and the tutorials' augmentation (random crop with zero padding + random horizontal flip), seeded.
// SPDX-License-Identifier: MIT
//
// Format (https://www.cs.toronto.edu/~kriz/cifar.html, "binary version"): a sequence of records
//   <1 label byte><C*H*W pixel bytes, channel-major (all R, then G, then B), each H x W row-major>
// CIFAR-10 has C = 3, H = W = 32 (3073-byte records); data_batch_1..5.bin (train) and
// test_batch.bin hold 10000 records each; RecordFormat allows other sizes. Files are read whole at
// construction (CIFAR-10: 180 MB).
//
// get_into() produces channels-last floats: out(y, x, c) = (pixel / 255 - mean[c]) / std[c],
// exactly torchvision's ToTensor + Normalize. With augmentation it first does, like
// RandomCrop(H, padding=p) + RandomHorizontalFlip(): pad with p zero pixels on each side, cut an
// H x W window at (top, left) in [0, 2p] x [0, 2p], then mirror it with probability 1/2. Padding
// pixels become -mean[c] / std[c], as in torchvision. Sample i's choices in epoch e come from one
// Philox block, b = e * N + i, of Generator(seed, 0, kStreamAugment): top = w0 % (2p+1),
// left = w1 % (2p+1), flip = w2 & 1. Example: p = 4, top = 0, left = 8, no flip:
// out(y, x) = in(y - 4, x + 4), zero where y < 4 or x >= 28.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/data/dataset.hpp"
#include "ddp/tensor/random.hpp"

namespace ddp::data {

inline constexpr std::uint32_t kStreamAugment = 256;  // Philox stream of augmentation choices

// The usual CIFAR-10 channel statistics (over the training set, pixels in [0, 1]).
inline const std::vector<float> kCifar10Mean = {0.4914f, 0.4822f, 0.4465f};
inline const std::vector<float> kCifar10Std = {0.2470f, 0.2435f, 0.2616f};
// ImageNet's statistics, which some CIFAR tutorials (e.g. the DDP ResNet one) pass to Normalize.
inline const std::vector<float> kImageNetMean = {0.485f, 0.456f, 0.406f};
inline const std::vector<float> kImageNetStd = {0.229f, 0.224f, 0.225f};

struct RecordFormat {
  std::int64_t height = 32;
  std::int64_t width = 32;
  std::int64_t channels = 3;
  std::int64_t num_classes = 10;
  std::int64_t record_bytes() const { return 1 + channels * height * width; }
};

struct CifarOptions {
  RecordFormat format = {};
  std::vector<float> mean = kCifar10Mean;  // one per channel
  std::vector<float> std = kCifar10Std;    // one per channel
  bool augment = false;                    // random crop + flip (training); off for evaluation
  std::int64_t crop_padding = 4;           // p of RandomCrop(H, padding=p)
  bool horizontal_flip = true;             // with augment: mirror with probability 1/2
  std::uint64_t seed = 0;                  // augmentation seed; must be equal on every rank
};

// The five training files or the test file of an extracted cifar-10-binary.tar.gz
// (`<dir>/data_batch_{1..5}.bin`, `<dir>/test_batch.bin`). Throws IoError for a missing file.
inline std::vector<std::string> cifar10_files(const std::string& dir, bool train) {
  std::vector<std::string> files;
  if (train)
    for (int k = 1; k <= 5; ++k)
      files.push_back(
          (std::filesystem::path(dir) / ddp::detail::str("data_batch_", k, ".bin")).string());
  else
    files.push_back((std::filesystem::path(dir) / "test_batch.bin").string());
  for (const auto& f : files)
    if (!std::filesystem::exists(f))
      throw IoError(ddp::detail::str(
          "ddp: CIFAR-10 file '", f,
          "' does not exist; download "
          "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz, extract it and pass "
          "--data-dir <dir>/cifar-10-batches-bin"));
  return files;
}

class CifarBinaryDataset : public Dataset {
 public:
  // Reads every file. Throws IoError naming the file when it is missing, unreadable, empty, not a
  // whole number of records, or holds a label >= num_classes; ValueError for inconsistent options.
  CifarBinaryDataset(const std::vector<std::string>& files, CifarOptions options = {})
      : o_(std::move(options)) {
    const RecordFormat& f = o_.format;
    if (f.height <= 0 || f.width <= 0 || f.channels <= 0 || f.num_classes <= 0 ||
        f.num_classes > 256)
      throw ValueError(ddp::detail::str("ddp: CIFAR-format record of ", f.height, "x", f.width, "x",
                                        f.channels, " with ", f.num_classes,
                                        " classes is invalid (extents > 0, 1..256 classes)"));
    if (o_.mean.size() != static_cast<std::size_t>(f.channels) ||
        o_.std.size() != static_cast<std::size_t>(f.channels))
      throw ValueError(ddp::detail::str("ddp: CIFAR-format dataset has ", f.channels,
                                        " channels but ", o_.mean.size(), " means and ",
                                        o_.std.size(), " standard deviations were given"));
    for (float s : o_.std)
      if (!(s > 0.0f))
        throw ValueError(ddp::detail::str("ddp: normalisation std ", s, " must be > 0"));
    if (o_.crop_padding < 0)
      throw ValueError(ddp::detail::str("ddp: crop padding ", o_.crop_padding, " must be >= 0"));
    if (files.empty()) throw ValueError("ddp: CifarBinaryDataset needs at least one file");
    // For a byte v: (v / 255 - mean[c]) / std[c] = v * scale[c] + shift[c].
    for (std::size_t k = 0; k < o_.mean.size(); ++k) {
      scale_.push_back(1.0f / (255.0f * o_.std[k]));
      shift_.push_back(-o_.mean[k] / o_.std[k]);
    }
    for (const auto& file : files) load(file);
  }

  std::size_t size() const override { return labels_.size(); }
  ImageShape image_shape() const override {
    return {.height = o_.format.height, .width = o_.format.width, .channels = o_.format.channels};
  }
  std::int64_t num_classes() const override { return o_.format.num_classes; }
  const CifarOptions& options() const { return o_; }
  std::int64_t label(std::size_t index) const { return labels_[index]; }
  // Raw pixel bytes of sample `index`, (C, H, W) as stored.
  std::span<const std::uint8_t> raw(std::size_t index) const {
    const auto n = static_cast<std::size_t>(o_.format.record_bytes() - 1);
    return {pixels_.data() + index * n, n};
  }

  std::int64_t get_into(std::size_t index, std::uint64_t epoch,
                        std::span<float> image) const override {
    const std::int64_t h = o_.format.height, w = o_.format.width, c = o_.format.channels;
    const std::uint8_t* px = raw(index).data();
    std::int64_t top = 0, left = 0, pad = 0;
    bool flip = false;
    if (o_.augment) {
      pad = o_.crop_padding;
      Generator g(o_.seed, 0, kStreamAugment);
      const auto word = g.block(epoch * static_cast<std::uint64_t>(size()) + index);
      const auto choices = static_cast<std::uint32_t>(2 * pad + 1);
      top = static_cast<std::int64_t>(word[0] % choices);
      left = static_cast<std::int64_t>(word[1] % choices);
      flip = o_.horizontal_flip && (word[2] & 1u);
    }
    const float* sc = scale_.data();
    const float* sh = shift_.data();
    float* out = image.data();
    for (std::int64_t y = 0; y < h; ++y) {
      const std::int64_t sy = y + top - pad;
      for (std::int64_t x = 0; x < w; ++x) {
        const std::int64_t sx = (flip ? w - 1 - x : x) + left - pad;
        const bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
        for (std::int64_t k = 0; k < c; ++k) {
          const float v = inside ? static_cast<float>(px[(k * h + sy) * w + sx]) : 0.0f;
          *out++ = v * sc[k] + sh[k];
        }
      }
    }
    return labels_[index];
  }

 private:
  void load(const std::string& file) {
    const std::int64_t rec = o_.format.record_bytes();
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(file, ec);
    if (ec)
      throw IoError(ddp::detail::str("ddp: cannot read CIFAR-format file '", file,
                                     "': ", ec.message(), "; check --data-dir"));
    if (bytes == 0 || bytes % static_cast<std::uintmax_t>(rec) != 0)
      throw IoError(ddp::detail::str("ddp: CIFAR-format file '", file, "' has ", bytes,
                                     " bytes, not a positive multiple of the ", rec,
                                     "-byte record (1 label byte + ", o_.format.channels, "x",
                                     o_.format.height, "x", o_.format.width,
                                     " pixel bytes); the file is truncated or in another format"));
    const auto records = static_cast<std::size_t>(bytes / static_cast<std::uintmax_t>(rec));
    std::ifstream in(file, std::ios::binary);
    // size known to be backed by the file
    std::vector<std::uint8_t> buf(static_cast<std::size_t>(bytes));
    in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    if (!in || static_cast<std::uintmax_t>(in.gcount()) != bytes)
      throw IoError(ddp::detail::str("ddp: cannot read CIFAR-format file '", file,
                                     "': short read (", std::strerror(errno), ")"));
    const auto n = static_cast<std::size_t>(rec - 1);
    const std::size_t first = labels_.size();
    labels_.reserve(first + records);
    pixels_.resize((first + records) * n);
    for (std::size_t r = 0; r < records; ++r) {
      const std::uint8_t* p = buf.data() + r * static_cast<std::size_t>(rec);
      if (p[0] >= o_.format.num_classes)
        throw IoError(
            ddp::detail::str("ddp: CIFAR-format file '", file, "' record ", r, " has label ",
                             int{p[0]}, " but the dataset has ", o_.format.num_classes,
                             " classes; the file is corrupt or the record format is wrong"));
      labels_.push_back(p[0]);
      std::memcpy(pixels_.data() + (first + r) * n, p + 1, n);
    }
  }

  CifarOptions o_;
  std::vector<std::int64_t> labels_;
  std::vector<std::uint8_t> pixels_;  // (num_records, C, H, W) bytes
  std::vector<float> scale_, shift_;  // (C)
};

}  // namespace ddp::data
