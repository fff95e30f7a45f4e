// Parameter initialisation (torch.nn.init's role): the random fills layers use, torch's fan-in
// bound, and SkipDefaultInit for models that initialise every parameter themselves.
// SPDX-License-Identifier: MIT
//
// Every layer with parameters initialises itself at construction, as its torch.nn namesake does
// (docs/decisions/0064): Linear and Conv2d draw U(-b, b), b = fan_in_bound(fan_in), for weight and
// bias; Embedding N(0, init_std^2); BatchNorm2d and LayerNorm set weight 1 and bias 0 (no draw).
// Draws come from the process-wide default generator (manual_seed(s) repeats them) through the
// layer's reset_parameters(); reset_parameters(gen) uses the caller's generator instead. Example:
// after manual_seed(1), Linear(4 -> 2) draws its weight (8 values) then its bias (2) as
// Linear(4 -> 2).reset_parameters(gen) does with gen = Generator(1). Draws run on the host and are
// copied to the parameter's device, so a CUDA layer gets the CPU layer's numbers.
#pragma once

#include <cmath>
#include <cstdint>

#include "ddp/nn/parameter.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/random.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::nn {

// torch's default bound for Linear and Conv2d weight and bias: kaiming_uniform_(a = sqrt(5)) is
// U(-b, b) with b = gain sqrt(3 / fan_in), gain = sqrt(2 / (1 + a^2)) = sqrt(1/3), so
// b = 1 / sqrt(fan_in); fan_in = in_features (Linear) or C_in kH kW (Conv2d), as in torch.
inline double fan_in_bound(std::int64_t fan_in) {
  return 1.0 / std::sqrt(static_cast<double>(fan_in));
}

// p.value() ~ U(lo, hi), drawn from gen on the host.
template <class T, Device D>
void init_uniform(Parameter<T, D>& p, Generator& gen, double lo, double hi) {
  detail::fill_via_host(p.value(), [&](TensorView<T, Cpu> v) { gen.fill_uniform(v, lo, hi); });
}

// p.value() ~ N(mean, std^2), drawn from gen on the host.
template <class T, Device D>
void init_normal(Parameter<T, D>& p, Generator& gen, double mean, double std) {
  detail::fill_via_host(p.value(), [&](TensorView<T, Cpu> v) { gen.fill_normal(v, mean, std); });
}

// The same draws from the process-wide default generator (torch.nn.init.uniform_ / normal_), for a
// module of one's own to call on the parameters it registers (they start at zero).
template <class T, Device D>
void init_uniform(Parameter<T, D>& p, double lo, double hi) {
  with_default_generator([&](Generator& gen) { init_uniform(p, gen, lo, hi); });
}
template <class T, Device D>
void init_normal(Parameter<T, D>& p, double mean, double std) {
  with_default_generator([&](Generator& gen) { init_normal(p, gen, mean, std); });
}

// While one lives on this thread, layers constructed on it skip their random default
// initialisation: they draw nothing (parameters stay zero) and leave the default generator where it
// was. For models whose reset_parameters() overwrites every parameter right after construction
// (ResNet, GPT): it saves draws the model would discard (resnet50: a fifth of construction time,
// docs/decisions/0064). Constant initialisations (BatchNorm2d, LayerNorm) still run. Nests.
class SkipDefaultInit {
 public:
  SkipDefaultInit() noexcept { ++depth(); }
  ~SkipDefaultInit() { --depth(); }
  SkipDefaultInit(const SkipDefaultInit&) = delete;
  SkipDefaultInit& operator=(const SkipDefaultInit&) = delete;

  // Whether a SkipDefaultInit lives on this thread.
  static bool active() noexcept { return depth() > 0; }

 private:
  static int& depth() noexcept {
    thread_local int d = 0;
    return d;
  }
};

}  // namespace ddp::nn
