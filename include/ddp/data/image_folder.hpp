// ImageFolder: torchvision.datasets.ImageFolder's layout and order over JPEG/PNG files, with the
// ImageNet transforms of image_transform.hpp (docs/decisions/0039).
// SPDX-License-Identifier: MIT
//
//   root/<class>/<...>/<image>.<ext>     ext in torchvision's IMG_EXTENSIONS, case-insensitive
// Classes are the sorted names of root's subdirectories (byte order of the UTF-8 names, which is
// Python's code-point order), class_to_idx[classes[k]] = k. Samples follow torchvision's
// make_dataset: classes in order; within a class the directories of os.walk(class_dir,
// followlinks=True) sorted by path string, in each its files sorted by name; so sample i here is
// torchvision's sample i. get_into() decodes sample i and writes (S, S, 3) floats, S = crop_size:
//   train: RandomResizedCrop(S, scale, ratio) + RandomHorizontalFlip + ToTensor + Normalize
//   eval:  Resize(resize_size) + CenterCrop(S) + ToTensor + Normalize
// Sample i's random choices in epoch e come from Generator(seed, 0, kStreamAugment) at offset
// (e * N + i) * 64 blocks (RandomResizedCrop uses at most 24 blocks, the flip one), a pure function
// of (seed, e, i) as every Dataset's must be. An undecodable sample (corrupt, truncated, other
// format, unreadable) throws IoError naming the file (on_error = kFail, the default); with kSkip it
// is counted (skipped()), reported once on stderr, and the next decodable sample in index order
// takes its place, so a batch never has a hole.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/data/cifar10.hpp"
#include "ddp/data/dataset.hpp"
#include "ddp/data/image_decode.hpp"
#include "ddp/data/image_transform.hpp"
#include "ddp/tensor/random.hpp"

namespace ddp::data {

// torchvision.datasets.folder.IMG_EXTENSIONS (0.14). Files with other extensions are not samples.
inline const std::vector<std::string> kImageExtensions = {".jpg", ".jpeg", ".png",  ".ppm", ".bmp",
                                                          ".pgm", ".tif",  ".tiff", ".webp"};

// has_file_allowed_extension: name.lower().endswith(one of kImageExtensions) (ASCII lower-casing).
inline bool has_image_extension(const std::string& name) {
  std::string lower = name;
  for (char& ch : lower)
    if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
  return std::any_of(kImageExtensions.begin(), kImageExtensions.end(), [&](const std::string& ext) {
    return lower.size() >= ext.size() &&
           lower.compare(lower.size() - ext.size(), ext.size(), ext) == 0;
  });
}

enum class OnBadImage { kFail, kSkip };

struct ImageFolderOptions {
  bool train = false;                      // RandomResizedCrop + flip; false: Resize + CenterCrop
  std::int64_t crop_size = 224;            // S: RandomResizedCrop(S) / CenterCrop(S)
  std::int64_t resize_size = 256;          // eval: Resize(resize_size), the shorter side
  double scale_lo = 0.08, scale_hi = 1.0;  // RandomResizedCrop's scale
  double ratio_lo = 3.0 / 4.0, ratio_hi = 4.0 / 3.0;  // RandomResizedCrop's ratio
  bool horizontal_flip = true;                        // train: mirror with probability 1/2
  std::vector<float> mean = kImageNetMean;            // Normalize, per channel
  std::vector<float> std = kImageNetStd;
  std::uint64_t seed = 0;  // augmentation seed; equal on every rank
  OnBadImage on_error = OnBadImage::kFail;
};

struct ImageSample {
  std::string path;
  std::int64_t label = 0;
};

// torchvision 0.14's find_classes + make_dataset. IoError (torchvision's FileNotFoundError) when
// root is not a directory, has no class directory, or a class has no file with an image extension.
inline std::pair<std::vector<std::string>, std::vector<ImageSample>> scan_image_folder(
    const std::string& root) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    throw IoError(ddp::detail::str(
        "ddp: ImageFolder root '", root,
        "' is not a directory; expected root/<class>/<image>.jpg (check --data_dir)"));
  std::vector<std::string> classes;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.is_directory(ec)) classes.push_back(e.path().filename().string());
  if (ec)
    throw IoError(
        ddp::detail::str("ddp: cannot list ImageFolder root '", root, "': ", ec.message()));
  std::sort(classes.begin(), classes.end());
  if (classes.empty())
    throw IoError(ddp::detail::str("ddp: couldn't find any class folder in '", root,
                                   "'; expected root/<class>/<image>.jpg"));
  std::vector<ImageSample> samples;
  std::vector<std::string> empty;
  const std::string base = root.ends_with('/') ? root : root + "/";  // os.path.join(root, name)
  for (std::size_t k = 0; k < classes.size(); ++k) {
    // os.walk(followlinks=True): every directory below the class directory (symlinks followed; a
    // symlink loop is cut by remembering canonical paths), sorted by its path string.
    const std::string class_dir = base + classes[k];
    std::vector<std::string> dirs{class_dir};
    std::set<std::string> seen;
    for (std::size_t d = 0; d < dirs.size(); ++d) {
      const std::string canon = fs::weakly_canonical(dirs[d], ec).string();
      if (!seen.insert(canon).second) continue;
      for (const auto& e : fs::directory_iterator(dirs[d], ec))
        if (e.is_directory(ec)) dirs.push_back(dirs[d] + "/" + e.path().filename().string());
    }
    std::sort(dirs.begin(), dirs.end());
    const std::size_t before = samples.size();
    for (const auto& dir : dirs) {
      std::vector<std::string> files;
      for (const auto& e : fs::directory_iterator(dir, ec))
        if (!e.is_directory(ec)) files.push_back(e.path().filename().string());
      std::sort(files.begin(), files.end());
      for (const auto& f : files)
        if (has_image_extension(f))
          samples.push_back({.path = dir + "/" + f, .label = static_cast<std::int64_t>(k)});
    }
    if (samples.size() == before) empty.push_back(classes[k]);
  }
  if (!empty.empty()) {
    std::string names;
    for (const auto& n : empty) names += (names.empty() ? "" : ", ") + n;
    throw IoError(ddp::detail::str(
        "ddp: ImageFolder '", root, "': found no valid file for the classes ", names,
        "; supported extensions are .jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp"));
  }
  return {std::move(classes), std::move(samples)};
}

