// GPT: the DDP tutorial's minGPT (pytorch/examples distributed/minGPT-ddp, mingpt/model.py), ids
// (B, T) -> logits (B, T, vocab_size), with explicit forward and backward (docs/decisions/0006).
// SPDX-License-Identifier: MIT
//
// Modules and parameter names are the tutorial's, registered in its order, so parameters() and
// state_dict_keys() list them as its named_parameters() does:
//   emb_stem       EmbeddingStem: x = drop(tok_emb(ids) + pos_emb[:, :T, :])
//     pos_emb      Parameter (1, block_size, C)
//     tok_emb      Embedding(vocab_size, C)
//     drop         Dropout(embd_pdrop)
//   blocks.i       Block, i < n_layer: x = x + attn(ln1(x)); x = x + mlp(ln2(x))
//     ln1, ln2     LayerNorm(C)
//     attn         AttentionLayer (the tutorial's MultiheadAttentionLayer):
//                  y = resid_drop(c_proj(attn(x)))
//       c_proj     Linear(C, C)
//       attn       CausalSelfAttention(C, n_head, block_size, attn_pdrop): c_attn Linear(C, 3C),
//                  c_proj Linear(C, C), dropout on its probabilities
//     mlp          Sequential(Linear(C, 4C), GELU (exact), Linear(4C, C), Dropout(resid_pdrop))
//   ln_f           LayerNorm(C)
//   head           Linear(C, vocab_size, bias = false)
// The tutorial's state_dict has the same names (mingpt_state_dict_key) except inside its
// torch.nn.MultiheadAttention, whose packed projections are our CausalSelfAttention's:
//   blocks.i.attn.attn.c_attn.weight (3C, C)  <->  blocks.i.attn.attn.in_proj_weight (rows q, k, v)
//   blocks.i.attn.attn.c_attn.bias   (3C)     <->  blocks.i.attn.attn.in_proj_bias
//   blocks.i.attn.attn.c_proj.weight (C, C)   <->  blocks.i.attn.attn.out_proj.weight
//   blocks.i.attn.attn.c_proj.bias   (C)      <->  blocks.i.attn.attn.out_proj.bias
// and its tril buffer blocks.i.attn.mask has no counterpart (mingpt_ignored_keys). Its model's
// state_dict, saved with safetensors, loads with
//     train::load_state_dict(path, gpt, /*strict=*/true,
//                            {.file_key = nn::mingpt_state_dict_key,
//                             .ignore = nn::mingpt_ignored_keys(n_layer)});
// One deliberate difference: ours is causal. The tutorial passes its float tril mask as attn_mask,
// which MultiheadAttention ADDS to the scores (+1 on and below the diagonal, +0 above), so its
// model is not (a known defect).
//
// Initialisation (reset_parameters, called by the constructor) is what the tutorial's code leaves
// (docs/decisions/0045), drawn from Generator(seed, 0, kStreamInit) in parameter order: tok_emb and
// every Linear's weight N(0, 0.02^2), biases 0, LayerNorms 1 and 0, pos_emb 0, except
// blocks.i.attn.c_proj.weight N(0, (0.02 / sqrt(2 n_layer))^2) and c_attn, which keeps torch's
// xavier_uniform_: U(-a, a), a = sqrt(6 / (C + 3C)), bias 0. The layers skip their own default
// init (SkipDefaultInit), so building a GPT leaves the default generator (manual_seed) untouched.
//
// Dropout: each of the 1 + 3 n_layer dropouts draws on its own Philox stream dropout_stream + k,
// k in model order: emb_stem.drop 0, blocks.i.attn.resid_drop 1 + 3i, blocks.i.attn.attn 2 + 3i,
// blocks.i.mlp.3 3 + 3i (docs/decisions/0043), whatever the probabilities, 0 included.
// set_dropout_step() restores every mask's step on resume.
//
// forward(exec, ids): int64 ids (B, T), T <= block_size (else ValueError); THE CALLER KEEPS THE
// IDS ALIVE until backward returns (nn/module.hpp). Module's forward with T values is a ValueError.
// backward(exec, dlogits (B, T, vocab_size)) fills every parameter's gradient and returns an empty
// tensor (ids take no gradient). The Linears see (B*T, features) rows. Devices: any (Kernels<D>;
// CUDA: docs/decisions/0048); on the GPU a token id out of range is reported by the embedding
// kernel.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/core/trace.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/nn/causal_self_attention.hpp"
#include "ddp/nn/dropout.hpp"
#include "ddp/nn/embedding.hpp"
#include "ddp/nn/gelu.hpp"
#include "ddp/nn/init.hpp"
#include "ddp/nn/layer_norm.hpp"
#include "ddp/nn/linear.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/sequential.hpp"
#include "ddp/tensor/random.hpp"

