// GradScaler: dynamic loss scaling for fp16 mixed precision (torch.cuda.amp.GradScaler's rule).
// SPDX-License-Identifier: MIT
//
// Why: in fp16 (5 exponent bits) gradients below ~6e-8 flush to zero and above 65504 overflow.
// Multiplying the loss gradient by a scale S moves the backward's values into fp16's range; the
// gradients are divided by S before the optimizer sees them. A step whose gradients hold an inf
// or NaN (S too large) is skipped and S shrinks; after growth_interval finite steps in a row S
// grows:
//   found_inf:  skip opt.step(),  S *= backoff_factor,  finite_run = 0
//   finite:     opt.step(),       finite_run += 1;
//               if finite_run == growth_interval: S *= growth_factor, finite_run = 0
// With S and both factors powers of two (the defaults) scaling is exact: a run that never
// overflows ends bit-identical to the same run without a scaler (no denormals assumed).
//
// One step, in torch's order (scale(loss).backward(); unscale_(opt); clip; step(opt); update();
// the DDP tutorial's minGPT trainer clips the *scaled* gradients before unscale_, a defect we do
// not copy):
//   ce.forward(...); Tensor dlogits = ce.backward(exec);
//   scaler.scale_grad(exec, dlogits.view());       // d(S * loss)
//   model.backward(exec, dlogits.cview());
//   const auto u = scaler.unscale(exec, params);   // divides by S; u.norm: unscaled global L2 norm
//   if (!u.found_inf) optim::clip_to_norm(exec, params, max_norm, u.norm);
//   scaler.step(exec, opt);                        // opt.step(exec) unless found_inf
//   scaler.update();
// unscale's inf check is the global sum of squares in double (finite floats square without
// overflow): non-finite exactly when some gradient is inf or NaN. The same sum is clipping's norm,
// so scaling costs one extra pass (the division) and, on the GPU, one host sync (as torch's
// found_inf.item()). Under DDP the gradients are averaged before backward returns, so every rank
// sees the same inf/NaN and decides alike without communication; a sharded optimizer (ZeRO) would
// have to all-reduce found_inf (torch's ShardedGradScaler). Disabled (torch's enabled=False):
// scale() is 1, scale_grad and update do nothing, unscale only computes the norm, step always
// steps. state() / load_state(): snapshot metadata (scale, finite run, skipped steps; a trainer
// counts its iterations as opt.steps() + skipped_steps()).
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/fused_args.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/nn/parameter.hpp"
#include "ddp/optim/clip.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::optim {

struct GradScalerOptions {      // torch.cuda.amp.GradScaler's defaults
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
  bool enabled = true;
};

struct UnscaleResult {
  bool found_inf = false;  // some gradient is inf or NaN: the step must be skipped
  // the global L2 norm of the unscaled gradients (non-finite when found_inf)
  double norm = 0.0;
};

