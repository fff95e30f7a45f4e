// ImageFolder, the JPEG/PNG decoders and the ImageNet transforms against torchvision 0.14 + PIL on the same
// files (make_image_reference.py writes the tree and torchvision's results at test time).
// SPDX-License-Identifier: MIT
//
// Expected, and reached on x86-64 (Debian 12: libjpeg-turbo 2.1.5 under both PIL and TurboJPEG, PIL 9.4):
// class list and sample order equal; decoded bytes equal (max |diff| 0); eval (Resize + CenterCrop +
// Normalize) and training crops given torchvision's (i, j, h, w, flip) equal as float32 (max |diff| 0).
// Each case prints the largest difference it saw, so a different libjpeg/PIL shows by how much it differs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <ddp/data/image_folder.hpp>
#include <ddp/data/loader.hpp>

#include "interop/reference/reference_file.hpp"

using namespace ddp;
using namespace ddp::data;

namespace {

struct Ref {
  std::string tree;
  test::RefFile file;
};

// Runs make_image_reference.py once per process; exits 77 (skip) when the script does.
const Ref& ref() {
  static const Ref r = [] {
    const std::string base = std::string(DDP_REFERENCE_OUT) + "/image_ref." + std::to_string(::getpid());
    const std::string tree = base + ".tree", out = base + ".bin";
    std::filesystem::remove_all(tree);
    const std::string cmd = std::string(DDP_TEST_PYTHON) + " " + DDP_REFERENCE_DIR + "/make_image_reference.py " +
                            tree + " " + out;
    const int rc = std::system(cmd.c_str());
    const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    if (code == 77) {
      std::printf("SKIP: make_image_reference.py could not run (see its message above)\n");
      std::fflush(stdout);
      std::exit(77);
    }
    if (code != 0) throw std::runtime_error("reference script failed: " + cmd + " (exit " + std::to_string(code) + ")");
    Ref res{.tree = tree, .file = test::RefFile::read(out)};
    std::remove(out.c_str());
    return res;
  }();
  return r;
}

// The tree is removed when the process ends (the reference is made once per process).
struct TreeCleanup {
  ~TreeCleanup() {
    std::error_code ec;
    std::filesystem::remove_all(std::string(DDP_REFERENCE_OUT) + "/image_ref." + std::to_string(::getpid()) + ".tree",
                                ec);
  }
} tree_cleanup;

std::string ref_string(const std::string& key) {
  const test::RefTensor& t = ref().file.at(key);
  std::string s;
  for (auto v : t.i) s.push_back(static_cast<char>(v));
  return s;
}

std::string good() { return ref().tree + "/good"; }

// Largest |ours - torch| over a float tensor.
double max_diff(std::span<const float> ours, const test::RefTensor& t) {
  REQUIRE(static_cast<std::int64_t>(ours.size()) == t.numel());
  double worst = 0.0;
  for (std::size_t k = 0; k < ours.size(); ++k) worst = std::max(worst, std::abs(static_cast<double>(ours[k]) - t.f[k]));
  return worst;
}

}  // namespace

TEST_CASE("ImageFolder: classes and sample order equal torchvision's") {
  const ImageFolder ds(good());
  std::size_t k = 0;
  for (; ref().file.has("classes/" + std::to_string(k)); ++k) {
    REQUIRE(k < ds.classes().size());
    CHECK(ds.classes()[k] == ref_string("classes/" + std::to_string(k)));
  }
  CHECK(ds.classes().size() == k);
  std::size_t i = 0;
  for (; ref().file.has("sample/" + std::to_string(i)); ++i) {
    REQUIRE(i < ds.size());
    const std::string rel = std::filesystem::relative(ds.samples()[i].path, good()).string();
    CHECK(rel == ref_string("sample/" + std::to_string(i)));
    CHECK(ds.samples()[i].label == ref().file.int_at("label/" + std::to_string(i)));
  }
  CHECK(ds.size() == i);
  std::printf("ImageFolder: %zu classes, %zu samples, same order as torchvision\n", k, i);
}

TEST_CASE("decode: bytes equal PIL's Image.open(path).convert('RGB')") {
  const ImageFolder ds(good());
  std::int64_t worst = 0, pixels = 0;
  for (std::size_t i = 0; i < ds.size(); ++i) {
    const DecodedImage img = ds.decode(i);
    const test::RefTensor& t = ref().file.at("decoded/" + std::to_string(i));
    INFO(ds.samples()[i].path);
    REQUIRE(t.dims.size() == 3);
    CHECK(img.height == t.dims[0]);
    CHECK(img.width == t.dims[1]);
    REQUIRE(static_cast<std::int64_t>(img.rgb.size()) == t.numel());
    std::int64_t w = 0;
    for (std::size_t k = 0; k < img.rgb.size(); ++k) w = std::max<std::int64_t>(w, std::abs(img.rgb[k] - t.i[k]));
    CHECK(w == 0);
    worst = std::max(worst, w);
    pixels += img.height * img.width;
  }
  std::printf("decode: %zu files (%lld pixels), max |ours - PIL| = %lld\n", ds.size(), static_cast<long long>(pixels),
              static_cast<long long>(worst));
}

TEST_CASE("eval transform: Resize + CenterCrop + Normalize equal torchvision's") {
  for (const auto& [name, resize, crop] : {std::tuple{"256_224", 256, 224}, std::tuple{"64_56", 64, 56}, std::tuple{"40_56", 40, 56}}) {
    const ImageFolder ds(good(), {.train = false, .crop_size = crop, .resize_size = resize});
    double worst = 0.0;
    std::vector<float> out(static_cast<std::size_t>(ds.image_shape().numel()));
    for (std::size_t i = 0; i < ds.size(); ++i) {
      INFO(name, " ", ds.samples()[i].path);
      CHECK(ds.get_into(i, 0, out) == ref().file.int_at("label/" + std::to_string(i)));
      const double d = max_diff(out, ref().file.at(std::string("eval/") + name + "/" + std::to_string(i)));
      CHECK(d == 0.0);
      worst = std::max(worst, d);
    }
    std::printf("eval Resize(%d) + CenterCrop(%d): %zu images, max |ours - torchvision| = %g\n", resize, crop,
                ds.size(), worst);
  }
}