class ImageFolder : public Dataset {
 public:
  // Scans root (scan_image_folder); ValueError for inconsistent options.
  explicit ImageFolder(const std::string& root, ImageFolderOptions options = {})
      : root_(root), o_(std::move(options)) {
    if (o_.crop_size <= 0 || o_.resize_size <= 0)
      throw ValueError(ddp::detail::str("ddp: ImageFolder crop_size ", o_.crop_size,
                                        " and resize_size ", o_.resize_size, " must be > 0"));
    if (!(o_.scale_lo > 0.0 && o_.scale_lo <= o_.scale_hi) ||
        !(o_.ratio_lo > 0.0 && o_.ratio_lo <= o_.ratio_hi))
      throw ValueError(ddp::detail::str(
          "ddp: RandomResizedCrop scale (", o_.scale_lo, ", ", o_.scale_hi, ") and ratio (",
          o_.ratio_lo, ", ", o_.ratio_hi, ") must be positive, each (low, high) with low <= high"));
    if (o_.mean.size() != 3 || o_.std.size() != 3)
      throw ValueError(ddp::detail::str("ddp: ImageFolder normalises RGB: 3 means and 3 stds, got ",
                                        o_.mean.size(), " and ", o_.std.size()));
    for (float s : o_.std)
      if (!(s > 0.0f))
        throw ValueError(ddp::detail::str("ddp: normalisation std ", s, " must be > 0"));
    auto [classes, samples] = scan_image_folder(root_);
    classes_ = std::move(classes);
    samples_ = std::move(samples);
  }

  std::size_t size() const override { return samples_.size(); }
  ImageShape image_shape() const override {
    return {.height = o_.crop_size, .width = o_.crop_size, .channels = 3};
  }
  std::int64_t num_classes() const override { return static_cast<std::int64_t>(classes_.size()); }

