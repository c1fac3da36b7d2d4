#include <loom/ops/dropout.h>

#include <loom/core/generator.h>
#include <loom/core/profiler.h>
#include <loom/ops/dispatch.h>
#include <loom/ops/dropout_math.h>
#include <loom/ops/elementwise.h>

namespace loom {

namespace {
void check_probability(const char* op, const Tensor& x, double p) {
  LOOM_CHECK(p >= 0.0 && p <= 1.0, op, ": the probability p must be between 0 and 1, got ", p);
  LOOM_CHECK(x.defined() && is_floating(x.dtype()), op, ": expected a floating-point input, got ",
             x.defined() ? x.str() : "an undefined tensor");
}

// A mask of `sizes` in x's dtype on x's device, seeded from the global generator.
Tensor draw_mask(const Tensor& x, const Shape& sizes, double p) {
  Tensor mask = Tensor::empty(sizes, x.dtype(), x.device());
  const uint64_t seed = default_generator().next_u64();
  LOOM_DISPATCH(mask, dropout_mask, mask, p, seed);
  return mask;
}
}  // namespace

Tensor dropout(const Tensor& x, double p, bool training) {
  check_probability("dropout", x, p);
  if (!training || p == 0.0) return x;
  profiler::Scope profile("dropout", x);
  const Tensor mask = draw_mask(x, x.sizes(), p);
  Tensor out;
  {
    NoGradGuard no_grad;
    out = mul(x, mask);
  }
  // Backward reads only the mask (not x): dx = g * m.
  record("dropout", {x}, {&out}, [mask](const TensorList& g, const Node&) {
    NoGradGuard no_grad;
    return TensorList{mul(g[0].to(mask.dtype()), mask)};
  });
  return out;
}

StochasticDepthMode parse_stochastic_depth_mode(const std::string& mode) {
  if (mode == "row") return StochasticDepthMode::row;
  if (mode == "batch") return StochasticDepthMode::batch;
  throw Error("stochastic_depth: mode must be \"row\" or \"batch\", got \"" + mode + "\"");
}

Tensor stochastic_depth(const Tensor& x, double p, StochasticDepthMode mode, bool training) {
  check_probability("stochastic_depth", x, p);
  if (!training || p == 0.0) return x;
  LOOM_CHECK(x.dim() >= 1, "stochastic_depth: expected an input with a batch dimension, got ", x.str());
  profiler::Scope profile("stochastic_depth", x);
  // torchvision: noise of shape (N, 1, ..., 1) ("row") or (1, ..., 1)
  // ("batch"), bernoulli(1 - p), divided by 1 - p when that is positive.
  if (mode == StochasticDepthMode::row) {
    Shape noise_sizes(x.dim(), 1);
    noise_sizes[0] = x.size(0);
    return mul(x, draw_mask(x, noise_sizes, p));  // the row broadcast
  }
  // One draw, made on the host as the mask kernels make element 0 of theirs
  // (ops/dropout_math.h): 0 or 1 / (1 - p), with no wait for the device.
  const uint64_t seed = default_generator().next_u64();
  return scale(x, ops::dropout_keep(seed, 0, p) ? ops::dropout_scale(p) : 0.0);
}

}  // namespace loom