TEST_CASE("train transform: resized crop + flip + Normalize equal torchvision's given the same parameters") {
  for (const int s : {224, 48}) {
    const ImageFolder ds(good(), {.train = true, .crop_size = s});
    double worst = 0.0;
    int flips = 0;
    std::vector<float> out(static_cast<std::size_t>(ds.image_shape().numel()));
    for (std::size_t i = 0; i < ds.size(); ++i) {
      const test::RefTensor& p = ref().file.at("params/" + std::to_string(s) + "/" + std::to_string(i));
      const CropParams params{.top = p.i[0], .left = p.i[1], .height = p.i[2], .width = p.i[3], .flip = p.i[4] != 0};
      flips += params.flip ? 1 : 0;
      INFO(ds.samples()[i].path, " crop ", params.top, ",", params.left, " ", params.height, "x", params.width);
      ds.transform_into(ds.decode(i), &params, out);
      const double d = max_diff(out, ref().file.at("train/" + std::to_string(s) + "/" + std::to_string(i)));
      CHECK(d == 0.0);
      worst = std::max(worst, d);
    }
    std::printf("train resized_crop(%d) [+ hflip]: %zu crops (%d flipped), max |ours - torchvision| = %g\n", s,
                ds.size(), flips, worst);
  }
}

TEST_CASE("train transform: our RandomResizedCrop parameters are valid, deterministic and vary") {
  const ImageFolder ds(good(), {.train = true, .crop_size = 32, .seed = 7});
  std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>> windows;
  int flips = 0, n = 0;
  for (std::uint64_t epoch = 0; epoch < 20; ++epoch)
    for (std::size_t i = 0; i < ds.size(); ++i) {
      const std::int64_t h = 300, w = 260;
      const CropParams p = ds.train_params(i, epoch, h, w);
      CHECK(p == ds.train_params(i, epoch, h, w));
      CHECK(p.top >= 0);
      CHECK(p.left >= 0);
      CHECK(p.top + p.height <= h);
      CHECK(p.left + p.width <= w);
      const double frac = static_cast<double>(p.height * p.width) / (h * w);
      CHECK(frac >= 0.07);  // 0.08 of the area up to the rounding of h and w
      const double ratio = static_cast<double>(p.width) / static_cast<double>(p.height);
      CHECK(ratio >= 0.7);
      CHECK(ratio <= 1.4);
      windows.insert({p.top, p.left, p.height, p.width});
      flips += p.flip ? 1 : 0;
      ++n;
    }
  CHECK(windows.size() > static_cast<std::size_t>(n) * 9 / 10);
  CHECK(flips > n / 4);
  CHECK(flips < 3 * n / 4);
  // A batch through the loader: the dataset's shape and labels.
  std::vector<std::int64_t> idx(ds.size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<std::int64_t>(i);
  const Batch b = make_batch(ds, idx, 3);
  CHECK(b.images.shape() == Shape{static_cast<std::int64_t>(ds.size()), 32, 32, 3});
  for (std::size_t i = 0; i < ds.size(); ++i) CHECK(b.labels.data()[i] == ds.samples()[i].label);
}

TEST_CASE("bad files: an IoError naming the file, or skipped and counted") {
  const std::string bad = ref().tree + "/bad";
  // PIL's loader fails on every bad file too (so torchvision would crash the epoch where we report).
  for (const char* name : {"truncated.jpg", "truncated_scan.jpg", "garbage.png", "truncated.png"})
    CHECK(ref().file.int_at(std::string("bad_pil_fails/") + name) == 1);
  CHECK(ref().file.int_at("bad_pil_fails/good.jpg") == 0);
  const ImageFolder fail(bad, {.crop_size = 16, .resize_size = 16});
  // c0/good.jpg c0/truncated.jpg c0/truncated_scan.jpg c1/garbage.png c1/truncated.png
  REQUIRE(fail.size() == 5);
  std::vector<float> out(16 * 16 * 3);
  CHECK(fail.get_into(0, 0, out) == 0);
  for (std::size_t i = 1; i < 5; ++i) {
    const std::string path = fail.samples()[i].path;
    try {
      fail.get_into(i, 0, out);
      FAIL("no error for " << path);
    } catch (const IoError& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(path) != std::string::npos);
      std::printf("%s\n", e.what());
    }
  }
  const ImageFolder skip(bad, {.crop_size = 16, .resize_size = 16, .on_error = OnBadImage::kSkip});
  // Samples 1..4 are bad: each is replaced by the next good one in index order (wrapping to sample 0, label 0).
  for (std::size_t i = 0; i < 5; ++i) CHECK(skip.get_into(i, 0, out) == 0);
  CHECK(skip.skipped() == 4 + 3 + 2 + 1);  // sample 1 tries 1..4, sample 2 tries 2..4, ...
  // A missing root and a class without images are errors naming the path.
  CHECK_THROWS_AS(ImageFolder(ref().tree + "/nope"), IoError);
  std::filesystem::create_directories(bad + "/c2");
  try {
    const ImageFolder empty_class(bad);
    FAIL("no error for an empty class");
  } catch (const IoError& e) {
    CHECK(std::string(e.what()).find("c2") != std::string::npos);
  }
  std::filesystem::remove(bad + "/c2");
}