  const std::string& root() const { return root_; }
  const ImageFolderOptions& options() const { return o_; }
  const std::vector<std::string>& classes() const { return classes_; }
  const std::vector<ImageSample>& samples() const { return samples_; }
  // Samples replaced because their file could not be decoded (kSkip), over all calls so far.
  std::size_t skipped() const { return skipped_.load(); }

  // Sample `index` decoded, untransformed: what PIL's Image.open(path).convert("RGB") holds.
  DecodedImage decode(std::size_t index) const {
    check_index(static_cast<std::int64_t>(index));
    return decode_image_file(samples_[index].path);
  }

  // The training crop and flip of sample `index` in `epoch` for an image of height x width.
  CropParams train_params(std::size_t index, std::uint64_t epoch, std::int64_t height,
                          std::int64_t width) const {
    Generator g(o_.seed, 0, kStreamAugment);
    g.set_offset((epoch * static_cast<std::uint64_t>(size()) + index) * kBlocksPerSample);
    CropParams p = random_resized_crop_params(height, width, o_.scale_lo, o_.scale_hi, o_.ratio_lo,
                                              o_.ratio_hi, g);
    g.set_offset((epoch * static_cast<std::uint64_t>(size()) + index) * kBlocksPerSample +
                 kBlocksPerSample - 1);
    p.flip = o_.horizontal_flip && (g.next_u64() & 1u) != 0;
    return p;
  }

  // The transform of a decoded image into (S, S, 3) floats: training with `params` (train_params(),
  // or any window, e.g. torchvision's), or evaluation when params is null.
  void transform_into(const DecodedImage& img, const CropParams* params,
                      std::span<float> out) const {
    const std::int64_t s = o_.crop_size;
    if (params != nullptr) {
      const auto bytes = resize_bilinear_pil(img.rgb, img.height, img.width, *params, s, s);
      normalize_rgb(bytes, s, s, 0, 0, s, s, params->flip, o_.mean.data(), o_.std.data(), out);
      return;
    }
    const auto [rh, rw] = resize_shorter_extents(img.height, img.width, o_.resize_size);
    const CropParams whole{
        .top = 0, .left = 0, .height = img.height, .width = img.width, .flip = false};
    // Already the target size: torchvision returns the image itself, so no resize.
    const auto bytes = (rh == img.height && rw == img.width)
                           ? img.rgb
                           : resize_bilinear_pil(img.rgb, img.height, img.width, whole, rh, rw);
    normalize_rgb(bytes, rh, rw, center_crop_offset(rh, s), center_crop_offset(rw, s), s, s, false,
                  o_.mean.data(), o_.std.data(), out);
  }

  std::int64_t get_into(std::size_t index, std::uint64_t epoch,
                        std::span<float> image) const override {
    if (o_.on_error == OnBadImage::kFail) return produce(index, epoch, image);
    for (std::size_t k = 0; k < size(); ++k) {
      const std::size_t i = (index + k) % size();
      try {
        return produce(i, epoch, image);
      } catch (const IoError& e) {
        skipped_.fetch_add(1);
        std::lock_guard lock(mu_);
        if (reported_.insert(i).second)
          std::fprintf(stderr, "%s; skipped (on_error = skip)\n", e.what());
      }
    }
    throw IoError(ddp::detail::str("ddp: ImageFolder '", root_, "': no sample could be decoded"));
  }

 private:
  static constexpr std::uint64_t kBlocksPerSample = 64;

  std::int64_t produce(std::size_t index, std::uint64_t epoch, std::span<float> image) const {
    const DecodedImage img = decode_image_file(samples_[index].path);
    if (o_.train) {
      const CropParams p = train_params(index, epoch, img.height, img.width);
      transform_into(img, &p, image);
    } else {
      transform_into(img, nullptr, image);
    }
    return samples_[index].label;
  }

  std::string root_;
  ImageFolderOptions o_;
  std::vector<std::string> classes_;
  std::vector<ImageSample> samples_;
  mutable std::atomic<std::size_t> skipped_{0};
  mutable std::mutex mu_;
  mutable std::set<std::size_t> reported_;
};

}  // namespace ddp::data