namespace ddp::nn {

struct GPTOptions {
  std::int64_t vocab_size = 0;
  std::int64_t block_size = 0;  // longest sequence T
  std::int64_t n_layer = 8;     // the tutorial's gpt2_train_cfg.yaml: 8, 8, 512
  std::int64_t n_head = 8;
  std::int64_t n_embd = 512;  // C
  double embd_pdrop = 0.1;    // the tutorial's GPTConfig defaults
  double resid_pdrop = 0.1;
  // dropout on the attention probabilities (the tutorial's default is 0.1)
  double attn_pdrop = 0.0;
  // initialisation and dropout seed (the same on every rank)
  std::uint64_t seed = 0;
  // this process's global rank: dropout masks differ by rank
  std::uint32_t rank = 0;
  // Philox stream of emb_stem.drop; the k-th dropout in model order uses + k
  std::uint32_t dropout_stream = 3u << 16;
};

// The tutorial's state_dict key of our parameter `name` (the file comment's mapping). Matched on
// the end of the name, so it also maps a GPT registered inside another module. Example:
// "blocks.1.attn.attn.c_proj.bias" -> "blocks.1.attn.attn.out_proj.bias";
// "blocks.1.attn.c_proj.bias" (the layer's own c_proj) is unchanged.
inline std::string mingpt_state_dict_key(const std::string& name) {
  struct Rename {
    std::string_view ours, theirs;
  };
  static constexpr Rename kRenames[] = {{".attn.attn.c_attn.weight", ".attn.attn.in_proj_weight"},
                                        {".attn.attn.c_attn.bias", ".attn.attn.in_proj_bias"},
                                        {".attn.attn.c_proj.weight", ".attn.attn.out_proj.weight"},
                                        {".attn.attn.c_proj.bias", ".attn.attn.out_proj.bias"}};
  for (const Rename& r : kRenames)
    if (std::string_view(name).ends_with(r.ours))
      return name.substr(0, name.size() - r.ours.size()) + std::string(r.theirs);
  return name;
}

// The tutorial's keys with no counterpart here, for n_layer blocks: each block's causal-mask
// buffer "blocks.i.attn.mask" (we compute the mask); a load of its file ignores them.
inline std::set<std::string> mingpt_ignored_keys(std::int64_t n_layer) {
  std::set<std::string> out;
  for (std::int64_t i = 0; i < n_layer; ++i)
    out.insert(ddp::detail::str("blocks.", i, ".attn.mask"));
  return out;
}

namespace detail {
// ValueError unless ids is (B, T) with B, T >= 1 and T <= block_size.
inline void check_gpt_ids(const std::string& where, const Shape& s, std::int64_t block_size) {
  if (s.rank() != 2 || s[0] < 1 || s[1] < 1)
    throw ValueError(ddp::detail::str(
        "ddp: ", where, ": token ids must be (B, T) with B, T >= 1 but have shape ", s));
  if (s[1] > block_size)
    throw ValueError(ddp::detail::str(
        "ddp: ", where, ": cannot forward a sequence of length T = ", s[1], ", block_size is only ",
        block_size, "; crop the ids to their last block_size positions"));
}
}  // namespace detail

// The tutorial's EmbeddingStem: token embedding plus a learned position embedding, then dropout.
template <class T, Device D>
class EmbeddingStem : public Module<T, D> {
 public:
  EmbeddingStem(std::int64_t vocab_size, std::int64_t block_size, std::int64_t n_embd,
                const DropoutOptions& drop)
      : block_size_(block_size), n_embd_(n_embd) {
    pos_emb_ = &this->register_parameter("pos_emb", Shape{1, block_size, n_embd});  // zeros
    tok_emb_ = &this->register_module(
        "tok_emb", std::make_unique<Embedding<T, D>>(EmbeddingOptions{
                       .num_embeddings = vocab_size, .embedding_dim = n_embd, .init_std = 0.02}));
    drop_ = &this->register_module("drop", std::make_unique<Dropout<T, D>>(drop));
  }

