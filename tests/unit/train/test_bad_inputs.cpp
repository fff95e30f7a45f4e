// train: tables of bad snapshot files, failed snapshot saves, bad snapshot paths for the broadcast, and bad
// DDP_* knobs, each with the exact error type and the key words of its message; and no data lost on the way.
// SPDX-License-Identifier: MIT
//
// "No data lost" is checked on every row, not just the error: loading a bad snapshot leaves the bad file,
// the good `<path>.prev` next to it, the model and the optimizer byte for byte as they were (so the user
// can still restore .prev); a failed save leaves the previous snapshot and its .prev as they were and no
// `<path>.tmp` behind. Single-file defects of the safetensors format itself are in test_safetensors.cpp;
// this table is about whole snapshots as the resnet and multinode examples write and resume them.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <cxxopts.hpp>
#include <ddp/comm/tcp/tcp_communicator.hpp>
#include <ddp/env/env.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/store/hash_store.hpp>
#include <ddp/train/checkpoint.hpp>
#include <ddp/train/options.hpp>
#include <ddp/train/snapshot_sync.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "support/files.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace ddp;
using Bytes = std::vector<std::uint8_t>;
using Model = nn::ResNet<float, Cpu>;
using Sgd = optim::SGD<float, Cpu>;

namespace {

struct BadInputDir : ddp::test::TempDir {
  BadInputDir() : ddp::test::TempDir("ddp_bad_") {}
};

Model resnet(const std::string& arch, std::int64_t classes, std::uint64_t seed) {
  return Model({.arch = arch, .num_classes = classes, .seed = seed, .width = 4});
}

// Momentum buffers with recognisable values for every parameter (what a trained optimizer holds).
void fill_momentum(Sgd& opt, float base) {
  for (std::size_t i = 0; i < opt.parameters().size(); ++i) {
    auto& b = opt.set_momentum_buffer(i);
    for (std::int64_t k = 0; k < b.numel(); ++k) b.data()[k] = base + 0.001f * static_cast<float>(k % 97);
  }
  opt.set_steps(3);
}

// Every byte of state a load may change: parameters, buffers, momentum buffers (and which exist), steps.
Bytes state_of(Model& m, Sgd& opt) {
  Bytes out;
  auto put = [&](const void* p, std::size_t n) {
    out.insert(out.end(), static_cast<const std::uint8_t*>(p), static_cast<const std::uint8_t*>(p) + n);
  };
  for (auto* p : m.parameters()) put(p->value().data(), p->value().bytes());
  for (auto* b : m.buffers()) put(b->data(), b->bytes());
  for (std::size_t i = 0; i < opt.parameters().size(); ++i) {
    const auto* buf = opt.momentum_buffer(i);
    out.push_back(buf ? 1 : 0);
    if (buf) put(buf->data(), buf->bytes());
  }
  const std::int64_t steps = opt.steps();
  put(&steps, sizeof(steps));
  return out;
}

// The snapshot `bytes` rewritten tensor by tensor: edit(name, entry) returns false to drop the tensor.
// Metadata edits go through `meta`.
Bytes rewrite(const Bytes& bytes, const std::function<bool(const std::string&, train::TensorEntry&)>& edit,
              const std::function<void(std::map<std::string, std::string>&)>& meta = nullptr) {
  train::SafetensorsFile f = train::parse_safetensors(bytes);
  if (meta) meta(f.metadata);
  train::SafetensorsWriter w;
  for (const auto& name : f.order) {
    train::TensorEntry e = f.tensors.at(name);
    if (!edit(name, e)) continue;
    w.add(name, e.dtype, e.shape, e.data);
  }
  for (const auto& [k, v] : f.metadata) w.set_metadata(k, v);
  // Keep the checksum consistent with the edited data, so the row reaches the check it is about.
  if (f.metadata.count("ddp.data_hash")) w.set_metadata("ddp.data_hash", train::detail::hex64(w.data_hash()));
  return w.serialize();
}

bool keep_all(const std::string&, train::TensorEntry&) { return true; }

// `bytes` plus one more F32 tensor `name` of shape {2}.
Bytes with_extra_tensor(const Bytes& bytes, const std::string& name) {
  train::SafetensorsFile f = train::parse_safetensors(bytes);
  train::SafetensorsWriter w;
  for (const auto& n : f.order) {
    const train::TensorEntry& e = f.tensors.at(n);
    w.add(n, e.dtype, e.shape, e.data);
  }
  const float two[2] = {1.0f, 2.0f};
  w.add(name, DType::F32, {2}, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(two), sizeof two));
  for (const auto& [k, v] : f.metadata) w.set_metadata(k, v);
  if (f.metadata.count("ddp.data_hash")) w.set_metadata("ddp.data_hash", train::detail::hex64(w.data_hash()));
  return w.serialize();
}

