// Model state_dicts and training snapshots as safetensors files that PyTorch reads and writes too.
// SPDX-License-Identifier: MIT
//
// State dict (save_state_dict / load_state_dict): one tensor per torchvision state_dict key, in
// torch's order, float parameters and buffers as F32 (for T = float), num_batches_tracked as I64.
// Conv weights are converted at the boundary: ddp keeps KRSC (C_out, kH, kW, C_in), the file holds
// torch's OIHW (C_out, C_in, kH, kW). So in PyTorch
//     model.load_state_dict(load_file("resnet18.safetensors"))
// works, and a torchvision state_dict saved with safetensors.torch.save_file loads here. A file
// whose keys differ from ours loads through a StateDictKeys (file_key: our name -> the file's key;
// ignore: the file's keys we have no counterpart for), e.g. the tutorial's minGPT (nn/gpt.hpp):
//     train::load_state_dict(path, gpt, /*strict=*/true,
//                            {.file_key = nn::mingpt_state_dict_key,
//                             .ignore = nn::mingpt_ignored_keys(n_layer)});
// and an error names both keys: "has no tensor 'blocks.0.attn.attn.in_proj_weight' (ddp's
// 'blocks.0.attn.attn.c_attn.weight') that GPT(...) needs".
//
// Snapshot (save_snapshot / load_snapshot, docs/decisions/0010, 0026): the model's state dict plus,
// in the same file, the optimizer's per-parameter state under torch's names, in the parameter's
// torch layout:
//   optimizer.momentum_buffer.<param name>   SGD
//   optimizer.exp_avg.<param name>           AdamW: the moments, and the parameter's step count
//   optimizer.exp_avg_sq.<param name>          as an I64 scalar (shape [])
//   optimizer.step.<param name>
//   __metadata__: ddp.kind=snapshot, ddp.model, ddp.data_hash, epoch, optimizer.kind (sgd | adamw;
//                 absent: sgd), optimizer.lr, optimizer.steps, rng.seed, rng.rank, rng.stream,
//                 rng.offset, optimizer.group_lr.<g> for each parameter group g with an lr of its
//                 own, and any user entries
// Loading restores the learning rate (written with enough digits to read back the same double) and
// the step count, which is also the LR schedule's clock (optim/lr_schedule.hpp). ddp.data_hash (16
// hex digits, SafetensorsWriter::data_hash) covers every tensor byte, since safetensors has no
// checksum and a bit flipped in the data would load as a wrong weight; load_snapshot checks it when
// present (files written by PyTorch have none). Snapshots are written atomically (safetensors.hpp)
// and can be serialised to bytes so rank 0 reads the file and broadcasts it (no shared filesystem
// needed).
// Errors: a missing tensor, an unexpected tensor (strict), a wrong shape or a dtype other than the
// model's are IoErrors naming the file and the tensor; a truncated or foreign file is an IoError
// from the reader. Nothing of the model changes unless the whole file checks out. CPU models only:
// copy a GPU model to the host first (the CUDA layer's to<Cpu>).
#pragma once

#include <charconv>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddp/core/dtype.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/parameter.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/tensor/random.hpp"
#include "ddp/train/safetensors.hpp"
#include "ddp/train/safetensors_writer.hpp"

namespace ddp::train {

// Every optimizer tensor of a snapshot starts with this; a state dict load ignores them.
inline constexpr const char* kOptimizerPrefix = "optimizer.";
inline constexpr const char* kMomentumPrefix = "optimizer.momentum_buffer.";
// "optimizer.step.<param name>": the per-parameter step count of optim::HasParamSteps optimizers.
inline constexpr std::string_view kParamStepState = "step";

// What a snapshot holds besides the tensors.
struct SnapshotInfo {
  std::int64_t epoch = 0;                       // the next epoch to run on resume
  RngState rng;                                 // e.g. the data generator's state
  std::map<std::string, std::string> metadata;  // free-form user entries (no "ddp." prefix)
};

// How a state_dict file's keys relate to the model's names (default: same names, none ignored).
struct StateDictKeys {
  // Our parameter or buffer name -> the file's key; unset: the same name. Must be injective.
  std::function<std::string(const std::string&)> file_key;
  // File keys neither loaded nor, under strict, unexpected (e.g. buffers we compute instead).
  std::set<std::string> ignore;

