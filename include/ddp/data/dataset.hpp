// The Dataset interface (indexed image + label samples) and batch assembly into NHWC tensors.
// SPDX-License-Identifier: MIT
//
// A dataset is a fixed-size, random-access collection: sample i is an image of shape (H, W, C) in
// channels-last order and an integer label in [0, num_classes). get_into() writes the image
// straight into its row of a batch tensor, so assembling a batch of B samples is B calls and no
// extra copies:
//   batch.images (B, H, W, C) float, row b = sample indices[b];  batch.labels (B) int64.
// Random augmentation is a pure function of (dataset seed, epoch, index), never of call order, so
// any rank, thread or resumed run regenerates exactly the same sample i of epoch e.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/shape.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::data {

// Extents of one image, channels-last.
struct ImageShape {
  std::int64_t height = 0;
  std::int64_t width = 0;
  std::int64_t channels = 0;
  std::int64_t numel() const { return height * width * channels; }
  friend bool operator==(const ImageShape&, const ImageShape&) = default;
};

struct Sample {
  Tensor<float, Cpu> image;  // (H, W, C)
  std::int64_t label = 0;
};

// Implementations must make get_into() safe to call concurrently (it is const; the loader calls it
// from its worker thread while the training thread may call size()).
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::size_t size() const = 0;
  virtual ImageShape image_shape() const = 0;
  virtual std::int64_t num_classes() const = 0;
  // Writes sample `index` (already range-checked by the caller) as H*W*C floats in (H, W, C) order
  // into `image` (exactly image_shape().numel() elements) and returns its label. `epoch` feeds
  // augmentation.
  virtual std::int64_t get_into(std::size_t index, std::uint64_t epoch,
                                std::span<float> image) const = 0;

  // One sample as a tensor. Throws ValueError when index >= size().
  Sample get(std::size_t index, std::uint64_t epoch = 0) const {
    check_index(static_cast<std::int64_t>(index));
    const ImageShape s = image_shape();
    Sample out{.image = Tensor<float, Cpu>(Shape{s.height, s.width, s.channels})};
    out.label = get_into(index, epoch,
                         std::span<float>(out.image.data(), static_cast<std::size_t>(s.numel())));
    return out;
  }

  void check_index(std::int64_t index) const {
    if (index < 0 || static_cast<std::size_t>(index) >= size())
      throw ValueError(
          ddp::detail::str("ddp: dataset index ", index, " is out of range for a dataset of ",
                           size(), " samples; the sampler was built for a different dataset size"));
  }
};

// A batch as the model consumes it.
struct Batch {
  Tensor<float, Cpu> images;          // (B, H, W, C), NHWC
  Tensor<std::int64_t, Cpu> labels;   // (B)
  std::vector<std::int64_t> indices;  // dataset index of each row
  std::size_t step = 0;               // position of this batch within its epoch (0-based)
  std::size_t size() const { return indices.size(); }
};

// Assembles the samples `indices` of `ds` (epoch `epoch`) into one batch. Throws ValueError on an
// empty batch or an index out of range, and rethrows whatever the dataset throws (IoError, ...).
inline Batch make_batch(const Dataset& ds, std::span<const std::int64_t> indices,
                        std::uint64_t epoch, std::size_t step = 0) {
  if (indices.empty())
    throw ValueError("ddp: make_batch: a batch needs at least one sample, got 0 indices");
  for (auto i : indices) ds.check_index(i);
  const ImageShape s = ds.image_shape();
  const auto b = static_cast<std::int64_t>(indices.size());
  Batch out{.images = Tensor<float, Cpu>(Shape{b, s.height, s.width, s.channels}),
            .labels = Tensor<std::int64_t, Cpu>(Shape{b}),
            .indices = std::vector<std::int64_t>(indices.begin(), indices.end()),
            .step = step};
  const auto row = static_cast<std::size_t>(s.numel());
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const std::int64_t label = ds.get_into(static_cast<std::size_t>(indices[k]), epoch,
                                           std::span<float>(out.images.data() + k * row, row));
    if (label < 0 || label >= ds.num_classes())
      throw ValueError(ddp::detail::str("ddp: dataset sample ", indices[k], " has label ", label,
                                        " outside [0, ", ds.num_classes(),
                                        "); the file is corrupt or num_classes is wrong"));
    out.labels.data()[k] = label;
  }
  return out;
}

}  // namespace ddp::data
