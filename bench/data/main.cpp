// bench_data: images per second that the ImageFolder DataLoader decodes and augments with the training
// transform (RandomResizedCrop(S) + RandomHorizontalFlip + ToTensor + Normalize, S = 224), per worker count.
// SPDX-License-Identifier: MIT
//
// Usage: bench_data --data_dir TREE [--workers 1,2] [--epochs 3] [--batch_size 32] [--crop 224]
//   TREE: an ImageFolder tree (compare.py writes one with PIL and runs torch_loader.py beside this).
// Expected output: one JSON object per worker count, e.g.
//   {"bench":"data","impl":"ddp","workers":2,"batch_size":32,"crop":224,"epochs":3,"images":1200,
//    "seconds":4.1,"images_per_sec":292.7,"images_per_sec_per_core":146.3}
// Timing: one untimed warm-up epoch (the page cache, the first allocations, the threads' start), then
// --epochs epochs timed end to end, epoch boundaries included (the loader drains and restarts its workers
// there, as torchvision's does). A whole epoch rather than the first batch is left out because with W
// workers the batches after the first are already being assembled while it is awaited, so timing from the
// first batch would credit work done before the clock started. The consumer only takes each batch.
// Per core = images_per_sec / workers: the loader's num_workers threads do all the decoding and transforms;
// the consumer thread only waits (torch_loader.py divides by its worker processes the same way).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <ddp/data/distributed_sampler.hpp>
#include <ddp/data/image_folder.hpp>
#include <ddp/data/loader.hpp>

using namespace ddp;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string data_dir;
  std::vector<std::size_t> workers{1, 2};
  int epochs = 3;
  std::size_t batch_size = 32;
  std::int64_t crop = 224;
};

// Images seen in `epochs` epochs of `loader`, starting at epoch `first`.
std::size_t run_epochs(data::DataLoader& loader, std::uint64_t first, int epochs) {
  std::size_t images = 0;
  for (std::uint64_t e = first; e < first + static_cast<std::uint64_t>(epochs); ++e) {
    loader.start_epoch(e);
    while (auto batch = loader.next()) images += batch->size();
  }
  return images;
}

nlohmann::ordered_json measure(const data::ImageFolder& ds, const Args& a, std::size_t workers) {
  data::DistributedSampler sampler(ds.size(), {.shuffle = true, .seed = 1});
  // torch's DataLoader keeps prefetch_factor (2) batches per worker in flight; the same here.
  data::DataLoader loader(ds, sampler, {.batch_size = a.batch_size, .prefetch = 2 * workers, .num_workers = workers});
  run_epochs(loader, 0, 1);  // warm-up
  const auto t0 = Clock::now();
  const std::size_t images = run_epochs(loader, 1, a.epochs);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return {{"bench", "data"}, {"impl", "ddp"}, {"workers", workers}, {"batch_size", a.batch_size},
          {"crop", a.crop}, {"epochs", a.epochs}, {"images", images}, {"seconds", s},
          {"images_per_sec", images / s}, {"images_per_sec_per_core", images / s / static_cast<double>(workers)}};
}

std::vector<std::size_t> parse_list(const char* s) {
  std::vector<std::size_t> out;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    const long v = std::strtol(p, &end, 10);
    if (end == p || v < 1) return {};
    out.push_back(static_cast<std::size_t>(v));
    p = *end == ',' ? end + 1 : end;
    if (*end != ',' && *end != '\0') return {};
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  bool ok = true;
  for (int i = 1; i < argc && ok; ++i) {
    const bool has_value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--data_dir") && has_value) {
      a.data_dir = argv[++i];
    } else if (!std::strcmp(argv[i], "--workers") && has_value) {
      a.workers = parse_list(argv[++i]);
      ok = !a.workers.empty();
    } else if (!std::strcmp(argv[i], "--epochs") && has_value) {
      a.epochs = std::atoi(argv[++i]);
      ok = a.epochs >= 1;
    } else if (!std::strcmp(argv[i], "--batch_size") && has_value) {
      a.batch_size = static_cast<std::size_t>(std::max(1, std::atoi(argv[++i])));
    } else if (!std::strcmp(argv[i], "--crop") && has_value) {
      a.crop = std::max(1, std::atoi(argv[++i]));
    } else {
      ok = false;
    }
  }
  if (!ok || a.data_dir.empty()) {
    std::fprintf(stderr,
                 "usage: %s --data_dir TREE [--workers 1,2] [--epochs N>=1] [--batch_size 32] [--crop 224]\n"
                 "  TREE: root/<class>/<image>.jpg (bench/data/compare.py writes one)\n",
                 argv[0]);
    return 2;
  }
  try {
    const data::ImageFolder ds(a.data_dir, {.train = true, .crop_size = a.crop, .seed = 1});
    for (std::size_t w : a.workers) {
      std::printf("%s\n", measure(ds, a, w).dump().c_str());
      std::fflush(stdout);
    }
  } catch (const ddp::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
