// data: the CIFAR-10 binary reader on generated files, normalisation, crop+flip augmentation (bad files:
// test_bad_inputs.cpp), and scikit-learn's digits converted by tests/interop/reference/digits_to_cifar_format.py.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <ddp/data/cifar10.hpp>
#include <ddp/train/safetensors.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using ddp::data::CifarBinaryDataset;
using ddp::data::CifarOptions;

namespace {

struct CifarDir : ddp::test::TempDir {
  CifarDir() : ddp::test::TempDir("ddp_cifar_") {}
};

// Pixel byte of record r, channel c, row y, column x in the generated files.
std::uint8_t pixel(int r, int c, int y, int x) {
  return static_cast<std::uint8_t>((r * 31 + c * 97 + y * 8 + x * 3) % 256);
}

// Writes `records` CIFAR-10 records (labels r % 10) to `path`.
void write_cifar(const std::string& path, int records, int first = 0) {
  std::ofstream out(path, std::ios::binary);
  for (int r = first; r < first + records; ++r) {
    out.put(static_cast<char>(r % 10));
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < 32; ++y)
        for (int x = 0; x < 32; ++x) out.put(static_cast<char>(pixel(r, c, y, x)));
  }
}

// Reference augmentation, written independently of the library: an explicit zero-padded (40 x 40) copy,
// a 32 x 32 window at (top, left), an optional mirror, then (v / 255 - mean) / std.
std::vector<float> reference_view(int r, int top, int left, bool flip, int pad) {
  const int side = 32 + 2 * pad;
  std::vector<int> padded(static_cast<std::size_t>(3 * side * side), 0);
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 32; ++y)
      for (int x = 0; x < 32; ++x)
        padded[static_cast<std::size_t>((c * side + y + pad) * side + x + pad)] = pixel(r, c, y, x);
  std::vector<float> out;
  for (int y = 0; y < 32; ++y)
    for (int x = 0; x < 32; ++x)
      for (int c = 0; c < 3; ++c) {
        const int cx = flip ? 31 - x : x;
        const int v = padded[static_cast<std::size_t>((c * side + y + top) * side + cx + left)];
        const auto cs = static_cast<std::size_t>(c);
        out.push_back((static_cast<float>(v) / 255.0f - ddp::data::kCifar10Mean[cs]) / ddp::data::kCifar10Std[cs]);
      }
  return out;
}

bool close(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::fabs(a[i] - b[i]) > 1e-5f + 1e-5f * std::fabs(b[i])) return false;
  return true;
}

std::vector<float> image_of(const CifarBinaryDataset& ds, std::size_t i, std::uint64_t epoch) {
  auto s = ds.get(i, epoch);
  return {s.image.data(), s.image.data() + s.image.numel()};
}

}  // namespace

