// Embedding: a lookup table of token vectors (torch.nn.Embedding); ids (...) -> (..., C).
// SPDX-License-Identifier: MIT
//
// Parameter "weight" (num_embeddings, embedding_dim), as in torch. Its input is int64 token ids,
// not T, so it implements Module's forward(exec, ids); forward(exec, x) with T values is a
// ValueError. It keeps a view of the ids: THE CALLER KEEPS THEM ALIVE AND UNCHANGED until backward
// returns (as for every module's input; backward does not check them again). backward(exec, dy)
// accumulates the weight gradient by token and returns an empty tensor (ids take no gradient).
// Ids outside [0, num_embeddings) are a ValueError: on the CPU checked on the host before the
// lookup, naming this module, the id and its position; on the GPU the ids are device memory, so
// the kernel checks them (a stream wait per forward) and the error names embedding_forward and the
// position in the flattened ids. weight starts as N(0, init_std^2) from the default generator;
// init_std 1 is torch's default, 0.02 minGPT's _init_weights (which the tutorial's minGPT-ddp
// applies to every Embedding and Linear). No padding_idx. GPU kernels: docs/decisions/0048.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/core/trace.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/nn/init.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/tensor/random.hpp"

namespace ddp::nn {

struct EmbeddingOptions {
  std::int64_t num_embeddings = 0;  // vocabulary size V
  std::int64_t embedding_dim = 0;   // C
  double init_std = 1.0;            // reset_parameters' N(0, init_std^2); minGPT: 0.02
};

namespace detail {
// `s` plus a trailing dimension `last`: (B, T) -> (B, T, C); ValueError beyond Shape::kMaxRank.
inline Shape append_dim(const Shape& s, std::int64_t last) {
  switch (s.rank()) {
    case 0: return Shape{last};
    case 1: return Shape{s[0], last};
    case 2: return Shape{s[0], s[1], last};
    case 3: return Shape{s[0], s[1], s[2], last};
    case 4: return Shape{s[0], s[1], s[2], s[3], last};
    default:
      throw ValueError(ddp::detail::str("ddp: ids of shape ", s, " have ", s.rank(),
                                        " dimensions; at most ", Shape::kMaxRank - 1,
                                        " fit (the output adds one)"));
  }
}
}  // namespace detail

template <class T, Device D>
class Embedding : public Module<T, D> {
 public:
  explicit Embedding(const EmbeddingOptions& o) : o_(o) {
    if (o.num_embeddings < 1 || o.embedding_dim < 1)
      throw ValueError(
          ddp::detail::str("ddp: Embedding needs num_embeddings and embedding_dim >= 1, got (",
                           o.num_embeddings, ", ", o.embedding_dim, ")"));
    if (!(o.init_std > 0.0))
      throw ValueError(ddp::detail::str("ddp: Embedding's init_std must be > 0, got ", o.init_std));
    weight_ = &this->register_parameter("weight", Shape{o.num_embeddings, o.embedding_dim});
    if (!SkipDefaultInit::active()) reset_parameters();
  }

  // weight ~ N(0, init_std^2) (torch's reset_parameters: normal_(); minGPT: normal_(0, 0.02)).
  void reset_parameters(Generator& gen) { init_normal(*weight_, gen, 0.0, o_.init_std); }
  // The same from the default generator (what the constructor does).
  void reset_parameters() {
    with_default_generator([&](Generator& gen) { reset_parameters(gen); });
  }

  const EmbeddingOptions& options() const noexcept { return o_; }
  Parameter<T, D>& weight() noexcept { return *weight_; }

  std::string describe() const override {
    return ddp::detail::str("Embedding(", o_.num_embeddings, ", ", o_.embedding_dim, ")");
  }

 protected:
  // y[..., :] = weight[ids[...], :]: ids of any shape (at most 4 dims) -> (..., embedding_dim).
  Tensor<T, D> forward_ids_impl(Exec<D>& exec, TensorView<const std::int64_t, D> ids) override {
    if (ids.numel() == 0)
      throw ValueError(ddp::detail::str("ddp: ", this->where(), ": no token ids (ids shape ",
                                        ids.shape(), "); check --batch-size and the loader"));
    const Shape out = detail::append_dim(ids.shape(), o_.embedding_dim);
    // else the kernel does
    const bool checked = kernels::check_ids_on_host(this->where(), ids, o_.num_embeddings);
    const std::int64_t n = ids.numel();
    Tensor<T, D> y(out);
    Kernels<D>::embedding_forward(
        exec, kernels::EmbeddingForwardArgs<T, D>{.ids = ids.reshape(Shape{n}),
                                                  .weight = weight_->value().cview(),
                                                  .y = y.view().reshape(Shape{n, o_.embedding_dim}),
                                                  .ids_checked = checked});
    ids_ = ids;
    have_ids_ = true;
    return y;
  }

  Tensor<T, D> forward_impl(Exec<D>&, TensorView<const T, D> x) override {
    this->reject_values(x.shape());
  }

  // Accumulates d(loss)/d(weight) by token; returns an empty tensor (no gradient for the ids).
  Tensor<T, D> backward_impl(Exec<D>& exec, TensorView<const T, D> dy) override {
    this->require_forward_state(have_ids_);
    have_ids_ = false;
    expect_shape(dy, detail::append_dim(ids_.shape(), o_.embedding_dim), "output gradient dy",
                 "Embedding.backward");
    const std::int64_t n = ids_.numel();
    // The ids forward checked: no second check, nor its stream wait.
    Kernels<D>::embedding_backward(
        exec, kernels::EmbeddingBackwardArgs<T, D>{.ids = ids_.reshape(Shape{n}),
                                                   .dy = dy.reshape(Shape{n, o_.embedding_dim}),
                                                   .dweight = weight_->grad_dest(),
                                                   .ids_checked = true});
    weight_->grad_done(exec);
    return Tensor<T, D>();
  }

 private:
  EmbeddingOptions o_;
  Parameter<T, D>* weight_ = nullptr;      // (num_embeddings, embedding_dim)
  TensorView<const std::int64_t, D> ids_;  // the last forward's ids, owned by the caller
  bool have_ids_ = false;
};

}  // namespace ddp::nn