  Embedding<T, D>& tok_emb() noexcept { return *tok_emb_; }
  Parameter<T, D>& pos_emb() noexcept { return *pos_emb_; }
  Dropout<T, D>& drop() noexcept { return *drop_; }

  std::string describe() const override {
    return ddp::detail::str("EmbeddingStem(block_size=", block_size_, ", n_embd=", n_embd_, ")");
  }

 protected:
  // ids (B, T) -> (B, T, C): x[b, t, :] = tok_emb.weight[ids[b, t], :] + pos_emb[0, t, :], then
  // dropout.
  Tensor<T, D> forward_ids_impl(Exec<D>& exec, TensorView<const std::int64_t, D> ids) override {
    detail::check_gpt_ids(this->where(), ids.shape(), block_size_);
    const std::int64_t b = ids.dim(0), t = ids.dim(1);
    Tensor<T, D> x = tok_emb_->forward(exec, ids);  // (B, T, C)
    const TensorView<const T, D> pos =
        pos_emb_->value().cview().reshape(Shape{block_size_, n_embd_}).slice(0, t);
    for (std::int64_t i = 0; i < b; ++i)
      Kernels<D>::axpy(exec, T(1), pos, x.view().slice(i, i + 1).reshape(Shape{t, n_embd_}));
    t_ = t;
    return drop_->forward(exec, x.cview());  // Dropout keeps no view of its input
  }

  Tensor<T, D> forward_impl(Exec<D>&, TensorView<const T, D> x) override {
    this->reject_values(x.shape());
  }

  // d pos_emb[0, t, :] = sum over b of dx[b, t, :] for t < T, 0 for the rows this forward did not
  // use; the embedding's gradient by token. Returns an empty tensor.
  Tensor<T, D> backward_impl(Exec<D>& exec, TensorView<const T, D> dy) override {
    Tensor<T, D> dx = drop_->backward(exec, dy);  // checks the forward state and dy's shape
    const std::int64_t b = dx.dim(0);
    TensorView<T, D> dpos = pos_emb_->grad_dest().reshape(Shape{block_size_, n_embd_});
    Kernels<D>::fill(exec, dpos, T(0));
    for (std::int64_t i = 0; i < b; ++i)
      Kernels<D>::axpy(exec, T(1), dx.cview().slice(i, i + 1).reshape(Shape{t_, n_embd_}),
                       dpos.slice(0, t_));
    pos_emb_->grad_done(exec);
    return tok_emb_->backward(exec, dx.cview());
  }

 private:
  std::int64_t block_size_, n_embd_;
  Parameter<T, D>* pos_emb_ = nullptr;  // (1, block_size, C)
  Embedding<T, D>* tok_emb_ = nullptr;
  Dropout<T, D>* drop_ = nullptr;
  std::int64_t t_ = 0;  // T of the last forward
};

// The tutorial's MultiheadAttentionLayer (causal here, see the file comment): x (B, T, C) ->
// resid_drop(c_proj(attn(x))).
template <class T, Device D>
class AttentionLayer : public Module<T, D> {
 public:
  AttentionLayer(const CausalSelfAttentionOptions& attn, const DropoutOptions& resid_drop)
      : n_embd_(attn.n_embd) {
    resid_drop_ = &this->register_module("resid_drop", std::make_unique<Dropout<T, D>>(resid_drop));
    c_proj_ =
        &this->register_module("c_proj", std::make_unique<Linear<T, D>>(LinearOptions{
                                             .in_features = n_embd_, .out_features = n_embd_}));
    attn_ = &this->register_module("attn", std::make_unique<CausalSelfAttention<T, D>>(attn));
  }

  CausalSelfAttention<T, D>& attn() noexcept { return *attn_; }
  Linear<T, D>& c_proj() noexcept { return *c_proj_; }
  Dropout<T, D>& resid_drop() noexcept { return *resid_drop_; }

  std::string describe() const override {
    return ddp::detail::str("AttentionLayer(n_embd=", n_embd_, ")");
  }

 protected:
  Tensor<T, D> forward_impl(Exec<D>& exec, TensorView<const T, D> x) override {
    y_ = attn_->forward(exec, x);  // (B, T, C); checks x
    const std::int64_t b = y_.dim(0), t = y_.dim(1);
    Tensor<T, D> z = c_proj_->forward(exec, y_.cview().reshape(Shape{b * t, n_embd_}));
    z.reshape(Shape{b, t, n_embd_});
    return resid_drop_->forward(exec, z.cview());
  }

