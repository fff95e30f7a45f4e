// CharDataset: character-level language-model samples over a text file (the DDP tutorial's minGPT
// job).
// SPDX-License-Identifier: MIT
//
//   ddp::data::CharDataset text("input.txt", {.block_size = 128, .truncate = 0.05});
//   auto [train, test] = ddp::data::split_indices(text.size(), 0.9, /*seed=*/0);  // sample ids
//   ddp::data::TokenBatch b = text.batch(std::span(train).subspan(0, 32));  // x, y: (32, 128)
// As pytorch/examples distributed/minGPT-ddp's char_dataset.py: the file is read as UTF-8 and cut
// to its first `truncate` fraction of characters; token i is the i-th distinct code point in sorted
// order; sample i is characters [i, i + block_size] encoded, x the first block_size, y the last
// (x shifted by one), so there are len - block_size samples. Unlike it, split_indices() is our own
// seeded permutation (torch's random_split cannot be reproduced), the same on every rank. Invalid
// UTF-8 (naming the file and byte offset), a missing file and a text too short for one sample are
// IoErrors. batch() copies B x block_size ids; no worker threads are needed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/data/distributed_sampler.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::data {

struct CharDatasetOptions {
  std::int64_t block_size = 128;  // characters per sample (the model's context length)
  // the fraction of the text's characters kept, from its start (0, 1]
  double truncate = 1.0;
};

// A batch of language-model samples: row b is sample indices[b].
struct TokenBatch {
  Tensor<std::int64_t, Cpu> x;  // (B, block_size) token ids
  Tensor<std::int64_t, Cpu> y;  // (B, block_size) the next token of each position
  std::vector<std::int64_t> indices;
};

