// data::CharDataset (the minGPT job's character-level samples) and split_indices, against expectations worked out
// by hand from the tutorial's definition (sorted distinct characters, x = block, y = block shifted by one).
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <ddp/core/error.hpp>
#include <ddp/data/char_dataset.hpp>

#include "../../support/files.hpp"
#include "../../support/temp_dir.hpp"

using ddp::data::CharDataset;

TEST_SUITE("data") {
  TEST_CASE("CharDataset: code points sorted into the vocabulary, samples are the block and its shift by one") {
    ddp::test::TempDir dir("ddp_chars_");
    const std::string path = dir.file("t.txt");
    ddp::test::spit_text(path, "abcab\xe2\x9c\x93");  // "abcab" + U+2713 (3 bytes)
    const CharDataset d(path, {.block_size = 2});
    CHECK(d.vocab_size() == 4);  // a b c U+2713
    CHECK(d.num_characters() == 6);
    CHECK(d.size() == 4);
    CHECK(d.tokens() == std::vector<std::int64_t>{0, 1, 2, 0, 1, 3});
    const std::vector<std::int64_t> idx{1, 3};
    const auto b = d.batch(idx);
    REQUIRE(b.x.shape() == ddp::Shape{2, 2});
    CHECK(std::vector<std::int64_t>(b.x.data(), b.x.data() + 4) == std::vector<std::int64_t>{1, 2, 0, 1});
    CHECK(std::vector<std::int64_t>(b.y.data(), b.y.data() + 4) == std::vector<std::int64_t>{2, 0, 1, 3});
    CHECK(d.decode(d.encode("ca\xe2\x9c\x93")) == "ca\xe2\x9c\x93");
    CHECK_THROWS_AS(d.encode("z"), ddp::ValueError);
    CHECK_THROWS_AS(d.batch(std::vector<std::int64_t>{4}), ddp::ValueError);
    // truncate keeps the first floor(6 * 0.5) = 3 characters: one sample of block 2.
    const CharDataset half(path, {.block_size = 2, .truncate = 0.5});
    CHECK(half.vocab_size() == 3);
    CHECK(half.size() == 1);
  }

  TEST_CASE("CharDataset: invalid UTF-8, a missing file and a text too short are IoErrors naming the file") {
    ddp::test::TempDir dir("ddp_chars_");
    const std::string bad = dir.file("bad.txt"), overlong = dir.file("overlong.txt"), short_text = dir.file("s.txt");
    ddp::test::spit_text(bad, "ab\xff" "cd");
    ddp::test::spit_text(overlong, "a\xc0\xaf");  // '/' in two bytes: overlong, invalid
    ddp::test::spit_text(short_text, "ab");
    for (const auto& [path, what] : std::vector<std::pair<std::string, std::string>>{
             {bad, "at byte 2"}, {overlong, "at byte 1"}, {dir.file("none.txt"), "cannot open"}, {short_text, "too few"}}) {
      CAPTURE(path);
      try {
        CharDataset d(path, {.block_size = 2});
        FAIL("no error");
      } catch (const ddp::IoError& e) {
        CHECK(std::string(e.what()).find(path) != std::string::npos);
        CHECK(std::string(e.what()).find(what) != std::string::npos);
      }
    }
    CHECK_THROWS_AS(CharDataset(bad, {.block_size = 2, .truncate = 0.0}), ddp::ConfigError);
  }

  TEST_CASE("split_indices: a seeded partition, floor(n * train_split) for training, the same for the same seed") {
    const auto [train, test] = ddp::data::split_indices(103, 0.9, 7);
    CHECK(train.size() == 92);
    CHECK(test.size() == 11);
    std::set<std::int64_t> all(train.begin(), train.end());
    all.insert(test.begin(), test.end());
    CHECK(all.size() == 103);
    CHECK(*all.begin() == 0);
    CHECK(*all.rbegin() == 102);
    CHECK(ddp::data::split_indices(103, 0.9, 7).first == train);
    CHECK(ddp::data::split_indices(103, 0.9, 8).first != train);
    CHECK_THROWS_AS(ddp::data::split_indices(10, 1.5, 0), ddp::ConfigError);
  }
}