template <class T, Device D>
class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& o = {}) : o_(o), scale_(o.init_scale) {
    if (!o.enabled) return;
    if (!(o.init_scale > 0.0) || !std::isfinite(o.init_scale))
      throw ValueError(ddp::detail::str("ddp: GradScaler's init_scale must be finite and > 0, got ",
                                        o.init_scale));
    if (!(o.growth_factor > 1.0) || !std::isfinite(o.growth_factor))
      throw ValueError(ddp::detail::str(
          "ddp: GradScaler's growth_factor must be finite and > 1, got ", o.growth_factor));
    if (!(o.backoff_factor > 0.0 && o.backoff_factor < 1.0))
      throw ValueError(ddp::detail::str("ddp: GradScaler's backoff_factor must be in (0, 1), got ",
                                        o.backoff_factor));
    if (o.growth_interval < 1)
      throw ValueError(ddp::detail::str("ddp: GradScaler's growth_interval must be >= 1, got ",
                                        o.growth_interval));
  }

  bool enabled() const noexcept { return o_.enabled; }
  const GradScalerOptions& options() const noexcept { return o_; }
  // The factor the loss gradient is multiplied by (1 when disabled).
  double scale() const noexcept { return o_.enabled ? scale_ : 1.0; }
  // Finite steps in a row since the scale last changed (torch's _growth_tracker).
  std::int64_t finite_run() const noexcept { return finite_run_; }
  // Steps skipped because of an inf or NaN since construction (or as restored by load_state).
  std::int64_t skipped_steps() const noexcept { return skipped_; }

  // d(loss) *= scale(), in place: the seed of backward (e.g. the loss's d(logits)).
  void scale_grad(Exec<D>& exec, TensorView<T, D> dloss) const {
    if (!o_.enabled || scale_ == 1.0) return;
    const kernels::TensorPtr<T> t{.data = dloss.data(), .numel = dloss.numel()};
    Kernels<D>::scale_multi(exec,
                            kernels::MultiScaleArgs<T, D>{.tensors = {&t, 1}, .alpha = scale_});
  }

  // After backward: checks `params`' gradients for inf/NaN and, if none, divides them by scale().
  // Once per step (a second call is an error: it would divide twice).
  UnscaleResult unscale(Exec<D>& exec, const std::vector<nn::Parameter<T, D>*>& params) {
    if (unscaled_)
      throw ValueError(
          "ddp: GradScaler::unscale called twice in one step; call update() after each step");
    const auto grads = detail::grads_of(params);
    const double sum =
        Kernels<D>::sum_squares_multi(exec, kernels::MultiTensorArgs<T, D>{.tensors = grads});
    const double s = scale();
    result_ = {.found_inf = !std::isfinite(sum), .norm = std::sqrt(sum) / s};
    if (!result_.found_inf && s != 1.0)
      Kernels<D>::scale_multi(exec,
                              kernels::MultiScaleArgs<T, D>{.tensors = grads, .alpha = 1.0 / s});
    unscaled_ = true;
    return result_;
  }

  // opt.step(exec) unless the gradients held an inf or NaN (unscales first if needed); true if
  // the optimizer stepped.
  template <class Opt>
  bool step(Exec<D>& exec, Opt& opt) {
    if (!unscaled_) unscale(exec, opt.parameters());
    if (result_.found_inf) return false;
    opt.step(exec);
    return true;
  }

  // The scale rule (file comment), after step(); ends the step (the next may unscale again).
  void update() {
    if (!unscaled_)
      throw ValueError("ddp: GradScaler::update called without unscale or step in this step");
    unscaled_ = false;
    if (!o_.enabled) return;
    if (result_.found_inf) {
      scale_ *= o_.backoff_factor;
      finite_run_ = 0;
      ++skipped_;
    } else if (++finite_run_ == o_.growth_interval) {
      scale_ *= o_.growth_factor;
      finite_run_ = 0;
    }
  }

  // Entries prefixed "grad_scaler."; doubles in the shortest form that reads back exactly.
  std::map<std::string, std::string> state() const {
    return {{"grad_scaler.scale", shortest(scale_)},
            {"grad_scaler.finite_run", std::to_string(finite_run_)},
            {"grad_scaler.skipped_steps", std::to_string(skipped_)}};
  }
  // Absent entries (a run without a scaler) keep their value; `source` names the file in errors.
  void load_state(const std::map<std::string, std::string>& meta, const std::string& source) {
    const auto read = [&](const char* key, auto& into) {
      const auto it = meta.find(key);
      if (it == meta.end()) return;
      const std::string& v = it->second;
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), into);
      if (ec != std::errc() || end != v.data() + v.size())
        throw ValueError(ddp::detail::str("ddp: snapshot ", ddp::detail::quoted(source),
                                          ": metadata ", key, " = ", ddp::detail::quoted(v),
                                          " is not a number"));
    };
    read("grad_scaler.scale", scale_);
    read("grad_scaler.finite_run", finite_run_);
    read("grad_scaler.skipped_steps", skipped_);
    if (!(scale_ > 0.0) || !std::isfinite(scale_) || finite_run_ < 0 || skipped_ < 0)
      throw ValueError(ddp::detail::str(
          "ddp: snapshot ", ddp::detail::quoted(source), ": invalid grad_scaler state (scale ",
          scale_, ", finite_run ", finite_run_, ", skipped_steps ", skipped_, ")"));
  }

 private:
  static std::string shortest(double v) {
    char buf[32];
    const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, end);
  }

  GradScalerOptions o_;
  double scale_;
  std::int64_t finite_run_ = 0, skipped_ = 0;
  bool unscaled_ = false;
  UnscaleResult result_;
};

}  // namespace ddp::optim
