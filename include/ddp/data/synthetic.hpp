// Synthetic images and labels from a seed (the tutorials' --use_syn): no files, deterministic per
// index.
// SPDX-License-Identifier: MIT
//
// How it works: sample i owns a private range of Philox blocks in stream kStreamData of `seed`,
//   blocks [i * B, (i + 1) * B) with B = ceil(H*W*C / 4) + 1,
// the first ceil(H*W*C / 4) fill the image with N(0, 1) values (Generator::fill_normal,
// channels-last), the last gives the label as word 0 mod num_classes (bias < num_classes / 2^32,
// irrelevant here). No state is shared between samples, so every rank and every epoch regenerates
// exactly the same sample i, in any order, from any thread. The images do not depend on the epoch:
// like torchvision's FakeData, synthetic data is a fixed dataset, not fresh noise each step.
// Example: H = W = 32, C = 3 -> 3072 values = 768 blocks, B = 769; sample 2 uses blocks [1538,
//   2307).
// With `distinct` = k > 0, sample i is sample i % k, generated once up front (see
// SyntheticOptions).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/data/dataset.hpp"
#include "ddp/tensor/random.hpp"
#include "ddp/tensor/shape.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::data {

struct SyntheticOptions {
  std::size_t size = 1024;  // number of samples
  std::int64_t height = 224;
  std::int64_t width = 224;
  std::int64_t channels = 3;
  std::int64_t num_classes = 1000;
  std::uint64_t seed = 0;
  // > 0: only this many distinct samples, i -> i % distinct, generated once at construction and
  // copied out of memory afterwards. For throughput runs, where drawing N(0,1) pixels (about 4 ms
  // per 224x224 image on one core) would compete with a fast GPU step. 0: every sample distinct,
  // nothing cached.
  std::size_t distinct = 0;
};

class SyntheticDataset : public Dataset {
 public:
  // Throws ValueError for non-positive extents or num_classes.
  explicit SyntheticDataset(const SyntheticOptions& o) : o_(o) {
    if (o.height <= 0 || o.width <= 0 || o.channels <= 0 || o.num_classes <= 0)
      throw ValueError(ddp::detail::str(
          "ddp: SyntheticDataset: height, width, channels and num_classes must be > 0, got ",
          o.height, ", ", o.width, ", ", o.channels, ", ", o.num_classes,
          "; check --image-size / --num-classes"));
    image_blocks_ = static_cast<std::uint64_t>((o.height * o.width * o.channels + 3) / 4);
    if (o_.distinct > 0) {
      const auto row = static_cast<std::size_t>(o.height * o.width * o.channels);
      cache_.resize(o_.distinct * row);
      for (std::size_t i = 0; i < o_.distinct; ++i)
        cache_labels_.push_back(generate(i, std::span<float>(cache_.data() + i * row, row)));
    }
  }

  std::size_t size() const override { return o_.size; }
  ImageShape image_shape() const override {
    return {.height = o_.height, .width = o_.width, .channels = o_.channels};
  }
  std::int64_t num_classes() const override { return o_.num_classes; }
  const SyntheticOptions& options() const { return o_; }

  std::int64_t get_into(std::size_t index, std::uint64_t /*epoch*/,
                        std::span<float> image) const override {
    if (o_.distinct == 0) return generate(index, image);
    const std::size_t k = index % o_.distinct;
    std::copy(cache_.begin() + static_cast<std::ptrdiff_t>(k * image.size()),
              cache_.begin() + static_cast<std::ptrdiff_t>((k + 1) * image.size()), image.begin());
    return cache_labels_[k];
  }

 private:
  std::int64_t generate(std::size_t index, std::span<float> image) const {
    const std::uint64_t first = static_cast<std::uint64_t>(index) * (image_blocks_ + 1);
    Generator g(o_.seed, 0, kStreamData);
    g.set_offset(first);
    g.fill_normal(TensorView<float, Cpu>(image.data(), Shape{o_.height, o_.width, o_.channels}),
                  0.0, 1.0);
    return static_cast<std::int64_t>(g.block(first + image_blocks_)[0] %
                                     static_cast<std::uint64_t>(o_.num_classes));
  }

  SyntheticOptions o_;
  std::uint64_t image_blocks_ = 0;
  std::vector<float> cache_;                // (distinct, H, W, C) when distinct > 0
  std::vector<std::int64_t> cache_labels_;  // (distinct)
};

}  // namespace ddp::data