  std::string key_of(const std::string& name) const { return file_key ? file_key(name) : name; }
};

namespace detail {

template <class T>
std::vector<std::int64_t> dims(const Shape& s) {
  return std::vector<std::int64_t>(s.begin(), s.end());
}
// KRSC (K, R, S, C) -> OIHW (K, C, R, S).
template <class T>
std::vector<T> krsc_to_oihw(const T* src, const Shape& krsc) {
  const std::int64_t k = krsc[0], r = krsc[1], s = krsc[2], c = krsc[3];
  std::vector<T> out(static_cast<std::size_t>(k * r * s * c));
  for (std::int64_t o = 0; o < k; ++o)
    for (std::int64_t i = 0; i < r; ++i)
      for (std::int64_t j = 0; j < s; ++j)
        for (std::int64_t ch = 0; ch < c; ++ch)
          out[static_cast<std::size_t>(((o * c + ch) * r + i) * s + j)] =
              src[((o * r + i) * s + j) * c + ch];
  return out;
}
// OIHW bytes -> KRSC tensor data.
template <class T>
void oihw_to_krsc(const T* src, T* dst, const Shape& krsc) {
  const std::int64_t k = krsc[0], r = krsc[1], s = krsc[2], c = krsc[3];
  for (std::int64_t o = 0; o < k; ++o)
    for (std::int64_t i = 0; i < r; ++i)
      for (std::int64_t j = 0; j < s; ++j)
        for (std::int64_t ch = 0; ch < c; ++ch)
          dst[((o * r + i) * s + j) * c + ch] = src[((o * c + ch) * r + i) * s + j];
}

// Adds one parameter-shaped tensor (value, grad or momentum buffer) under `name`, in torch layout.
template <class T>
void add_param_tensor(SafetensorsWriter& w, const std::string& name, const nn::Parameter<T, Cpu>& p,
                      const T* data) {
  const Shape ts = p.torch_shape();
  if (p.layout() == nn::Layout::Krsc)
    w.add<T>(name, dims<T>(ts), krsc_to_oihw(data, p.shape()));
  else
    w.add<T>(name, dims<T>(ts), std::span<const T>(data, static_cast<std::size_t>(p.numel())));
}

template <class T>
void add_state_dict(SafetensorsWriter& w, nn::Module<T, Cpu>& model) {
  std::map<std::string, nn::Parameter<T, Cpu>*> params;
  std::map<std::string, nn::Buffer<T, Cpu>*> bufs;
  for (auto* p : model.parameters()) params[p->name()] = p;
  for (auto* b : model.buffers()) bufs[b->name()] = b;
  for (const auto& key : model.state_dict_keys()) {
    if (auto it = params.find(key); it != params.end()) {
      add_param_tensor(w, key, *it->second, it->second->value().data());
    } else {
      nn::Buffer<T, Cpu>* b = bufs.at(key);
      if (b->is_integer())
        w.add<std::int64_t>(key, dims<T>(b->shape()),
                            std::span<const std::int64_t>(
                                b->count().data(), static_cast<std::size_t>(b->count().numel())));
      else
        w.add<T>(key, dims<T>(b->shape()),
                 std::span<const T>(b->real().data(), static_cast<std::size_t>(b->real().numel())));
    }
  }
  w.set_metadata("ddp.model", model.describe());
}

inline std::string model_hint(const SafetensorsFile& f) {
  auto it = f.metadata.find("ddp.model");
  return it == f.metadata.end() ? std::string()
                                : ddp::detail::str(" (the file was written for ", it->second, ")");
}

// Checks that `name` exists with `shape` and dtype `want`; returns its entry. `ours`, if set and
// not `name`, is our name for the file's `name` (StateDictKeys) and is named in messages too.
inline const TensorEntry& expect_tensor(const SafetensorsFile& f, const std::string& path,
                                        const std::string& name, const Shape& shape, DType want,
                                        const std::string& model, const std::string& ours = "") {
  const std::string label = ours.empty() || ours == name
                                ? ddp::detail::str("'", name, "'")
                                : ddp::detail::str("'", name, "' (ddp's '", ours, "')");
  auto it = f.tensors.find(name);
  if (it == f.tensors.end())
    throw IoError(ddp::detail::str("ddp: checkpoint '", path, "' has no tensor ", label, " that ",
                                   model, " needs", model_hint(f),
                                   "; is it a checkpoint of another architecture?"));
  const TensorEntry& e = it->second;
  const std::vector<std::int64_t> want_dims(shape.begin(), shape.end());
  if (e.shape != want_dims)
    throw IoError(ddp::detail::str("ddp: checkpoint '", path, "': tensor ", label, " has shape [",
                                   ddp::detail::join(e.shape, ", "), "] but ", model, " needs [",
                                   ddp::detail::join(want_dims, ", "), "]", model_hint(f),
                                   "; wrong --arch or --num-classes?"));
  if (e.dtype != want)
    throw IoError(ddp::detail::str("ddp: checkpoint '", path, "': tensor ", label, " has dtype ",
                                   dtype_name(e.dtype), " but the model holds ", dtype_name(want),
                                   "; convert the file (e.g. .float())"));
  return e;
}

// Validates every tensor first, then copies: a bad file leaves the model untouched. `keys` maps our
// names to the file's (a key map that sends two names to one key is a ValueError naming both).
template <class T>
void load_state_dict_from(const SafetensorsFile& f, const std::string& path,
                          nn::Module<T, Cpu>& model, bool strict,
                          const std::string& extra_prefix = "", const StateDictKeys& keys = {}) {
  const std::string model_name = model.describe();
  std::map<std::string, std::string> ours_of;  // file key -> our name
  for (const auto& name : model.state_dict_keys()) {
    const std::string key = keys.key_of(name);
    if (auto [it, fresh] = ours_of.emplace(key, name); !fresh)
      throw ValueError(ddp::detail::str(
          "ddp: load_state_dict: the key map sends both '", it->second, "' and '", name, "' of ",
          model_name, " to the file key '", key, "'; each name needs a key of its own"));
  }
  std::vector<std::pair<const TensorEntry*, std::function<void(const TensorEntry&)>>> copies;
  for (auto* p : model.parameters()) {
    const TensorEntry& e = expect_tensor(f, path, keys.key_of(p->name()), p->torch_shape(),
                                         dtype_of<T>, model_name, p->name());
    copies.emplace_back(&e, [p](const TensorEntry& t) {
      const T* src = reinterpret_cast<const T*>(t.data.data());
      if (p->layout() == nn::Layout::Krsc)
        oihw_to_krsc(src, p->value().data(), p->shape());
      else
        std::memcpy(p->value().data(), src, p->value().bytes());
    });
  }
  for (auto* b : model.buffers()) {
    const TensorEntry& e =
        expect_tensor(f, path, keys.key_of(b->name()), b->shape(),
                      b->dtype() == DType::I64 ? DType::I64 : dtype_of<T>, model_name, b->name());
    copies.emplace_back(
        &e, [b](const TensorEntry& t) { std::memcpy(b->data(), t.data.data(), b->bytes()); });
  }
  if (strict) {
    for (const auto& name : f.order)
      if (!ours_of.contains(name) && !keys.ignore.contains(name) &&
          (extra_prefix.empty() || name.rfind(extra_prefix, 0) != 0))
        throw IoError(ddp::detail::str("ddp: checkpoint '", path, "' holds tensor '", name,
                                       "' that ", model_name, " does not have", model_hint(f),
                                       "; is it a checkpoint of another architecture?"));
  }
  for (auto& [entry, copy] : copies) copy(*entry);
}

inline std::string hex64(std::uint64_t v) {
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4)
    out[static_cast<std::size_t>(i)] = "0123456789abcdef"[v & 15];
  return out;
}

// Compares the stored ddp.data_hash (if any) with the data as read; IoError naming the file.
inline void check_data_hash(const SafetensorsFile& f, const std::string& source) {
  auto it = f.metadata.find("ddp.data_hash");
  if (it == f.metadata.end()) return;
  const std::string computed = hex64(data_hash(f));
  if (computed != it->second)
    throw IoError(ddp::detail::str("ddp: snapshot '", source,
                                   "' is corrupt: its tensor data does not match the "
                                   "checksum stored with it (ddp.data_hash ",
                                   ddp::detail::quoted(it->second), ", computed '", computed,
                                   "'), e.g. a bit flipped on disk or in transfer. Restore '",
                                   source, ".prev' (the snapshot before it) or delete '", source,
                                   "' to start from scratch."));
}

inline std::int64_t meta_int(const SafetensorsFile& f, const std::string& path,
                             const std::string& key,
                             std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                             std::int64_t hi = std::numeric_limits<std::int64_t>::max()) {
  auto it = f.metadata.find(key);
  if (it == f.metadata.end())
    throw IoError(ddp::detail::str(
        "ddp: snapshot '", path, "' has no metadata '", key,
        "'; it is not a ddp snapshot (a plain state dict loads with load_state_dict)"));
  try {
    std::size_t used = 0;
    const long long v = std::stoll(it->second, &used);
    if (used != it->second.size()) throw std::invalid_argument("trailing");
    if (v >= lo && v <= hi) return v;
  } catch (const std::exception&) {
    throw IoError(ddp::detail::str("ddp: snapshot '", path, "': metadata '", key,
                                   "' = ", ddp::detail::quoted(it->second),
                                   " is not an integer; the file is corrupt"));
  }
  throw IoError(ddp::detail::str("ddp: snapshot '", path, "': metadata '", key, "' = ", it->second,
                                 " is out of range [", lo, ", ", hi, "]; the file is corrupt"));
}

// An unsigned 64-bit metadata value (all digits; std::to_string of a std::uint64_t).
inline std::uint64_t meta_u64(const SafetensorsFile& f, const std::string& path,
                              const std::string& key) {
  auto it = f.metadata.find(key);
  if (it == f.metadata.end())
    throw IoError(ddp::detail::str(
        "ddp: snapshot '", path, "' has no metadata '", key,
        "'; it is not a ddp snapshot (a plain state dict loads with load_state_dict)"));
  std::uint64_t v = 0;
  const std::string& t = it->second;
  auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || ec != std::errc{} || ptr != t.data() + t.size())
    throw IoError(ddp::detail::str("ddp: snapshot '", path, "': metadata '", key,
                                   "' = ", ddp::detail::quoted(t),
                                   " is not an unsigned 64-bit integer; the file is corrupt"));
  return v;
}

