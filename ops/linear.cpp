#include <loom/core/profiler.h>
#include <loom/ops/linear.h>

#include <loom/ops/autocast.h>
#include <loom/ops/dispatch.h>

namespace loom {

Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias) {
  // Under autocast (amp O1) the product runs in the lower precision.
  if (ops::autocast_lowers({input, weight, bias}))
    return linear(ops::autocast_lower(input), ops::autocast_lower(weight), ops::autocast_lower(bias));
  profiler::Scope profile("linear", input);
  LOOM_CHECK(input.dim() == 2, "linear: input must be (N, in_features), got ", input.str());
  LOOM_CHECK(weight.dim() == 2 && weight.size(1) == input.size(1), "linear: weight ", weight.str(),
             " does not match input ", input.str(), "; expected (out_features, ", input.size(1), ")");
  LOOM_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)), "linear: bias ", bias.str(),
             " does not match ", weight.size(0), " output features");
  ops::check_same_device_and_dtype("linear", {input, weight, bias});
  Tensor out;
  {
    NoGradGuard no_grad;
    out = LOOM_DISPATCH(input, linear_forward, input, weight, bias);
  }
  record("linear", {input, weight, bias}, {&out},
         [x = input.detach(), w = weight.detach()](const TensorList& g, const Node& node) {
           TensorList grads(3);
           // Weight and bias gradients straight into their gradient destinations (DDP buckets).
           grads[1] = node.gradient_destination(1);
           grads[2] = node.gradient_destination(2);
           LOOM_DISPATCH(x, linear_backward, g[0], x, w, node.needs_input_grad(0), node.needs_input_grad(1),
                         node.needs_input_grad(2), grads[0], grads[1], grads[2]);
           return grads;
         });
  return out;
}

}  // namespace loom