  Tensor<T, D> backward_impl(Exec<D>& exec, TensorView<const T, D> dy) override {
    Tensor<T, D> dz = resid_drop_->backward(exec, dy);  // checks the forward state and dy's shape
    const std::int64_t b = dz.dim(0), t = dz.dim(1);
    Tensor<T, D> dyattn = c_proj_->backward(exec, dz.cview().reshape(Shape{b * t, n_embd_}));
    y_ = Tensor<T, D>();
    dyattn.reshape(Shape{b, t, n_embd_});
    return attn_->backward(exec, dyattn.cview());
  }

 private:
  std::int64_t n_embd_;
  Dropout<T, D>* resid_drop_ = nullptr;
  Linear<T, D>* c_proj_ = nullptr;
  CausalSelfAttention<T, D>* attn_ = nullptr;
  Tensor<T, D> y_;  // (B, T, C) attn's output, c_proj's input (it keeps a view)
};

// The tutorial's Block: x = x + attn(ln1(x)); x = x + mlp(ln2(x)); x (B, T, C) -> (B, T, C).
template <class T, Device D>
class Block : public Module<T, D> {
 public:
  Block(const CausalSelfAttentionOptions& attn, const DropoutOptions& attn_drop,
        const DropoutOptions& mlp_drop)
      : n_embd_(attn.n_embd) {
    const std::int64_t c = n_embd_;
    ln1_ = &this->register_module(
        "ln1", std::make_unique<LayerNorm<T, D>>(LayerNormOptions{.normalized_shape = c}));
    ln2_ = &this->register_module(
        "ln2", std::make_unique<LayerNorm<T, D>>(LayerNormOptions{.normalized_shape = c}));
    attn_ = &this->register_module("attn", std::make_unique<AttentionLayer<T, D>>(attn, attn_drop));
    mlp_ = &this->register_module("mlp", std::make_unique<Sequential<T, D>>());
    fc_ = &mlp_->push_back(
        std::make_unique<Linear<T, D>>(LinearOptions{.in_features = c, .out_features = 4 * c}));
    mlp_->push_back(std::make_unique<GELU<T, D>>());
    proj_ = &mlp_->push_back(
        std::make_unique<Linear<T, D>>(LinearOptions{.in_features = 4 * c, .out_features = c}));
    mlp_->push_back(std::make_unique<Dropout<T, D>>(mlp_drop));
  }

  LayerNorm<T, D>& ln1() noexcept { return *ln1_; }
  LayerNorm<T, D>& ln2() noexcept { return *ln2_; }
  AttentionLayer<T, D>& attn() noexcept { return *attn_; }
  Sequential<T, D>& mlp() noexcept { return *mlp_; }
  Linear<T, D>& mlp_fc() noexcept { return *fc_; }      // mlp.0
  Linear<T, D>& mlp_proj() noexcept { return *proj_; }  // mlp.2
  Dropout<T, D>& mlp_drop() noexcept { return static_cast<Dropout<T, D>&>((*mlp_)[3]); }

  std::string describe() const override { return ddp::detail::str("Block(n_embd=", n_embd_, ")"); }

 protected:
  Tensor<T, D> forward_impl(Exec<D>& exec, TensorView<const T, D> x) override {
    if (x.rank() != 3)
      throw ValueError(ddp::detail::str("ddp: ", this->where(),
                                        ": input must be (B, T, C) but has shape ", x.shape()));
    const std::int64_t b = x.dim(0), t = x.dim(1), c = n_embd_;
    a_ = ln1_->forward(exec, x);  // ln1 checks C
    Tensor<T, D> y = attn_->forward(exec, a_.cview());
    x1_ = Tensor<T, D>(x.shape());
    Kernels<D>::add(exec, x, y.cview(), x1_.view());
    h_ = ln2_->forward(exec, x1_.cview());
    Tensor<T, D> m = mlp_->forward(exec, h_.cview().reshape(Shape{b * t, c}));
    Kernels<D>::axpy(exec, T(1), x1_.cview().reshape(Shape{b * t, c}), m.view());
    m.reshape(x.shape());
    return m;
  }