// UTF-8 bytes -> code points; IoError naming `what` and the first invalid sequence's byte offset.
inline std::vector<char32_t> decode_utf8(const std::string& bytes, const std::string& what) {
  std::vector<char32_t> out;
  out.reserve(bytes.size());
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    int len = 0;
    char32_t cp = 0;
    if (c < 0x80) {
      len = 1, cp = c;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    }
    bool ok = len > 0 && i + static_cast<std::size_t>(len) <= n;
    for (int k = 1; ok && k < len; ++k) {
      ok = (p[i + static_cast<std::size_t>(k)] & 0xC0) == 0x80;
      cp = (cp << 6) | (p[i + static_cast<std::size_t>(k)] & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are invalid (as Python's decoder says).
    static constexpr char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    ok = ok && cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    if (!ok)
      throw IoError(ddp::detail::str(
          "ddp: ", what, " is not valid UTF-8 at byte ", i,
          "; the character dataset reads UTF-8 text (convert it, e.g. with iconv)"));
    out.push_back(cp);
    i += static_cast<std::size_t>(len);
  }
  return out;
}

inline std::string encode_utf8(char32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// Token id i is the i-th of a sorted list of distinct code points. `mingpt generate` rebuilds it
// from utf8() stored in a snapshot. `source` names its origin in errors, e.g. "'input.txt'".
class CharVocab {
 public:
  CharVocab() = default;
  // The distinct code points of `chars`, sorted.
  CharVocab(std::vector<char32_t> chars, std::string source)
      : source_(std::move(source)), itos_(std::move(chars)) {
    std::sort(itos_.begin(), itos_.end());
    itos_.erase(std::unique(itos_.begin(), itos_.end()), itos_.end());
  }

  std::int64_t size() const noexcept { return static_cast<std::int64_t>(itos_.size()); }
  // The id of character c, -1 when it is not in the vocabulary.
  std::int64_t id_of(char32_t c) const {
    const auto it = std::lower_bound(itos_.begin(), itos_.end(), c);
    return it == itos_.end() || *it != c ? -1 : it - itos_.begin();
  }
  // Every character in id order, as UTF-8; CharVocab(decode_utf8(utf8(), ...), ...) restores it.
  std::string utf8() const {
    std::string out;
    for (char32_t c : itos_) out += encode_utf8(c);
    return out;
  }

  // Token ids of `text` (UTF-8); a character outside the vocabulary is a ValueError naming it.
  std::vector<std::int64_t> encode(const std::string& text) const {
    std::vector<std::int64_t> ids;
    for (char32_t c : decode_utf8(text, "the prompt")) {
      const std::int64_t id = id_of(c);
      if (id < 0) {
        char code[16];
        std::snprintf(code, sizeof code, "U+%04X", static_cast<unsigned>(c));
        throw ValueError(ddp::detail::str("ddp: character ", ddp::detail::quoted(encode_utf8(c)),
                                          " (", code, ") is not in the vocabulary of ", source_,
                                          "; use characters that occur in the text"));
      }
      ids.push_back(id);
    }
    return ids;
  }
  // UTF-8 text of token ids; an id outside [0, size()) is a ValueError.
  std::string decode(std::span<const std::int64_t> ids) const {
    std::string out;
    for (std::int64_t id : ids) {
      if (id < 0 || id >= size())
        throw ValueError(
            ddp::detail::str("ddp: token id ", id, " is outside the vocabulary [0, ", size(), ")"));
      out += encode_utf8(itos_[static_cast<std::size_t>(id)]);
    }
    return out;
  }

 private:
  std::string source_;          // for messages
  std::vector<char32_t> itos_;  // token id -> character, sorted
};

class CharDataset {
 public:
  CharDataset(const std::string& path, const CharDatasetOptions& o) : block_size_(o.block_size) {
    if (!(o.truncate > 0.0 && o.truncate <= 1.0))
      throw ConfigError(ddp::detail::str("ddp: character dataset truncate must be in (0, 1], got ",
                                         o.truncate, " (--truncate)"));
    if (o.block_size < 1)
      throw ConfigError(
          ddp::detail::str("ddp: block_size must be >= 1, got ", o.block_size, " (--block_size)"));
    std::ifstream in(path, std::ios::binary);
    if (!in)
      throw IoError(ddp::detail::str("ddp: cannot open text file ", ddp::detail::quoted(path),
                                     " for the character dataset (--data_path); check the path"));
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<char32_t> text =
        decode_utf8(bytes, ddp::detail::str("text file ", ddp::detail::quoted(path)));
    // Python's int(): floor
    text.resize(static_cast<std::size_t>(static_cast<double>(text.size()) * o.truncate));
    if (static_cast<std::int64_t>(text.size()) <= block_size_)
      throw IoError(ddp::detail::str("ddp: text file ", ddp::detail::quoted(path), " has ",
                                     text.size(), " characters (after --truncate ", o.truncate,
                                     "), too few for one sample of "
                                     "block_size + 1 = ",
                                     block_size_ + 1,
                                     "; use a longer text or a smaller block_size"));
    vocab_ = CharVocab(text, ddp::detail::quoted(path));
    tokens_.reserve(text.size());
    for (char32_t c : text) tokens_.push_back(vocab_.id_of(c));
  }

  // Samples: len - block_size, as the tutorial's __len__.
  std::size_t size() const noexcept {
    return tokens_.size() - static_cast<std::size_t>(block_size_);
  }
  std::int64_t block_size() const noexcept { return block_size_; }
  std::int64_t vocab_size() const noexcept { return vocab_.size(); }
  const CharVocab& vocab() const noexcept { return vocab_; }
  std::size_t num_characters() const noexcept { return tokens_.size(); }
  // The whole (truncated) text as token ids.
  const std::vector<std::int64_t>& tokens() const noexcept { return tokens_; }

  // Token ids of `text` and back (CharVocab's).
  std::vector<std::int64_t> encode(const std::string& text) const { return vocab_.encode(text); }
  std::string decode(std::span<const std::int64_t> ids) const { return vocab_.decode(ids); }

  // Sample `index`: x = tokens [index, index + block_size), y = the same shifted by one.
  void get_into(std::size_t index, std::span<std::int64_t> x, std::span<std::int64_t> y) const {
    if (index >= size())
      throw ValueError(ddp::detail::str("ddp: character dataset index ", index,
                                        " is out of range for ", size(), " samples"));
    const auto t = static_cast<std::size_t>(block_size_);
    std::copy_n(tokens_.begin() + static_cast<std::ptrdiff_t>(index), t, x.begin());
    std::copy_n(tokens_.begin() + static_cast<std::ptrdiff_t>(index) + 1, t, y.begin());
  }

  TokenBatch batch(std::span<const std::int64_t> indices) const {
    const auto b = static_cast<std::int64_t>(indices.size());
    TokenBatch out{.x = Tensor<std::int64_t, Cpu>(Shape{b, block_size_}),
                   .y = Tensor<std::int64_t, Cpu>(Shape{b, block_size_}),
                   .indices = std::vector<std::int64_t>(indices.begin(), indices.end())};
    const auto t = static_cast<std::size_t>(block_size_);
    for (std::size_t r = 0; r < indices.size(); ++r) {
      if (indices[r] < 0)
        throw ValueError(
            ddp::detail::str("ddp: character dataset index ", indices[r], " is negative"));
      get_into(static_cast<std::size_t>(indices[r]),
               std::span<std::int64_t>(out.x.data() + r * t, t),
               std::span<std::int64_t>(out.y.data() + r * t, t));
    }
    return out;
  }

 private:
  std::int64_t block_size_;
  CharVocab vocab_;
  std::vector<std::int64_t> tokens_;  // the text as token ids
};

// The tutorial's random_split(dataset, [int(n * train_split), rest]) with our generator: the first
// floor(n * train_split) entries of a seeded permutation of 0..n-1 (the same on every rank) train.
inline std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>> split_indices(
    std::size_t n, double train_split, std::uint64_t seed) {
  if (!(train_split > 0.0 && train_split <= 1.0))
    throw ConfigError(ddp::detail::str("ddp: train_split must be in (0, 1], got ", train_split,
                                       " (--train_split)"));
  std::vector<std::int64_t> p = permutation(n, seed);
  const auto k = static_cast<std::size_t>(static_cast<double>(n) * train_split);
  std::vector<std::int64_t> test(p.begin() + static_cast<std::ptrdiff_t>(k), p.end());
  p.resize(k);
  return {std::move(p), std::move(test)};
}

}  // namespace ddp::data
