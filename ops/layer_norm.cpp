#include <loom/ops/layer_norm.h>

#include <loom/core/profiler.h>
#include <loom/ops/autocast.h>
#include <loom/ops/dispatch.h>

namespace loom {

Tensor layer_norm(const Tensor& input, const Tensor& weight, const Tensor& bias, double eps) {
  LOOM_CHECK(input.defined() && input.dim() >= 1, "layer_norm: expected an input with at least one dimension, got ",
             input.defined() ? input.str() : "an undefined tensor");
  // Under autocast (amp O1) it computes in f32, as PyTorch's autocast does (its f32 list): a lower-precision
  // input (a convolution's output) meets the f32 weights of LayerNorm2d.
  if (ops::autocast_raises(input) || ops::autocast_raises(weight) || ops::autocast_raises(bias)) {
    const auto raise = [](const Tensor& t) { return ops::autocast_raises(t) ? t.to(DType::f32) : t; };
    return layer_norm(raise(input), raise(weight), raise(bias), eps);
  }
  profiler::Scope profile("layer_norm", input);
  LOOM_CHECK(is_floating(input.dtype()), "layer_norm: expected a floating-point input, got ", dtype_name(input.dtype()));
  const int64_t features = input.size(input.dim() - 1);
  LOOM_CHECK(features > 0, "layer_norm: the last dimension of ", input.str(), " is empty");
  for (const Tensor* p : {&weight, &bias}) {
    LOOM_CHECK(!p->defined() || (p->dim() == 1 && p->size(0) == features), "layer_norm: expected ",
               p == &weight ? "a weight" : "a bias", " of shape [", features, "] (the input's last dimension), got ",
               shape_str(p->sizes()));
  }
  LOOM_CHECK(eps >= 0, "layer_norm: eps must be non-negative, got ", eps);
  ops::check_same_device_and_dtype("layer_norm", {input, weight, bias});
  ops::LayerNormStatistics statistics;
  Tensor out;
  {
    NoGradGuard no_grad;
    out = LOOM_DISPATCH(input, layer_norm_forward, input, weight, bias, eps, statistics);
  }
  record("layer_norm", {input, weight, bias}, {&out},
         [x = input.detach(), w = weight.defined() ? weight.detach() : Tensor(), statistics](const TensorList& g, const Node& node) {
           const Tensor dy = g[0].to(x.dtype());
           const std::array<bool, 3> needs{node.needs_input_grad(0), node.needs_input_grad(1),
                                           node.needs_input_grad(2)};
           ops::LayerNormGradients grads = LOOM_DISPATCH(dy, layer_norm_backward, dy, x, w, statistics, needs);
           return TensorList{grads.input, grads.weight, grads.bias};
         });
  return out;
}

}  // namespace loom