// A double written by double_text (shortest round-trip text); nullopt when absent.
inline std::optional<double> meta_double(const SafetensorsFile& f, const std::string& path,
                                         const std::string& key) {
  auto it = f.metadata.find(key);
  if (it == f.metadata.end()) return std::nullopt;
  double v = 0.0;
  const std::string& t = it->second;
  auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || ec != std::errc{} || ptr != t.data() + t.size() || !(v >= 0.0))
    throw IoError(ddp::detail::str("ddp: snapshot '", path, "': metadata '", key,
                                   "' = ", ddp::detail::quoted(t),
                                   " is not a number >= 0; the file is corrupt"));
  return v;
}
inline std::string double_text(double v) {
  char buf[32];
  auto [ptr, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc{} ? std::string(buf, ptr) : ddp::detail::str(v);
}

inline std::string state_key(std::string_view state, const std::string& param) {
  return ddp::detail::str(kOptimizerPrefix, state, '.', param);
}

}  // namespace detail

// ---- state dicts ----

// Writes model's state_dict (torchvision names, OIHW convs) atomically to `path`. Throws IoError.
template <class T>
void save_state_dict(const std::string& path, nn::Module<T, Cpu>& model,
                     const std::map<std::string, std::string>& metadata = {}) {
  SafetensorsWriter w;
  detail::add_state_dict(w, model);
  w.set_metadata("ddp.kind", "state_dict");
  for (const auto& [k, v] : metadata) w.set_metadata(k, v);
  w.write(path);
}