  // Through the second residual dy goes both to mlp and straight to x1; through the first, both to
  // attn and to x.
  Tensor<T, D> backward_impl(Exec<D>& exec, TensorView<const T, D> dy) override {
    this->require_forward_state(!x1_.empty());
    expect_shape(dy, x1_.shape(), "output gradient dy", this->where().c_str());
    const std::int64_t b = dy.dim(0), t = dy.dim(1), c = n_embd_;
    Tensor<T, D> dh = mlp_->backward(exec, dy.reshape(Shape{b * t, c}));
    dh.reshape(dy.shape());
    Tensor<T, D> dx1 = ln2_->backward(exec, dh.cview());
    Kernels<D>::axpy(exec, T(1), dy, dx1.view());
    h_ = Tensor<T, D>();
    x1_ = Tensor<T, D>();
    Tensor<T, D> da = attn_->backward(exec, dx1.cview());
    Tensor<T, D> dx = ln1_->backward(exec, da.cview());
    Kernels<D>::axpy(exec, T(1), dx1.cview(), dx.view());
    a_ = Tensor<T, D>();
    return dx;
  }

 private:
  std::int64_t n_embd_;
  LayerNorm<T, D>* ln1_ = nullptr;
  LayerNorm<T, D>* ln2_ = nullptr;
  AttentionLayer<T, D>* attn_ = nullptr;
  Sequential<T, D>* mlp_ = nullptr;
  Linear<T, D>* fc_ = nullptr;
  Linear<T, D>* proj_ = nullptr;
  // Kept for backward (the children keep views of them): ln1(x), x1 = x + attn(ln1(x)), ln2(x1).
  Tensor<T, D> a_, x1_, h_;  // each (B, T, C)
};

template <class T, Device D>
class GPT : public Module<T, D> {
 public:
  explicit GPT(const GPTOptions& o) : o_(o) {
    const SkipDefaultInit skip;  // reset_parameters() below sets every parameter
    if (o.vocab_size < 1 || o.block_size < 1 || o.n_layer < 1 || o.n_head < 1 || o.n_embd < 1)
      throw ValueError(
          ddp::detail::str("ddp: invalid ", describe(),
                           ": vocab_size, block_size, n_layer, n_head and n_embd must be >= 1"));
    std::uint32_t stream = o.dropout_stream;
    auto dropout = [&](double p) {
      return DropoutOptions{.p = p, .seed = o.seed, .rank = o.rank, .stream = stream++};
    };
    emb_stem_ = &this->register_module(
        "emb_stem", std::make_unique<EmbeddingStem<T, D>>(o.vocab_size, o.block_size, o.n_embd,
                                                          dropout(o.embd_pdrop)));
    blocks_ = &this->register_module("blocks", std::make_unique<Sequential<T, D>>());
    for (std::int64_t i = 0; i < o.n_layer; ++i) {  // the streams in model order (file comment)
      const DropoutOptions attn_drop = dropout(o.resid_pdrop);
      const CausalSelfAttentionOptions attn{.n_embd = o.n_embd,
                                            .n_head = o.n_head,
                                            .block_size = o.block_size,
                                            .attn_pdrop = o.attn_pdrop,
                                            .seed = o.seed,
                                            .rank = o.rank,
                                            .stream = stream++};
      const DropoutOptions mlp_drop = dropout(o.resid_pdrop);
      block_list_.push_back(
          &blocks_->push_back(std::make_unique<Block<T, D>>(attn, attn_drop, mlp_drop)));
    }
    ln_f_ = &this->register_module(
        "ln_f", std::make_unique<LayerNorm<T, D>>(LayerNormOptions{.normalized_shape = o.n_embd}));
    head_ = &this->register_module(
        "head", std::make_unique<Linear<T, D>>(LinearOptions{
                    .in_features = o.n_embd, .out_features = o.vocab_size, .bias = false}));
    reset_parameters();
  }

  // The tutorial's initialisation (see the file comment), deterministic in options().seed.
  void reset_parameters() {
    Generator gen(o_.seed, 0, kStreamInit);
    const double c = static_cast<double>(o_.n_embd);
    auto linear = [&](Linear<T, D>& l, double std) {
      init_normal(l.weight(), gen, 0.0, std);
      if (l.bias()) detail::zero_fill(l.bias()->value());
    };
    auto layer_norm = [](LayerNorm<T, D>& ln) {
      detail::fill_value(ln.weight()->value(), T(1));
      detail::zero_fill(ln.bias()->value());
    };
    detail::zero_fill(emb_stem_->pos_emb().value());
    emb_stem_->tok_emb().reset_parameters(gen);  // N(0, 0.02^2): its init_std
    for (Block<T, D>* blk : block_list_) {
      layer_norm(blk->ln1());
      layer_norm(blk->ln2());
      linear(blk->attn().c_proj(), 0.02 / std::sqrt(2.0 * static_cast<double>(o_.n_layer)));
      // MultiheadAttention's xavier_uniform_ in_proj_weight
      Linear<T, D>& in_proj = blk->attn().attn().c_attn();
      const double a = std::sqrt(6.0 / (c + 3.0 * c));
      init_uniform(in_proj.weight(), gen, -a, a);
      detail::zero_fill(in_proj.bias()->value());
      linear(blk->attn().attn().c_proj(), 0.02);
      linear(blk->mlp_fc(), 0.02);
      linear(blk->mlp_proj(), 0.02);
    }
    layer_norm(*ln_f_);
    linear(*head_, 0.02);
  }

