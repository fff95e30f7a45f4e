// `mingpt generate`: samples text from a snapshot, as the tutorial's notebook does with minGPT's
// generate().
// SPDX-License-Identifier: MIT
//
// The snapshot's metadata holds the model's configuration and its vocabulary (train.hpp's
// model_metadata), so only the file is needed. From the prompt's ids, max_new_tokens times: the
// last block_size ids through the model (eval mode: no dropout), the last position's logits /
// temperature, only the top_k largest kept (0: all), softmax, one token drawn with Generator(seed,
// 0, kStreamData) -- or the most likely one when temperature is 0 -- and appended. Returns the
// prompt followed by the sampled text. One process, on the CPU.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <ddp/core/error.hpp>
#include <ddp/core/str.hpp>
#include <ddp/data/char_dataset.hpp>
#include <ddp/nn/gpt.hpp>
#include <ddp/tensor/random.hpp>
#include <ddp/train/checkpoint.hpp>
#include <ddp/train/safetensors.hpp>

namespace mingpt_example {

using namespace ddp;

struct GenerateOptions {
  std::string snapshot_path;
  std::string prompt;
  long max_new_tokens = 500;
  double temperature = 1.0;  // 0: greedy (argmax)
  long top_k = 10;           // 0: every token
  std::uint64_t seed = 0;
};

namespace detail {
// A metadata entry of a mingpt snapshot; IoError naming the file when it is missing.
inline const std::string& meta(const std::map<std::string, std::string>& m, const std::string& key,
                               const std::string& path) {
  const auto it = m.find(key);
  if (it == m.end())
    throw IoError(ddp::detail::str(
        "ddp: ", ddp::detail::quoted(path), " has no metadata entry '", key,
        "': it is not a snapshot of the mingpt example (train one with `mingpt --data_path ",
        "TEXT --snapshot_path ", path, "`)"));
  return it->second;
}

// Index of the next token from the last position's logits (vocab entries).
inline std::int64_t sample_token(std::vector<double> logits, const GenerateOptions& o,
                                 Generator& gen) {
  const auto v = static_cast<std::int64_t>(logits.size());
  if (o.temperature == 0.0) return std::max_element(logits.begin(), logits.end()) - logits.begin();
  for (double& l : logits) l /= o.temperature;
  if (o.top_k > 0 && o.top_k < v) {
    std::vector<double> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(),
                     std::greater<>());
    const double kth = sorted[static_cast<std::size_t>(o.top_k - 1)];
    for (double& l : logits)
      if (l < kth) l = -std::numeric_limits<double>::infinity();
  }
  const double top = *std::max_element(logits.begin(), logits.end());
  double total = 0;
  for (double& l : logits) total += (l = std::exp(l - top));
  // uniform in [0, total)
  const double u = static_cast<double>(gen.next_u64() >> 11) * 0x1p-53 * total;
  double acc = 0;
  for (std::int64_t i = 0; i < v; ++i)
    if ((acc += logits[static_cast<std::size_t>(i)]) > u) return i;
  return v - 1;  // rounding at the top end
}
}  // namespace detail

inline std::string generate(const GenerateOptions& o) {
  if (o.max_new_tokens < 0) throw ConfigError("ddp: --max_new_tokens must be >= 0");
  if (!(o.temperature >= 0.0))
    throw ConfigError(ddp::detail::str("ddp: --temperature must be >= 0, got ", o.temperature));
  if (o.top_k < 0) throw ConfigError(ddp::detail::str("ddp: --top_k must be >= 0, got ", o.top_k));
  if (o.prompt.empty())
    throw ConfigError("ddp: --prompt must not be empty: generation continues a text");
  const auto m = train::SafetensorsReader(o.snapshot_path).metadata();
  const auto number = [&](const std::string& key) {
    return std::stoll(detail::meta(m, key, o.snapshot_path));
  };
  const data::CharVocab vocab(
      data::decode_utf8(detail::meta(m, "gpt.vocab", o.snapshot_path), "gpt.vocab"),
      ddp::detail::str("the snapshot ", ddp::detail::quoted(o.snapshot_path)));
  nn::GPT<float, Cpu> net({.vocab_size = number("gpt.vocab_size"),
                           .block_size = number("gpt.block_size"),
                           .n_layer = number("gpt.n_layer"),
                           .n_head = number("gpt.n_head"),
                           .n_embd = number("gpt.n_embd"),
                           .embd_pdrop = 0,
                           .resid_pdrop = 0});
  if (vocab.size() != net.options().vocab_size)
    throw IoError(ddp::detail::str("ddp: ", ddp::detail::quoted(o.snapshot_path),
                                   ": gpt.vocab has ", vocab.size(),
                                   " characters but gpt.vocab_size is ", net.options().vocab_size));
  train::load_state_dict(o.snapshot_path, net);
  net.eval();

  std::vector<std::int64_t> ids = vocab.encode(o.prompt);  // ValueError naming a character it lacks
  Exec<Cpu> exec;
  Generator gen(o.seed, 0, kStreamData);
  const std::int64_t block = net.options().block_size, v = net.options().vocab_size;
  std::string out = o.prompt;
  for (long n = 0; n < o.max_new_tokens; ++n) {
    const std::int64_t t = std::min<std::int64_t>(block, static_cast<std::int64_t>(ids.size()));
    Tensor<std::int64_t, Cpu> ctx(Shape{1, t});
    std::copy(ids.end() - t, ids.end(), ctx.data());
    const Tensor<float, Cpu> logits = net.forward(exec, ctx.cview());  // (1, t, v)
    const float* last = logits.data() + (t - 1) * v;
    const std::int64_t next = detail::sample_token(std::vector<double>(last, last + v), o, gen);
    ids.push_back(next);
    out += vocab.decode(std::span<const std::int64_t>(&next, 1));
  }
  return out;
}

}  // namespace mingpt_example