// Loads a state_dict file into `model`. strict: tensors the model lacks are errors too (torch's
// strict=True), except those in keys.ignore. keys: how the file names our tensors (StateDictKeys;
// default the same names).
template <class T>
void load_state_dict(const std::string& path, nn::Module<T, Cpu>& model, bool strict = true,
                     const StateDictKeys& keys = {}) {
  const SafetensorsFile f = read_safetensors(path);
  detail::load_state_dict_from(f, path, model, strict, kOptimizerPrefix, keys);
}

// ---- snapshots ----
// Opt is any optim::Optimizer on the CPU (optim::SGD, optim::AdamW); a GPU optimizer goes through a
// host copy (train/device_state.hpp).

template <class T, optim::Optimizer Opt>
SafetensorsWriter snapshot_writer(nn::Module<T, Cpu>& model, Opt& opt, const SnapshotInfo& info) {
  SafetensorsWriter w;
  detail::add_state_dict(w, model);
  const auto& params = opt.parameters();
  for (const optim::StateTensor& st : Opt::state_tensors)
    for (std::size_t i = 0; i < params.size(); ++i)
      if (Tensor<T, Cpu>* t = opt.state(st.name, i))
        detail::add_param_tensor(w, detail::state_key(st.name, params[i]->name()), *params[i],
                                 t->data());
  if constexpr (optim::HasParamSteps<Opt>)
    for (std::size_t i = 0; i < params.size(); ++i)
      if (const std::int64_t n = opt.param_step(i); n > 0)
        w.add<std::int64_t>(detail::state_key(kParamStepState, params[i]->name()), {},
                            std::vector<std::int64_t>{n});
  for (const auto& [k, v] : info.metadata) w.set_metadata(k, v);
  w.set_metadata("ddp.kind", "snapshot");
  w.set_metadata("epoch", std::to_string(info.epoch));
  w.set_metadata("optimizer.kind", std::string(Opt::kind));
  w.set_metadata("optimizer.lr", detail::double_text(opt.lr()));
  w.set_metadata("optimizer.steps", std::to_string(opt.steps()));
  for (std::size_t g = 0; g < opt.groups().size(); ++g)
    if (optim::has_own_group_lr(opt, g))
      w.set_metadata(ddp::detail::str("optimizer.group_lr.", g),
                     detail::double_text(opt.group_lr(g)));
  w.set_metadata("rng.seed", std::to_string(info.rng.seed));
  w.set_metadata("rng.rank", std::to_string(info.rng.rank));
  w.set_metadata("rng.stream", std::to_string(info.rng.stream));
  w.set_metadata("rng.offset", std::to_string(info.rng.offset));
  w.set_metadata("ddp.data_hash", detail::hex64(w.data_hash()));
  return w;
}