  // Restores the step (training forwards done so far) of every Dropout and every attention's
  // dropout on resume: the masks then repeat those of an uninterrupted run (docs/decisions/0043).
  void set_dropout_step(std::uint64_t step) {
    this->visit([&](Module<T, D>& m) {
      if (auto* d = dynamic_cast<Dropout<T, D>*>(&m)) d->set_step(step);
      if (auto* a = dynamic_cast<CausalSelfAttention<T, D>*>(&m)) a->set_step(step);
    });
  }

  const GPTOptions& options() const noexcept { return o_; }
  EmbeddingStem<T, D>& emb_stem() noexcept { return *emb_stem_; }
  Block<T, D>& block(std::size_t i) { return *block_list_.at(i); }
  LayerNorm<T, D>& ln_f() noexcept { return *ln_f_; }
  Linear<T, D>& head() noexcept { return *head_; }

  std::string describe() const override {
    return ddp::detail::str("GPT(vocab_size=", o_.vocab_size, ", block_size=", o_.block_size,
                            ", n_layer=", o_.n_layer, ", n_head=", o_.n_head,
                            ", n_embd=", o_.n_embd, ")");
  }

 protected:
  // ids (B, T) int64, T <= block_size -> logits (B, T, vocab_size).
  Tensor<T, D> forward_ids_impl(Exec<D>& exec, TensorView<const std::int64_t, D> ids) override {
    detail::check_gpt_ids(this->where(), ids.shape(), o_.block_size);
    const std::int64_t b = ids.dim(0), t = ids.dim(1), c = o_.n_embd;
    x0_ = emb_stem_->forward(exec, ids);
    x_ = blocks_->forward(exec, x0_.cview());
    h_ = ln_f_->forward(exec, x_.cview());
    Tensor<T, D> logits = head_->forward(exec, h_.cview().reshape(Shape{b * t, c}));
    logits.reshape(Shape{b, t, o_.vocab_size});
    return logits;
  }

  Tensor<T, D> forward_impl(Exec<D>&, TensorView<const T, D> x) override {
    this->reject_values(x.shape());
  }

  // dlogits (B, T, vocab_size) -> every parameter's gradient; returns an empty tensor.
  Tensor<T, D> backward_impl(Exec<D>& exec, TensorView<const T, D> dlogits) override {
    this->require_forward_state(!h_.empty());
    const std::int64_t b = h_.dim(0), t = h_.dim(1), c = o_.n_embd;
    expect_shape(dlogits, Shape{b, t, o_.vocab_size}, "logits gradient", this->where().c_str());
    Tensor<T, D> dh = head_->backward(exec, dlogits.reshape(Shape{b * t, o_.vocab_size}));
    dh.reshape(Shape{b, t, c});
    h_ = Tensor<T, D>();
    Tensor<T, D> dx = ln_f_->backward(exec, dh.cview());
    x_ = Tensor<T, D>();
    Tensor<T, D> dx0 = blocks_->backward(exec, dx.cview());
    x0_ = Tensor<T, D>();
    return emb_stem_->backward(exec, dx0.cview());
  }

 private:
  GPTOptions o_;
  EmbeddingStem<T, D>* emb_stem_ = nullptr;
  Sequential<T, D>* blocks_ = nullptr;
  std::vector<Block<T, D>*> block_list_;
  LayerNorm<T, D>* ln_f_ = nullptr;
  Linear<T, D>* head_ = nullptr;
  // Kept from forward (the children keep views of them), each (B, T, C): the stem's output, the
  // blocks' output, ln_f's output.
  Tensor<T, D> x0_, x_, h_;
};

}  // namespace ddp::nn