std::uint64_t header_length(const Bytes& b) {
  std::uint64_t n = 0;
  std::memcpy(&n, b.data(), 8);
  return n;
}

void check_contains_all(const std::string& what, const std::vector<std::string>& words) {
  for (const auto& w : words) {
    CAPTURE(w);
    CHECK(what.find(w) != std::string::npos);
  }
}

// Runs f, which must throw exactly E; returns the message ("" and a failed check otherwise).
template <class E>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL_CHECK("wrong exception type: " << e.what());
    return {};
  }
  FAIL_CHECK("no exception");
  return {};
}

}  // namespace

TEST_SUITE("train") {
  TEST_CASE("bad snapshot files: IoError naming file and tensor; file, .prev, model and optimizer untouched (table)") {
    BadInputDir dir;
    const std::string path = dir.file("snap.safetensors");
    const std::string prev = path + ".prev";
    // A good snapshot with a good .prev beside it, as two epochs of the examples leave them.
    Model r18 = resnet("resnet18", 10, 1);
    Sgd o18(r18, {.lr = 0.1, .momentum = 0.9});
    fill_momentum(o18, 0.5f);
    train::save_snapshot(path, r18, o18, {.epoch = 1});
    train::save_snapshot(path, r18, o18, {.epoch = 2});
    const Bytes good = ddp::test::slurp_bytes(path), good_prev = ddp::test::slurp_bytes(prev);
    REQUIRE(train::read_safetensors(prev).metadata.at("epoch") == "1");

    // Snapshots of other models, for the wrong-architecture rows.
    auto snapshot_of = [](const std::string& arch, std::int64_t classes) {
      Model m = resnet(arch, classes, 2);
      Sgd o(m, {.lr = 0.1, .momentum = 0.9});
      fill_momentum(o, 0.25f);
      return train::serialize_snapshot(m, o, {.epoch = 4});
    };
    const std::string r18_name = "ResNet(resnet18, num_classes=10, width=4)";
    const std::string file = "ddp: safetensors file '" + path + "': ";
    const std::string ckpt = "ddp: checkpoint '" + path + "'";

    struct Row {
      const char* name;
      Bytes bytes;                     // what the file at `path` holds
      std::vector<std::string> words;  // the message must contain each of these
    };
    Bytes flip_length = good;
    flip_length[7] ^= 0x80;  // bit 63 of the header length
    Bytes past_end = good;
    const std::uint64_t too_long = good.size();  // 8 + N > size
    std::memcpy(past_end.data(), &too_long, 8);
    Bytes flip_json = good;
    flip_json[8] ^= 0x01;  // '{' -> 'z'
    Bytes not_json = good;
    std::memset(not_json.data() + 8, 'x', header_length(good));
    Bytes json_array = good;
    json_array[8] = '[';
    json_array[8 + header_length(good) - 1] = ']';
    std::memset(json_array.data() + 9, ' ', header_length(good) - 2);
    Bytes offset_flip = good;
    {
      // "data_offsets":[0, -> "data_offsets":[1, : a one-bit flip in the header that keeps the JSON valid.
      const std::string needle = "\"data_offsets\":[0,";
      auto it = std::search(offset_flip.begin(), offset_flip.end(), needle.begin(), needle.end());
      REQUIRE(it != offset_flip.end());
      *(it + static_cast<std::ptrdiff_t>(needle.size()) - 2) ^= 0x01;
    }
    Bytes data_flip = good;
    data_flip[data_flip.size() - 3] ^= 0x10;  // inside the last tensor's bytes
    const Bytes gzip = {0x1f, 0x8b, 0x08, 0x00, 0x5e, 0x6f, 0x01, 0x66, 0x00, 0x03, 0xed, 0xc1};

    const Row rows[] = {
        {"empty file", {}, {file, "only 0 bytes, too short for the 8-byte header length; the file is truncated"}},
        {"cut to 7 bytes", Bytes(good.begin(), good.begin() + 7), {file, "only 7 bytes", "the file is truncated"}},
        {"cut in half",
         Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(good.size() / 2)),
         {file, "run past the data section of", "the file is truncated"}},
        {"cut inside the header", Bytes(good.begin(), good.begin() + 100),
         {file, "runs past the end of the 100-byte file; the file is truncated or not a safetensors file"}},
        {"last byte missing", Bytes(good.begin(), good.end() - 1), {file, "run past the data section", "truncated"}},
        {"bit 63 of the header length flipped", flip_length,
         {file, "exceeds the limit of 100000000 bytes; the file is corrupt or not a safetensors file"}},
        {"header length past the end", past_end,
         {file, "header length " + std::to_string(too_long) + " runs past the end of the " +
                    std::to_string(good.size()) + "-byte file"}},
        {"bit flip in the header's first byte", flip_json, {file, "-byte header is not valid JSON", "corrupt"}},
        {"header is not JSON", not_json, {file, "-byte header is not valid JSON"}},
        {"header is a JSON array", json_array, {file, "the header is not a JSON object; this is not a safetensors file"}},
        {"bit flip in a data offset", offset_flip, {file, "data_offsets [1, ", "hold"}},
        {"bit flip in the data section", data_flip,
         {"ddp: snapshot '" + path + "'", "checksum", "corrupt", path + ".prev"}},
        {"a gzip'ed snapshot", gzip, {file, "exceeds the limit of 100000000 bytes", "not a safetensors file"}},
        {"a resnet50 snapshot into resnet18", snapshot_of("resnet50", 10),
         {ckpt, "tensor 'optimizer.momentum_buffer.layer1.0.conv1.weight' has shape [4, 4, 1, 1] but " + r18_name +
                    " needs [4, 4, 3, 3]",
          "(the file was written for ResNet(resnet50, num_classes=10, width=4))", "wrong --arch or --num-classes?"}},
        {"a resnet34 snapshot into resnet18", snapshot_of("resnet34", 10),
         {ckpt, "holds tensor 'layer1.2.", "that " + r18_name + " does not have",
          "(the file was written for ResNet(resnet34", "is it a checkpoint of another architecture?"}},
        {"num_classes 100 into num_classes 10", snapshot_of("resnet18", 100),
         {ckpt, "fc.weight' has shape [100, 32] but " + r18_name + " needs [10, 32]", "wrong --arch or --num-classes?"}},
        {"a tensor missing",
         rewrite(good, [](const std::string& n, train::TensorEntry&) { return n != "bn1.running_mean"; }),
         {ckpt + " has no tensor 'bn1.running_mean' that " + r18_name + " needs (the file was written for " + r18_name +
          "); is it a checkpoint of another architecture?"}},
        {"a weight stored as F64",
         rewrite(good,
                 [](const std::string& n, train::TensorEntry& e) {
                   if (n != "fc.bias") return true;
                   const std::vector<float> f = e.as<float>();
                   const std::vector<double> d(f.begin(), f.end());
                   e.dtype = DType::F64;
                   e.data.assign(reinterpret_cast<const std::uint8_t*>(d.data()),
                                 reinterpret_cast<const std::uint8_t*>(d.data() + d.size()));
                   return true;
                 }),
         {ckpt + ": tensor 'fc.bias' has dtype F64 but the model holds F32; convert the file (e.g. .float())"}},
        {"num_batches_tracked stored as F32",
         rewrite(good,
                 [](const std::string& n, train::TensorEntry& e) {
                   if (n != "bn1.num_batches_tracked") return true;
                   const float one = 1.0f;
                   e.dtype = DType::F32;
                   e.data.assign(reinterpret_cast<const std::uint8_t*>(&one),
                                 reinterpret_cast<const std::uint8_t*>(&one) + 4);
                   return true;
                 }),
         {ckpt + ": tensor 'bn1.num_batches_tracked' has dtype F32 but the model holds I64"}},
        {"a momentum buffer with a transposed shape",
         rewrite(good,
                 [](const std::string& n, train::TensorEntry& e) {
                   if (n == "optimizer.momentum_buffer.fc.weight") e.shape = {32, 10};
                   return true;
                 }),
         {ckpt + ": tensor 'optimizer.momentum_buffer.fc.weight' has shape [32, 10] but " + r18_name +
          " needs [10, 32]"}},
        {"epoch is not a number", rewrite(good, keep_all, [](auto& m) { m["epoch"] = "two"; }),
         {"ddp: snapshot '" + path + "': metadata 'epoch' = 'two' is not an integer; the file is corrupt"}},
        {"a negative epoch", rewrite(good, keep_all, [](auto& m) { m["epoch"] = "-3"; }),
         {"ddp: snapshot '" + path + "': metadata 'epoch' = -3 is out of range [0, 9223372036854775807]; the file is "
                                     "corrupt"}},
        {"a negative rng.stream", rewrite(good, keep_all, [](auto& m) { m["rng.stream"] = "-1"; }),
         {"ddp: snapshot '" + path + "': metadata 'rng.stream' = -1 is out of range [0, 4294967295]"}},
        {"a negative rng.offset", rewrite(good, keep_all, [](auto& m) { m["rng.offset"] = "-5"; }),
         {"ddp: snapshot '" + path + "': metadata 'rng.offset' = '-5' is not an unsigned 64-bit integer; the file "
                                     "is corrupt"}},
        {"a momentum buffer for a parameter the model lacks",
         with_extra_tensor(good, "optimizer.momentum_buffer.layer9.0.conv1.weight"),
         {"ddp: snapshot '" + path + "' has momentum buffer 'optimizer.momentum_buffer.layer9.0.conv1.weight' for a "
          "parameter that " +
          r18_name + " does not have; was it written for another --arch or model?"}},
        {"rng.seed missing", rewrite(good, keep_all, [](auto& m) { m.erase("rng.seed"); }),
         {"ddp: snapshot '" + path + "' has no metadata 'rng.seed'; it is not a ddp snapshot"}},
        {"ddp.kind missing (a foreign safetensors file)", rewrite(good, keep_all, [](auto& m) { m.erase("ddp.kind"); }),
         {"ddp: '" + path + "' is not a ddp snapshot (metadata ddp.kind is missing); pass a snapshot a training run "
                            "saved (save_snapshot)"}},
    };
    for (const auto& r : rows) {
      const std::string row = r.name;
      CAPTURE(row);
      ddp::test::spit(path, r.bytes);
      Model target = resnet("resnet18", 10, 7);
      Sgd topt(target, {.lr = 0.1, .momentum = 0.9});
      fill_momentum(topt, -1.0f);
      const Bytes before = state_of(target, topt);
      const std::string msg = error_of<IoError>([&] { train::load_snapshot(path, target, topt); });
      check_contains_all(msg, r.words);
      // The broadcast path (rank 0 reads the bytes, every rank parses them) says the same.
      const std::string via_bytes = error_of<IoError>([&] { train::load_snapshot_bytes(ddp::test::slurp_bytes(path), target, topt, path); });
      CHECK(via_bytes == msg);
      CHECK(state_of(target, topt) == before);
      CHECK(ddp::test::slurp_bytes(path) == r.bytes);
      CHECK(ddp::test::slurp_bytes(prev) == good_prev);
      CHECK_FALSE(fs::exists(path + ".tmp"));
    }
    // The good files still load after all that.
    ddp::test::spit(path, good);
    Model back = resnet("resnet18", 10, 9);
    Sgd bopt(back, {.lr = 0.1, .momentum = 0.9});
    CHECK(train::load_snapshot(path, back, bopt).epoch == 2);
    CHECK(state_of(back, bopt) == state_of(r18, o18));
    CHECK(train::load_snapshot(prev, back, bopt).epoch == 1);
  }

  TEST_CASE("snapshots keep the whole 64-bit range of rng.seed and rng.offset (written unsigned, read unsigned)") {
    Model m = resnet("resnet18", 10, 1);
    Sgd opt(m, {.lr = 0.1, .momentum = 0.9});
    train::SnapshotInfo info{.epoch = 3};
    info.rng.seed = 0xFEDCBA9876543210ull;  // above INT64_MAX: std::stoll would call it "not an integer"
    info.rng.offset = ~std::uint64_t{0};
    info.rng.rank = 4000000000u;
    const train::SnapshotInfo back = train::load_snapshot_bytes(train::serialize_snapshot(m, opt, info), m, opt);
    CHECK(back.rng.seed == info.rng.seed);
    CHECK(back.rng.offset == info.rng.offset);
    CHECK(back.rng.rank == info.rng.rank);
    CHECK(back.epoch == 3);
  }

  TEST_CASE("failed snapshot saves: IoError naming the path and the step; the previous snapshot is intact (table)") {
    BadInputDir dir;
    const std::string path = dir.file("snap.safetensors");
    const std::string prev = path + ".prev", tmp = path + ".tmp";
    Model m = resnet("resnet18", 10, 1);
    Sgd opt(m, {.lr = 0.1, .momentum = 0.9});
    fill_momentum(opt, 0.5f);
    train::save_snapshot(path, m, opt, {.epoch = 1});
    train::save_snapshot(path, m, opt, {.epoch = 2});
    const Bytes old = ddp::test::slurp_bytes(path), old_prev = ddp::test::slurp_bytes(prev);
    const std::string fix = "; check that the directory exists, is writable and has space";

    struct Row {
      const char* name;
      std::function<void()> sabotage, repair;
      std::vector<std::string> words;
      bool prev_replaced_by_dir = false;  // the row turned .prev itself into the obstacle
    };
    rlimit saved_limit{};
    ::getrlimit(RLIMIT_FSIZE, &saved_limit);
    sighandler_t saved_xfsz = SIG_DFL;
    const Row rows[] = {
        {"<path>.tmp is a directory", [&] { fs::create_directories(tmp + "/x"); }, [&] { fs::remove_all(tmp); },
         {"ddp: cannot write safetensors file '" + path + "': open('" + tmp + "') failed: Is a directory" + fix}},
        {"<path>.prev is a directory",
         [&] {
           fs::remove(prev);
           fs::create_directories(prev + "/x");
         },
         [&] {
           fs::remove_all(prev);
           ddp::test::spit(prev, old_prev);
         },
         // .prev is replaced by renaming a hard link over it (atomic_file.hpp), which a directory refuses
         {"ddp: cannot write safetensors file '" + path + "': rename('" + prev + ".tmp', '" + prev +
          "') failed: Is a directory" + fix},
         true},
        {"the disk fills up (RLIMIT_FSIZE 4 KiB)",
         [&] {
           saved_xfsz = ::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of the signal
           rlimit small = saved_limit;
           small.rlim_cur = 4096;
           ::setrlimit(RLIMIT_FSIZE, &small);
         },
         [&] {
           ::setrlimit(RLIMIT_FSIZE, &saved_limit);
           ::signal(SIGXFSZ, saved_xfsz);
         },
         {"ddp: cannot write safetensors file '" + path + "': write('" + tmp + "') failed: File too large" + fix}},
    };
    for (const auto& r : rows) {
      const std::string row = r.name;
      CAPTURE(row);
      r.sabotage();
      fill_momentum(opt, 9.0f);  // different bytes from what is on disk
      const std::string msg = error_of<IoError>([&] { train::save_snapshot(path, m, opt, {.epoch = 3}); });
      r.repair();
      check_contains_all(msg, r.words);
      CHECK(ddp::test::slurp_bytes(path) == old);
      if (!r.prev_replaced_by_dir) CHECK(ddp::test::slurp_bytes(prev) == old_prev);
      CHECK_FALSE(fs::exists(tmp));
    }
    // A directory where the snapshot should be: refused without moving it aside as `.prev`.
    const std::string dir_path = dir.file("is_a_dir");
    fs::create_directories(dir_path + "/keep");
    const std::string msg = error_of<IoError>([&] { train::save_snapshot(dir_path, m, opt, {.epoch = 3}); });
    check_contains_all(msg, {"ddp: cannot write safetensors file '" + dir_path + "'", "Is a directory"});
    CHECK(fs::is_directory(dir_path + "/keep"));
    CHECK_FALSE(fs::exists(dir_path + ".prev"));
    CHECK_FALSE(fs::exists(dir_path + ".tmp"));
    // After the failures the next save works and rotates as usual.
    train::save_snapshot(path, m, opt, {.epoch = 3});
    CHECK(ddp::test::slurp_bytes(prev) == old);
    CHECK(train::read_safetensors(path).metadata.at("epoch") == "3");
  }

  TEST_CASE("bad snapshot paths for read_and_broadcast: IoError on rank 0 instead of a silent fresh start (table)") {
    BadInputDir dir;
    store::HashStore hs(std::chrono::seconds(5));
    comm::TcpCommunicator comm(env::LaunchInfo{.rank = 0, .world_size = 1, .master_addr = "127.0.0.1"}, hs,
                               {.timeout = std::chrono::seconds(5)});
    struct Row {
      const char* name;
      std::string path;
      std::function<void(const std::string&)> make;
      std::vector<std::string> words;
    };
    const Row rows[] = {
        {"a directory", dir.file("d"), [](const std::string& p) { fs::create_directories(p); },
         {"ddp: snapshot '", "d' is not a regular file", "check the path given to the program's snapshot flag"}},
        // An empty file is a cut-short snapshot: starting from scratch would let the next save rotate it
        // over the good .prev.
        {"an empty file", dir.file("empty.safetensors"), [](const std::string& p) { ddp::test::spit(p, {}); },
         {"ddp: snapshot '", "empty.safetensors' is empty (0 bytes)", "empty.safetensors.prev", "delete"}},
    };
    for (const auto& r : rows) {
      const std::string row = r.name;
      CAPTURE(row);
      r.make(r.path);
      const std::string msg = error_of<IoError>([&] { (void)train::read_and_broadcast(comm, r.path); });
      check_contains_all(msg, r.words);
      CHECK(fs::exists(r.path));
    }
    // No file at all is the normal first start: nothing to resume.
    CHECK(train::read_and_broadcast(comm, dir.file("none.safetensors")).empty());
  }

  TEST_CASE("bad DDP_* knobs and distributed flags name the variable and the flag (table)") {
    struct Row {
      const char* name;
      env::Env env;
      std::vector<std::string> args;
      std::string message;
    };
    const Row rows[] = {
        {"DDP_TIMEOUT_MS not a number", env::Env::from({{"DDP_TIMEOUT_MS", "30s"}}), {},
         "ddp: DDP_TIMEOUT_MS='30s' is not a whole number of milliseconds; unset it or pass --timeout-ms=<ms>."},
        {"DDP_TIMEOUT_MS zero", env::Env::from({{"DDP_TIMEOUT_MS", "0"}}), {},
         "ddp: --timeout-ms must be > 0, got 0 (DDP_TIMEOUT_MS)"},
        {"--timeout-ms negative", env::Env{}, {"--timeout-ms=-5"}, "ddp: --timeout-ms must be > 0, got -5 (DDP_TIMEOUT_MS)"},
        {"DDP_STORE_PORT not a number", env::Env::from({{"DDP_STORE_PORT", "auto"}}), {},
         "ddp: DDP_STORE_PORT='auto' is not a TCP port; unset it or pass --store-port=<1..65535>."},
        {"DDP_STORE_PORT out of range", env::Env::from({{"DDP_STORE_PORT", "70000"}}), {},
         "ddp: --store-port must be in [0, 65535], got 70000 (DDP_STORE_PORT)"},
        {"--store-port negative", env::Env{}, {"--store-port=-1"},
         "ddp: --store-port must be in [0, 65535], got -1 (DDP_STORE_PORT)"},
        {"--gradient-as-bucket-view not a switch value", env::Env{}, {"--gradient-as-bucket-view=maybe"},
         "ddp: --gradient-as-bucket-view takes true or false (also 1/0, on/off, yes/no), got 'maybe'"},
        {"--shm not a switch value", env::Env{}, {"--shm=maybe"},
         "ddp: --shm (DDP_SHM) takes true or false (also 1/0, on/off, yes/no), got 'maybe'"},
        {"DDP_SHM not a switch value", env::Env::from({{"DDP_SHM", "auto"}}), {},
         "ddp: --shm (DDP_SHM) takes true or false (also 1/0, on/off, yes/no), got 'auto'"},
    };
    for (const auto& r : rows) {
      const std::string row = r.name;
      CAPTURE(row);
      auto run = [&] {
        cxxopts::Options options("prog");
        train::add_dist_options(options, r.env);
        std::vector<std::string> argv{"prog"};
        argv.insert(argv.end(), r.args.begin(), r.args.end());
        std::vector<const char*> cargv;
        for (const auto& a : argv) cargv.push_back(a.c_str());
        auto parsed = options.parse(static_cast<int>(cargv.size()), cargv.data());
        (void)train::read_dist_flags(parsed);
      };
      CHECK_THROWS_WITH_AS(run(), r.message.c_str(), ConfigError);
    }
  }

  TEST_CASE("--shm and DDP_SHM: on by default; false, 0, off and no turn it off (\"false\" used to mean on)") {
    auto shm = [](env::Env e, std::vector<std::string> args) {
      cxxopts::Options options("prog");
      train::add_dist_options(options, e);
      args.insert(args.begin(), "prog");
      std::vector<const char*> cargv;
      for (const auto& a : args) cargv.push_back(a.c_str());
      auto parsed = options.parse(static_cast<int>(cargv.size()), cargv.data());
      return train::read_dist_flags(parsed).shm;
    };
    CHECK(shm(env::Env{}, {}));
    CHECK(shm(env::Env{}, {"--shm=true"}));
    for (const char* off : {"--shm=false", "--shm=0", "--shm=off", "--shm=no"}) {
      CAPTURE(off);
      CHECK_FALSE(shm(env::Env{}, {off}));
    }
    CHECK_FALSE(shm(env::Env::from({{"DDP_SHM", "false"}}), {}));
    CHECK(shm(env::Env::from({{"DDP_SHM", "0"}}), {"--shm=1"}));  // the flag wins over the variable
  }

  TEST_CASE("--gradient-as-bucket-view: unset leaves the device's default (views on CPU, copies on CUDA)") {
    auto flags = [](std::vector<std::string> args) {
      cxxopts::Options options("prog");
      train::add_dist_options(options, env::Env{});
      args.insert(args.begin(), "prog");
      std::vector<const char*> cargv;
      for (const auto& a : args) cargv.push_back(a.c_str());
      auto parsed = options.parse(static_cast<int>(cargv.size()), cargv.data());
      return train::read_dist_flags(parsed).ddp;
    };
    const parallel::DdpOptions unset = flags({});
    CHECK_FALSE(unset.gradient_as_bucket_view.has_value());
    CHECK(unset.grads_in_buckets<Cpu>());
    CHECK_FALSE(unset.grads_in_buckets<Cuda>());
    for (const char* on : {"--gradient-as-bucket-view", "--gradient-as-bucket-view=true", "--gradient-as-bucket-view=ON"}) {
      CAPTURE(on);
      const parallel::DdpOptions o = flags({on});
      CHECK(o.grads_in_buckets<Cpu>());
      CHECK(o.grads_in_buckets<Cuda>());
    }
    for (const char* off : {"--gradient-as-bucket-view=false", "--gradient-as-bucket-view=0"}) {
      CAPTURE(off);
      const parallel::DdpOptions o = flags({off});
      CHECK_FALSE(o.grads_in_buckets<Cpu>());
      CHECK_FALSE(o.grads_in_buckets<Cuda>());
    }
  }
}