// Writes model + optimizer state + info atomically; keep_previous keeps the old one as <path>.prev.
template <class T, optim::Optimizer Opt>
void save_snapshot(const std::string& path, nn::Module<T, Cpu>& model, Opt& opt,
                   const SnapshotInfo& info,
                   const WriteOptions& options = {.keep_previous = true}) {
  snapshot_writer(model, opt, info).write(path, options);
}
// The same file as bytes (rank 0 serialises, broadcasts; the others call load_snapshot_bytes).
template <class T, optim::Optimizer Opt>
std::vector<std::uint8_t> serialize_snapshot(nn::Module<T, Cpu>& model, Opt& opt,
                                             const SnapshotInfo& info) {
  return snapshot_writer(model, opt, info).serialize();
}

// Restores model and optimizer (state tensors, step counts, learning rate) from a parsed snapshot;
// returns its info. `source` names it in errors. Nothing changes unless the whole file checks out.
template <class T, optim::Optimizer Opt>
SnapshotInfo load_snapshot_from(const SafetensorsFile& f, const std::string& source,
                                nn::Module<T, Cpu>& model, Opt& opt) {
  auto kind = f.metadata.find("ddp.kind");
  if (kind == f.metadata.end() || kind->second != "snapshot")
    throw IoError(ddp::detail::str(
        "ddp: '", source, "' is not a ddp snapshot (metadata ddp.kind is ",
        kind == f.metadata.end() ? std::string("missing") : ddp::detail::quoted(kind->second),
        "); pass a snapshot a training run saved (save_snapshot)"));
  detail::check_data_hash(f, source);
  // Snapshots from before optimizer.kind existed are SGD's.
  auto opt_kind = f.metadata.find("optimizer.kind");
  const std::string file_kind =
      opt_kind == f.metadata.end() ? std::string("sgd") : opt_kind->second;
  if (file_kind != Opt::kind)
    throw IoError(ddp::detail::str("ddp: snapshot '", source, "' holds the state of optimizer '",
                                   file_kind, "' but this run uses '", Opt::kind,
                                   "'; resume with the optimizer it was written "
                                   "with (--optimizer ",
                                   file_kind, ") or start without the snapshot"));
  SnapshotInfo info;
  // Counters are never negative; rank and stream are 32-bit; seed and offset unsigned 64-bit.
  constexpr std::int64_t kU32Max = std::numeric_limits<std::uint32_t>::max();
  info.epoch = detail::meta_int(f, source, "epoch", 0);
  info.rng.seed = detail::meta_u64(f, source, "rng.seed");
  info.rng.rank = static_cast<std::uint32_t>(detail::meta_int(f, source, "rng.rank", 0, kU32Max));
  info.rng.stream =
      static_cast<std::uint32_t>(detail::meta_int(f, source, "rng.stream", 0, kU32Max));
  info.rng.offset = detail::meta_u64(f, source, "rng.offset");
  const std::int64_t steps = detail::meta_int(f, source, "optimizer.steps", 0);
  const std::optional<double> lr = detail::meta_double(f, source, "optimizer.lr");
  // parameter groups with an lr of their own
  std::vector<std::pair<std::size_t, double>> group_lrs;
  for (const auto& [key, value] : f.metadata) {
    constexpr std::string_view kGroupLr = "optimizer.group_lr.";
    if (key.rfind(kGroupLr, 0) != 0) continue;
    std::size_t g = 0;
    const char* first = key.data() + kGroupLr.size();
    auto [ptr, ec] = std::from_chars(first, key.data() + key.size(), g);
    if (ec != std::errc{} || ptr != key.data() + key.size() || ptr == first ||
        g >= opt.groups().size())
      throw IoError(ddp::detail::str(
          "ddp: snapshot '", source, "' has metadata '", key, "' = ", value,
          " but this optimizer has ", opt.groups().size(),
          " parameter groups; resume with the parameter groups it was written with"));
    group_lrs.emplace_back(g, *detail::meta_double(f, source, key));
  }
  // Check the optimizer state before touching anything: each tensor must be a state this optimizer
  // keeps, of a parameter of this model, with the parameter's shape (a tensor for another model's
  // parameter means the wrong snapshot, not one to drop silently), and a parameter has all of its
  // state tensors or none.
  const auto& params = opt.parameters();
  constexpr bool kParamSteps = optim::HasParamSteps<Opt>;
  std::set<std::string, std::less<>> param_names;
  for (const auto* p : params) {
    param_names.insert(p->name());
    std::size_t present = 0;
    for (const optim::StateTensor& st : Opt::state_tensors) {
      const std::string name = detail::state_key(st.name, p->name());
      if (!f.contains(name)) continue;
      detail::expect_tensor(f, source, name, p->torch_shape(), dtype_of<T>, model.describe());
      ++present;
    }
    if constexpr (kParamSteps) {
      const std::string name = detail::state_key(kParamStepState, p->name());
      if (f.contains(name)) {
        detail::expect_tensor(f, source, name, Shape{}, DType::I64, model.describe());
        std::int64_t n = 0;
        std::memcpy(&n, f.tensors.at(name).data.data(), sizeof n);
        if (n < 1)
          throw IoError(ddp::detail::str("ddp: snapshot '", source, "': '", name, "' = ", n,
                                         " is not a step count >= 1; the file is corrupt"));
        ++present;
      }
    }
    const std::size_t all = Opt::state_tensors.size() + (kParamSteps ? 1 : 0);
    if (present != 0 && present != all)
      throw IoError(ddp::detail::str("ddp: snapshot '", source, "' has ", present, " of the ", all,
                                     " ", Opt::kind, " state tensors of parameter '", p->name(),
                                     "'; the file is corrupt"));
  }
  // (A state tensor whose parameter is in the file too is left to the state-dict check below,
  // whose message about the unexpected parameter says more.)
  for (const auto& name : f.order) {
    if (name.rfind(kOptimizerPrefix, 0) != 0) continue;
    const std::string_view rest =
        std::string_view(name).substr(std::string_view(kOptimizerPrefix).size());
    const std::size_t dot = rest.find('.');
    const std::string_view state = rest.substr(0, dot);
    const std::string param =
        dot == std::string_view::npos ? std::string() : std::string(rest.substr(dot + 1));
    std::string_view label;
    for (const optim::StateTensor& st : Opt::state_tensors)
      if (st.name == state) label = st.label;
    if (kParamSteps && state == kParamStepState) label = "step count";
    if (label.empty())
      throw IoError(ddp::detail::str("ddp: snapshot '", source, "' has optimizer tensor '", name,
                                     "' that ", Opt::kind,
                                     " does not keep; was it written with another --optimizer?"));
    if (!param_names.contains(param) && !f.contains(param))
      throw IoError(ddp::detail::str(
          "ddp: snapshot '", source, "' has ", label, " '", name, "' for a parameter that ",
          model.describe(), " does not have; was it written for another --arch or model?"));
  }
  detail::load_state_dict_from(f, source, model, /*strict=*/true, kOptimizerPrefix);
  opt.clear_state();
  for (std::size_t i = 0; i < params.size(); ++i) {
    for (const optim::StateTensor& st : Opt::state_tensors) {
      const std::string name = detail::state_key(st.name, params[i]->name());
      if (!f.contains(name)) continue;
      const T* src = reinterpret_cast<const T*>(f.tensors.at(name).data.data());
      Tensor<T, Cpu>& dst = opt.set_state(st.name, i);
      if (params[i]->layout() == nn::Layout::Krsc)
        detail::oihw_to_krsc(src, dst.data(), params[i]->shape());
      else
        std::memcpy(dst.data(), src, dst.bytes());
    }
    if constexpr (kParamSteps) {
      const std::string name = detail::state_key(kParamStepState, params[i]->name());
      if (f.contains(name)) {
        std::int64_t n = 0;
        std::memcpy(&n, f.tensors.at(name).data.data(), sizeof n);
        opt.set_param_step(i, n);
      }
    }
  }
  opt.set_steps(steps);
  // absent only in files not written by save_snapshot: keep the configured lr
  if (lr) opt.set_lr(*lr);
  for (const auto& [g, v] : group_lrs) opt.set_group_lr(g, v);
  for (const auto& [k, v] : f.metadata)
    if (k.rfind("ddp.", 0) != 0 && k.rfind("rng.", 0) != 0 && k.rfind("optimizer.", 0) != 0 &&
        k != "epoch")
      info.metadata[k] = v;
  return info;
}

template <class T, optim::Optimizer Opt>
SnapshotInfo load_snapshot(const std::string& path, nn::Module<T, Cpu>& model, Opt& opt) {
  return load_snapshot_from(read_safetensors(path), path, model, opt);
}
template <class T, optim::Optimizer Opt>
SnapshotInfo load_snapshot_bytes(std::span<const std::uint8_t> bytes, nn::Module<T, Cpu>& model,
                                 Opt& opt, const std::string& source = "<broadcast snapshot>") {
  return load_snapshot_from(parse_safetensors(bytes, source), source, model, opt);
}

}  // namespace ddp::train