TEST_SUITE("data") {
  TEST_CASE("cifar10: records are read across files, normalised and laid out channels-last") {
    CifarDir dir;
    write_cifar(dir.file("a.bin"), 3, 0);
    write_cifar(dir.file("b.bin"), 2, 3);
    CifarBinaryDataset ds({dir.file("a.bin"), dir.file("b.bin")}, {});
    CHECK(ds.size() == 5);
    CHECK(ds.num_classes() == 10);
    CHECK(ds.image_shape() == ddp::data::ImageShape{.height = 32, .width = 32, .channels = 3});
    for (std::size_t r = 0; r < 5; ++r) {
      auto s = ds.get(r, 7);
      CHECK(s.label == static_cast<std::int64_t>(r % 10));
      CHECK(s.image.shape() == ddp::Shape{32, 32, 3});
      CHECK(close(image_of(ds, r, 7), reference_view(static_cast<int>(r), 4, 4, false, 4)));  // centre = no crop
    }
    // One value by hand: record 1, channel 2, (y, x) = (5, 6): byte (31 + 194 + 40 + 18) % 256 = 27.
    CHECK(ds.get(1).image(5, 6, 2) == doctest::Approx((27.0 / 255.0 - 0.4465) / 0.2616).epsilon(1e-6));
    CHECK(ds.raw(1)[static_cast<std::size_t>((2 * 32 + 5) * 32 + 6)] == 27);
  }

  TEST_CASE("cifar10: augmentation is a seeded random crop (padding 4) + flip, per (seed, epoch, index)") {
    CifarDir dir;
    write_cifar(dir.file("a.bin"), 40);
    CifarBinaryDataset ds({dir.file("a.bin")}, {.augment = true, .seed = 11});
    CifarBinaryDataset same({dir.file("a.bin")}, {.augment = true, .seed = 11});
    CifarBinaryDataset other({dir.file("a.bin")}, {.augment = true, .seed = 12});
    std::map<std::tuple<int, int, bool>, int> seen;
    int differ_seed = 0;
    // All 9 x 9 x 2 candidate views of each image, computed once by the reference.
    std::vector<std::vector<std::vector<float>>> views(40);
    for (int i = 0; i < 40; ++i)
      for (int top = 0; top <= 8; ++top)
        for (int left = 0; left <= 8; ++left)
          for (bool flip : {false, true})
            views[static_cast<std::size_t>(i)].push_back(reference_view(i, top, left, flip, 4));
    for (std::uint64_t epoch = 0; epoch < 25; ++epoch) {
      for (std::size_t i = 0; i < 40; ++i) {
        auto img = image_of(ds, i, epoch);
        CHECK(img == image_of(same, i, epoch));  // deterministic
        if (img != image_of(other, i, epoch)) ++differ_seed;
        // Exactly one of the 9 x 9 x 2 candidate views matches (the pattern has no symmetric views).
        int matches = 0;
        for (std::size_t v = 0; v < 162; ++v)
          if (close(img, views[i][v])) {
            ++matches;
            ++seen[{static_cast<int>(v / 18), static_cast<int>(v / 2 % 9), v % 2 == 1}];
          }
        CHECK(matches == 1);
      }
    }
    CHECK(differ_seed > 900);
    // 1000 draws over 162 outcomes: every outcome appears, flips are about half.
    CHECK(seen.size() == 162);
    int flips = 0;
    for (auto& [k, n] : seen)
      if (std::get<2>(k)) flips += n;
    CHECK(flips > 420);
    CHECK(flips < 580);
    // Without flip, no view is mirrored.
    CifarBinaryDataset noflip({dir.file("a.bin")}, {.augment = true, .horizontal_flip = false, .seed = 11});
    for (std::size_t i = 0; i < 40; ++i) {
      auto img = image_of(noflip, i, 3);
      bool found = false;
      for (int top = 0; top <= 8 && !found; ++top)
        for (int left = 0; left <= 8 && !found; ++left)
          found = close(img, reference_view(static_cast<int>(i), top, left, false, 4));
      CHECK(found);
    }
  }

  TEST_CASE("cifar10: normalisation and crop/flip views equal torchvision's transforms on the same records") {
    if (std::system("/usr/bin/python3 -c 'import torch, torchvision, PIL' >/dev/null 2>&1") != 0) {
      MESSAGE("skipped: /usr/bin/python3 cannot import torch, torchvision and PIL");
      return;
    }
    CifarDir dir;
    write_cifar(dir.file("t.bin"), 4, 3);
    const fs::path ref = fs::path(__FILE__).parent_path().parent_path().parent_path() / "interop" / "reference";
    // torchvision's CIFAR10 turns each record into a PIL image (HWC uint8); the tutorial's transforms
    // then pad/crop/flip it and ToTensor + Normalize it. Every crop/flip view of record 0 is saved.
    const std::string py =
        "import sys, numpy as np, torch, PIL.Image\n"
        "import torchvision.transforms as T, torchvision.transforms.functional as F\n"
        "sys.path.insert(0, sys.argv[1]); import safetensors_py\n"
        "raw = np.fromfile(sys.argv[2], dtype=np.uint8).reshape(-1, 3073)\n"
        "post = T.Compose([T.ToTensor(), T.Normalize((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))])\n"
        "pil = [PIL.Image.fromarray(r[1:].reshape(3, 32, 32).transpose(1, 2, 0)) for r in raw]\n"
        "nhwc = lambda t: t.permute(1, 2, 0).contiguous()\n"
        "out = {f'plain.{i}': nhwc(post(p)) for i, p in enumerate(pil)}\n"
        "padded = F.pad(pil[0], 4)\n"
        "for top in range(9):\n"
        "  for left in range(9):\n"
        "    v = F.crop(padded, top, left, 32, 32)\n"
        "    out[f'view.{top}.{left}.0'] = nhwc(post(v))\n"
        "    out[f'view.{top}.{left}.1'] = nhwc(post(F.hflip(v)))\n"
        "safetensors_py.save_file(out, sys.argv[3])\n";
    std::ofstream(dir.file("ref.py")) << py;
    const std::string cmd = "/usr/bin/python3 " + dir.file("ref.py") + " " + ref.string() + " " + dir.file("t.bin") +
                            " " + dir.file("ref.safetensors");
    REQUIRE(std::system(cmd.c_str()) == 0);
    std::map<std::string, std::vector<float>> want;
    for (const auto& [name, t] : ddp::train::read_safetensors(dir.file("ref.safetensors")).tensors) {
      REQUIRE(t.shape == std::vector<std::int64_t>{32, 32, 3});
      want[name] = t.as<float>();
    }
    CifarBinaryDataset plain({dir.file("t.bin")});
    for (std::size_t i = 0; i < 4; ++i) CHECK(close(image_of(plain, i, 0), want.at("plain." + std::to_string(i))));
    CifarBinaryDataset aug({dir.file("t.bin")}, {.augment = true, .seed = 3});
    std::set<std::string> hit;
    for (std::uint64_t epoch = 0; epoch < 60; ++epoch) {
      const auto img = image_of(aug, 0, epoch);
      int matches = 0;
      for (const auto& [name, view] : want)
        if (name.rfind("view.", 0) == 0 && close(img, view)) {
          ++matches;
          hit.insert(name);
        }
      CHECK(matches == 1);
    }
    CHECK(hit.size() > 40);  // 60 draws over 162 views
  }

  TEST_CASE("cifar10 format: scikit-learn digits converted by the reference script load with their labels") {
    if (std::system("/usr/bin/python3 -c 'import sklearn' >/dev/null 2>&1") != 0) {
      MESSAGE("skipped: /usr/bin/python3 cannot import sklearn (apt install python3-sklearn)");
      return;
    }
    CifarDir dir;
    const fs::path script =
        fs::path(__FILE__).parent_path().parent_path().parent_path() / "interop" / "reference" / "digits_to_cifar_format.py";
    const std::string cmd =
        "/usr/bin/python3 " + script.string() + " " + dir.path.string() + " --size 16 --channels 3 > /dev/null";
    REQUIRE(std::system(cmd.c_str()) == 0);
    auto meta = nlohmann::json::parse(std::ifstream(dir.file("digits_meta.json")));
    CifarOptions o{.format = {.height = 16, .width = 16, .channels = 3, .num_classes = 10},
                   .mean = meta["mean"].get<std::vector<float>>(),
                   .std = meta["std"].get<std::vector<float>>()};
    CifarBinaryDataset train({dir.file("digits_train.bin")}, o);
    CifarBinaryDataset test({dir.file("digits_test.bin")}, o);
    CHECK(train.size() == 1438);
    CHECK(test.size() == 359);
    std::vector<int> per_class(10, 0);
    double sum = 0, sum2 = 0;
    for (std::size_t i = 0; i < train.size(); ++i) {
      ++per_class[static_cast<std::size_t>(train.label(i))];
      auto img = image_of(train, i, 0);
      for (float v : img) {
        sum += v;
        sum2 += double{v} * v;
      }
    }
    for (int c : per_class) CHECK(c > 120);  // ~180 digits per class in sklearn's set
    // Normalised with the training set's own statistics: mean 0, variance 1.
    const double n = static_cast<double>(train.size()) * 16 * 16 * 3;
    CHECK(sum / n == doctest::Approx(0.0).epsilon(1e-3).scale(1));
    CHECK(sum2 / n == doctest::Approx(1.0).epsilon(1e-3));
  }
}
