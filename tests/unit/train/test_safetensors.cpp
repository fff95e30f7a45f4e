// train: safetensors read/write, atomic replacement, every class of bad file, and interop with PyTorch.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ddp/train/safetensors.hpp>
#include <ddp/train/safetensors_writer.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/files.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using ddp::DType;
using ddp::train::read_safetensors;
using ddp::train::SafetensorsReader;
using ddp::train::SafetensorsWriter;

namespace {

struct SafetensorsDir : ddp::test::TempDir {
  SafetensorsDir() : ddp::test::TempDir("ddp_st_") {}
};

// A file with the given header text and `data_bytes` zero bytes of data; `length` overrides N.
std::vector<std::uint8_t> make_raw(const std::string& header, std::size_t data_bytes, std::uint64_t length = ~0ull) {
  std::uint64_t n = length == ~0ull ? header.size() : length;
  std::vector<std::uint8_t> out(8 + header.size() + data_bytes, 0);
  std::memcpy(out.data(), &n, 8);
  if (!header.empty()) std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

std::string bad_file(const SafetensorsDir& dir, const std::string& header, std::size_t data_bytes,
                     std::uint64_t length = ~0ull) {
  std::string p = dir.file("bad.safetensors");
  ddp::test::spit(p, make_raw(header, data_bytes, length));
  return p;
}

}  // namespace

TEST_SUITE("train") {
  TEST_CASE("safetensors: exact bytes of a one-tensor file match the format") {
    SafetensorsWriter w;
    w.add<float>("a", {1}, std::vector<float>{1.0f});
    auto bytes = w.serialize();
    // Independent reference: header JSON written by hand, padded with spaces to 56 bytes (a multiple of 8).
    std::string json = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
    REQUIRE(json.size() == 54);
    json.append(2, ' ');
    auto expected = make_raw(json, 4);
    const float one = 1.0f;
    std::memcpy(expected.data() + 8 + 56, &one, 4);
    CHECK(bytes == expected);
    CHECK(bytes.size() == 8 + 56 + 4);
  }

  TEST_CASE("safetensors: write then read round-trips dtypes, shapes, metadata and order") {
    SafetensorsDir dir;
    std::string p = dir.file("m.safetensors");
    SafetensorsWriter w;
    std::vector<float> wts(2 * 3 * 3 * 3);
    for (std::size_t i = 0; i < wts.size(); ++i) wts[i] = 0.5f * static_cast<float>(i) - 3.0f;
    w.add<float>("conv1.weight", {2, 3, 3, 3}, wts);
    w.add<std::int64_t>("bn1.num_batches_tracked", {}, std::vector<std::int64_t>{7});
    w.add<double>("d", {2}, std::vector<double>{1e-300, -2.5});
    w.add<ddp::bfloat16>("bf", {2}, std::vector<ddp::bfloat16>{ddp::bfloat16(1.5f), ddp::bfloat16(-2.0f)});
    w.add<std::uint8_t>("empty", {0, 3}, std::vector<std::uint8_t>{});
    w.add<std::int32_t>("i", {3}, std::vector<std::int32_t>{-1, 0, 1 << 30});
    w.set_metadata("epoch", "3");
    w.set_metadata("arch", "resnet18");
    w.write(p);

    auto bytes = ddp::test::slurp_bytes(p);
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    CHECK(n % 8 == 0);
    CHECK(bytes.size() == 8 + n + wts.size() * 4 + 8 + 16 + 4 + 0 + 12);

    auto f = read_safetensors(p);
    CHECK(f.metadata == std::map<std::string, std::string>{{"epoch", "3"}, {"arch", "resnet18"}});
    CHECK(f.order == std::vector<std::string>{"conv1.weight", "bn1.num_batches_tracked", "d", "bf", "empty", "i"});
    CHECK(f.at("conv1.weight").dtype == DType::F32);
    CHECK(f.at("conv1.weight").shape == std::vector<std::int64_t>{2, 3, 3, 3});
    CHECK(f.at("conv1.weight").as<float>() == wts);
    CHECK(f.at("bn1.num_batches_tracked").shape.empty());
    CHECK(f.at("bn1.num_batches_tracked").as<std::int64_t>() == std::vector<std::int64_t>{7});
    CHECK(f.at("d").as<double>() == std::vector<double>{1e-300, -2.5});
    CHECK(static_cast<float>(f.at("bf").as<ddp::bfloat16>()[0]) == 1.5f);
    CHECK(f.at("empty").shape == std::vector<std::int64_t>{0, 3});
    CHECK(f.at("empty").data.empty());
    CHECK(f.at("i").as<std::int32_t>() == std::vector<std::int32_t>{-1, 0, 1 << 30});
    CHECK_THROWS_WITH_AS(f.at("i").as<float>(),
                         "ddp: tensor holds I32 but was read as F32; convert explicitly or read it "
                         "with the matching element type.",
                         ddp::ValueError);
    CHECK_THROWS_WITH_AS(f.at("fc.weight"),
                         doctest::Contains("ddp: tensor 'fc.weight' is not in the safetensors file "
                                           "(it holds 6 tensors: conv1.weight, bn1.num_batches_tracked"),
                         ddp::IoError);
    // parse_safetensors on the same bytes agrees (the broadcast path: read_file_bytes on rank 0).
    CHECK(ddp::train::read_file_bytes(p) == bytes);
    auto g = ddp::train::parse_safetensors(ddp::train::read_file_bytes(p), "mem");
    CHECK(g.at("conv1.weight").data == f.at("conv1.weight").data);
  }

  TEST_CASE("safetensors: the reader reads single tensors into caller memory") {
    SafetensorsDir dir;
    std::string p = dir.file("r.safetensors");
    SafetensorsWriter w;
    std::vector<float> a{1, 2, 3, 4}, b{5, 6};
    w.add_view("a", DType::F32, {4}, {reinterpret_cast<const std::uint8_t*>(a.data()), 16});
    w.add<float>("b", {2, 1}, b);
    w.write(p);
    SafetensorsReader r(p);
    CHECK(r.contains("a"));
    CHECK(r.info("b").begin == 16);
    CHECK(r.info("b").nbytes() == 8);
    CHECK(r.info("b").numel() == 2);
    std::vector<float> out(2);
    r.read_into("b", {reinterpret_cast<std::uint8_t*>(out.data()), 8});
    CHECK(out == b);
    CHECK(r.read("a").as<float>() == a);
    std::vector<std::uint8_t> small(4);
    CHECK_THROWS_WITH_AS(
        r.read_into("a", small),
        ("ddp: safetensors file '" + p + "': tensor 'a' has 16 bytes (F32 [4]) but the destination holds 4").c_str(),
        ddp::ValueError);
    CHECK_THROWS_WITH_AS(r.info("zz"),
                         ("ddp: safetensors file '" + p +
                          "': tensor 'zz' is not in the file (it holds 2 tensors); the "
                          "checkpoint is for a different model or was written by another program")
                             .c_str(),
                         ddp::IoError);
  }

  TEST_CASE("safetensors: atomic write keeps the previous file and leaves no temp file") {
    SafetensorsDir dir;
    std::string p = dir.file("snap.safetensors");
    {
      SafetensorsWriter w;
      w.add<float>("x", {1}, std::vector<float>{1});
      w.write(p, {.keep_previous = true});  // nothing to keep yet
    }
    CHECK_FALSE(fs::exists(p + ".prev"));
    for (float v : {2.0f, 3.0f}) {
      SafetensorsWriter w;
      w.add<float>("x", {1}, std::vector<float>{v});
      w.write(p, {.keep_previous = true});
    }
    CHECK(read_safetensors(p).at("x").as<float>()[0] == 3.0f);
    CHECK(read_safetensors(p + ".prev").at("x").as<float>()[0] == 2.0f);
    CHECK_FALSE(fs::exists(p + ".tmp"));
    SafetensorsWriter w;
    w.add<float>("x", {1}, std::vector<float>{4});
    w.write(p);  // without keep_previous the old .prev is left alone
    CHECK(read_safetensors(p + ".prev").at("x").as<float>()[0] == 2.0f);
    std::string missing = dir.file("no/such/dir/s.safetensors");
    CHECK_THROWS_WITH_AS(w.write(missing),
                         ("ddp: cannot write safetensors file '" + missing + "': open('" + missing +
                          ".tmp') failed: No such file or directory; check that the directory exists, is writable and "
                          "has space")
                             .c_str(),
                         ddp::IoError);
  }

  TEST_CASE("atomic_file: a failed replacement removes the temp file and leaves the target alone") {
    SafetensorsDir dir;
    const std::string target = dir.file("is_a_dir");
    fs::create_directories(target);
    const std::uint8_t data[3] = {1, 2, 3};
    CHECK_THROWS_WITH_AS(
        ddp::train::write_file_atomic(target, {std::span<const std::uint8_t>(data)}, {}, "metrics file"),
        ("ddp: cannot write metrics file '" + target + "': rename('" + target + ".tmp', '" + target +
         "') failed: Is a directory; check that the directory exists, is writable and has space")
            .c_str(),
        ddp::IoError);
    CHECK(fs::is_directory(target));
    CHECK_FALSE(fs::exists(target + ".tmp"));
    const std::string f = dir.file("plain.bin");
    ddp::train::write_file_atomic(f, {std::span<const std::uint8_t>(data), std::span<const std::uint8_t>(data, 1)});
    CHECK(ddp::test::slurp_bytes(f) == std::vector<std::uint8_t>{1, 2, 3, 1});
  }

  TEST_CASE("safetensors: writer rejects duplicate names, bad sizes and reserved names") {
    SafetensorsWriter w;
    w.add<float>("a", {2}, std::vector<float>{1, 2});
    CHECK_THROWS_WITH_AS(w.add<float>("a", {1}, std::vector<float>{1}),
                         "ddp: tensor 'a' was added twice to a safetensors file; names must be unique",
                         ddp::ValueError);
    CHECK_THROWS_WITH_AS(w.add<float>("b", {3}, std::vector<float>{1, 2}),
                         "ddp: tensor 'b': shape [3] x F32 needs 12 bytes but 8 were given", ddp::ValueError);
    CHECK_THROWS_WITH_AS(w.add<float>("c", {-1}, std::vector<float>{}),
                         "ddp: tensor 'c' has a negative size in shape [-1]", ddp::ValueError);
    CHECK_THROWS_WITH_AS(w.add<float>("__metadata__", {1}, std::vector<float>{1}),
                         "ddp: '__metadata__' cannot be a tensor name in a safetensors file", ddp::ValueError);
    CHECK(w.size() == 1);
  }

  TEST_CASE("safetensors: truncated, corrupt and foreign files are IoErrors naming the file and tensor") {
    SafetensorsDir dir;
    const std::string p = dir.file("bad.safetensors");
    auto msg = [&](const std::string& what) { return "ddp: safetensors file '" + p + "': " + what; };
    auto expect = [&](const std::string& what) {
      CHECK_THROWS_WITH_AS(read_safetensors(p), msg(what).c_str(), ddp::IoError);
    };
    const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

    CHECK_THROWS_WITH_AS(
        read_safetensors(dir.file("missing.safetensors")),
        ("ddp: safetensors file '" + dir.file("missing.safetensors") +
         "': cannot open it for reading (No such file or directory); check the path (the program's snapshot or weights "
         "file flag)")
            .c_str(),
        ddp::IoError);
    CHECK_THROWS_WITH_AS(
        read_safetensors(dir.path.string()),
        ("ddp: safetensors file '" + dir.path.string() +
         "': is not a regular file (a directory?); check the path (the program's snapshot or weights file "
         "flag)")
            .c_str(),
        ddp::IoError);
    CHECK_THROWS_AS(ddp::train::read_file_bytes(dir.path.string()), ddp::IoError);
    ddp::test::spit(p, {1, 2, 3});
    expect("only 3 bytes, too short for the 8-byte header length; the file is truncated");
    bad_file(dir, "{" + ok_entry + "}", 8, 1000);
    expect("header length 1000 runs past the end of the 70-byte file; the file is truncated or not a safetensors file");
    bad_file(dir, "{}", 0, 0xFFFFFFFFFFFFull);
    expect(
        "header length 281474976710655 exceeds the limit of 100000000 bytes; the file is corrupt or not a safetensors "
        "file");
    bad_file(dir, "", 0, 0);
    expect("header length 0 is too small for a JSON object");
    // A truncated copy of a good file: the last tensor runs past the end.
    {
      SafetensorsWriter w;
      w.add<float>("a", {2}, std::vector<float>{1, 2});
      w.add<float>("b", {4}, std::vector<float>{1, 2, 3, 4});
      auto bytes = w.serialize();
      bytes.resize(bytes.size() - 3);
      ddp::test::spit(p, bytes);
      expect("tensor 'b': data_offsets [8, 24] run past the data section of 21 bytes; the file is truncated");
    }
    // Foreign file: a PNG-ish prefix decodes to a huge length.
    ddp::test::spit(p, {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A, 0, 0, 0, 0});
    expect(
        "header length 727905341920923785 exceeds the limit of 100000000 bytes; the file is corrupt or not a "
        "safetensors file");
    bad_file(dir, "{\"a\": [1, 2", 0);
    CHECK_THROWS_WITH_AS(read_safetensors(p), doctest::Contains(msg("the 11-byte header is not valid JSON (").c_str()),
                         ddp::IoError);
    bad_file(dir, "[1, 2]  ", 0);
    expect("the header is not a JSON object; this is not a safetensors file");
    bad_file(dir, R"({"a":{"dtype":"I16","shape":[2],"data_offsets":[0,4]}})", 4);
    expect("tensor 'a': dtype 'I16' is not supported (ddp reads F32, F64, BF16, F16, I32, I64, U8)");
    bad_file(dir, R"({"a":{"dtype":7,"shape":[2],"data_offsets":[0,4]}})", 4);
    expect("tensor 'a': \"dtype\" is not a string");
    bad_file(dir, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
    expect("tensor 'a': shape [3] x F32 needs 12 bytes but data_offsets [0, 8] hold 8");
    bad_file(dir, R"({"a":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,8]}})", 8);
    expect("tensor 'a': shape [2,-1] holds a non-integer or negative size");
    bad_file(dir, R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", 8);
    expect("tensor 'a': shape [4611686018427387904,4] is too large");
    bad_file(dir, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8);
    expect("tensor 'a': data_offsets [8, 0] end before they begin");
    bad_file(dir, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8);
    expect("tensor 'a': \"data_offsets\" [0] is not a pair of non-negative integers");
    bad_file(dir, R"({"a":{"dtype":"F32","shape":[2]}})", 8);
    expect("tensor 'a': header entry has no \"data_offsets\"; the file is corrupt");
    bad_file(dir, R"({"a":3})", 8);
    expect("tensor 'a': header entry is not a JSON object; the file is corrupt or not safetensors");
    bad_file(dir, "{" + ok_entry + "," + R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8);
    expect("tensor 'b': data_offsets [4, 8] overlap tensor 'a' (which ends at 8); the file is corrupt");
    bad_file(dir, "{" + ok_entry + "," + R"("b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", 16);
    expect("tensor 'b': data_offsets [12, 16] leave a gap: the previous tensor ends at 8; the file is corrupt");
    bad_file(dir, "{" + ok_entry + "}", 12);
    expect("the tensors cover 8 bytes but the data section holds 12; the file has trailing garbage or a wrong header");
    bad_file(dir, "{" + ok_entry + "," + ok_entry + "}", 8);
    expect("tensor 'a' appears twice in the header; the file is corrupt");
    bad_file(dir, "{" + ok_entry + R"(,"__metadata__":{"epoch":3}})", 8);
    expect("metadata 'epoch' is 3, not a string (safetensors metadata is str -> str)");
    bad_file(dir, "{" + ok_entry + R"(,"__metadata__":[]})", 8);
    expect("\"__metadata__\" is not a JSON object of strings");
    // A nested duplicate key is not a duplicate tensor (only top-level names count) and still parses.
    bad_file(dir, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1,"x":2}})", 8);
    CHECK(read_safetensors(p).at("a").shape == std::vector<std::int64_t>{2});
  }

  TEST_CASE("safetensors: every truncation of a valid file is an IoError, never a crash") {
    SafetensorsWriter w;
    w.add<float>("a", {3}, std::vector<float>{1, 2, 3});
    w.add<std::int64_t>("b", {2}, std::vector<std::int64_t>{4, 5});
    w.set_metadata("k", "v");
    auto bytes = w.serialize();
    for (std::size_t n = 0; n < bytes.size(); ++n) {
      std::vector<std::uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
      CHECK_THROWS_AS(ddp::train::parse_safetensors(cut), ddp::IoError);
    }
    // Flipping any single header byte either still parses to a valid file or is an IoError.
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      auto mutated = bytes;
      mutated[i] ^= 0x5A;
      try {
        (void)ddp::train::parse_safetensors(mutated);
      } catch (const ddp::IoError&) {
      }
    }
  }

  TEST_CASE("safetensors: random mutations of a valid file parse or raise IoError, nothing else") {
    SafetensorsWriter w;
    w.add<float>("conv.weight", {2, 1, 1, 2}, std::vector<float>{1, 2, 3, 4});
    w.add<std::int64_t>("n", {}, std::vector<std::int64_t>{5});
    w.add<std::uint8_t>("e", {0}, std::vector<std::uint8_t>{});
    w.set_metadata("epoch", "1");
    const auto good = w.serialize();
    std::uint64_t state = 0x9E3779B97F4A7C15ull;  // xorshift64: reproducible without <random>
    auto next = [&] {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      return state;
    };
    const std::string alphabet = "{}[]\",:0123456789-eE.FIU \\";
    int parsed = 0, rejected = 0;
    for (int iter = 0; iter < 3000; ++iter) {
      auto m = good;
      const int edits = 1 + static_cast<int>(next() % 3);
      for (int e = 0; e < edits && !m.empty(); ++e) {
        const std::size_t pos = next() % m.size();
        switch (next() % 4) {
          case 0:
            m[pos] = static_cast<std::uint8_t>(alphabet[next() % alphabet.size()]);
            break;
          case 1:
            m.erase(m.begin() + static_cast<std::ptrdiff_t>(pos));
            break;
          case 2:
            m.insert(m.begin() + static_cast<std::ptrdiff_t>(pos), static_cast<std::uint8_t>(next()));
            break;
          default:
            m[next() % 8] = static_cast<std::uint8_t>(next());
            break;  // the length field
        }
      }
      try {
        auto f = ddp::train::parse_safetensors(m, "fuzz");
        for (const auto& [name, t] : f.tensors) CHECK(t.data.size() == t.numel() * ddp::dtype_size(t.dtype));
        ++parsed;
      } catch (const ddp::IoError& e) {
        CHECK(std::string(e.what()).rfind("ddp: safetensors file 'fuzz': ", 0) == 0);
        ++rejected;
      }
    }
    MESSAGE("fuzz: " << parsed << " mutated files parsed, " << rejected << " rejected");
    CHECK(rejected > 1000);
  }

  TEST_CASE("safetensors: files written here load in PyTorch and files written by PyTorch load here") {
    const fs::path script =
        fs::path(__FILE__).parent_path().parent_path().parent_path() / "interop" / "reference" / "safetensors_py.py";
    if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
      MESSAGE("skipped: /usr/bin/python3 cannot import torch (apt install python3-torch)");
      return;
    }
    SafetensorsDir dir;
    std::string p = dir.file("cpp.safetensors");
    SafetensorsWriter w;
    w.add<float>("layer1.0.conv1.weight", {2, 1, 1, 2}, std::vector<float>{0.5f, -1.0f, 2.0f, 4.0f});
    w.add<std::int64_t>("bn.num_batches_tracked", {}, std::vector<std::int64_t>{3});
    w.add<ddp::bfloat16>("h", {1}, std::vector<ddp::bfloat16>{ddp::bfloat16(0.25f)});
    w.set_metadata("epoch", "2");
    w.write(p);
    std::string out = dir.file("dump.json");
    std::string cmd = "/usr/bin/python3 " + script.string() + " dump " + p + " > " + out;
    REQUIRE(std::system(cmd.c_str()) == 0);
    std::ifstream in(out);
    auto j = nlohmann::json::parse(in);
    MESSAGE("official safetensors package cross-checked: " << j["official"].dump());
    CHECK(j["metadata"]["epoch"] == "2");
    CHECK(j["tensors"]["layer1.0.conv1.weight"][0] == "F32");
    CHECK(j["tensors"]["layer1.0.conv1.weight"][1] == nlohmann::json::array({2, 1, 1, 2}));
    CHECK(j["tensors"]["layer1.0.conv1.weight"][2].get<double>() == 5.5);
    CHECK(j["tensors"]["bn.num_batches_tracked"][1] == nlohmann::json::array());
    CHECK(j["tensors"]["bn.num_batches_tracked"][2].get<double>() == 3.0);
    CHECK(j["tensors"]["h"][0] == "BF16");
    CHECK(j["tensors"]["h"][2].get<double>() == 0.25);

    std::string back = dir.file("py.safetensors");
    cmd = "/usr/bin/python3 " + script.string() + " roundtrip " + p + " " + back;
    REQUIRE(std::system(cmd.c_str()) == 0);
    auto f = read_safetensors(back);
    CHECK(f.metadata.at("python") == "yes");
    CHECK(f.metadata.at("epoch") == "2");
    CHECK(f.at("layer1.0.conv1.weight").as<float>() == std::vector<float>{1.0f, -2.0f, 4.0f, 8.0f});
    CHECK(f.at("bn.num_batches_tracked").as<std::int64_t>() == std::vector<std::int64_t>{4});
    CHECK(static_cast<float>(f.at("h").as<ddp::bfloat16>()[0]) == 0.5f);
  }
}
