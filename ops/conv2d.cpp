#include <loom/ops/conv2d.h>

#include <tuple>

#include <loom/core/profiler.h>
#include <loom/ops/autocast.h>
#include <loom/ops/dispatch.h>

namespace loom {

Size2 conv2d_output_size(Size2 input, Size2 kernel, const Conv2dParams& params) {
  Size2 out{};
  for (int i = 0; i < 2; ++i) {
    const char* axis = i == 0 ? "height" : "width";
    LOOM_CHECK(params.stride[i] > 0 && params.dilation[i] > 0 && params.padding[i] >= 0, "conv2d: stride (",
               params.stride[i], ") and dilation (", params.dilation[i], ") must be positive and padding (",
               params.padding[i], ") non-negative along the ", axis);
    const int64_t span = params.dilation[i] * (kernel[i] - 1) + 1;
    const int64_t padded = input[i] + 2 * params.padding[i];
    LOOM_CHECK(padded >= span, "conv2d: the kernel spans ", span, " along the ", axis, " but the padded input has only ",
               padded);
    out[i] = (padded - span) / params.stride[i] + 1;
  }
  return out;
}

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dParams& params) {
  // Under autocast (amp O1) the convolution runs in the lower precision.
  if (ops::autocast_lowers({input, weight, bias})) {
    return conv2d(ops::autocast_lower(input), ops::autocast_lower(weight), ops::autocast_lower(bias), params);
  }
  profiler::Scope profile("conv2d", input);
  LOOM_CHECK(input.defined() && weight.defined(), "conv2d: input and weight must be defined");
  LOOM_CHECK(input.dim() == 4, "conv2d: expected an input of shape (N, C, H, W), got ", shape_str(input.sizes()));
  LOOM_CHECK(weight.dim() == 4, "conv2d: expected a weight of shape (O, C / groups, kH, kW), got ",
             shape_str(weight.sizes()));
  const int64_t groups = params.groups;
  LOOM_CHECK(groups >= 1, "conv2d: groups must be positive, got ", groups);
  LOOM_CHECK(input.size(1) % groups == 0 && weight.size(0) % groups == 0, "conv2d: groups = ", groups,
             " must divide the input channels (", input.size(1), ") and the output channels (", weight.size(0), ")");
  LOOM_CHECK(weight.size(1) * groups == input.size(1), "conv2d: the input has ", input.size(1),
             " channels but the weight ", shape_str(weight.sizes()), " with groups = ", groups, " expects ",
             weight.size(1) * groups);
  LOOM_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)), "conv2d: expected a bias of shape [",
             weight.size(0), "], got ", shape_str(bias.sizes()));
  LOOM_CHECK(is_floating(input.dtype()), "conv2d: expected a floating-point input, got ", dtype_name(input.dtype()));
  ops::check_same_device_and_dtype("conv2d", {input, weight, bias});
  conv2d_output_size({input.size(2), input.size(3)}, {weight.size(2), weight.size(3)}, params);  // validates

  Tensor out;
  {
    NoGradGuard no_grad;
    out = LOOM_DISPATCH(input, conv2d_forward, input, weight, bias, params);
  }
  record("conv2d", {input, weight, bias}, {&out},
         [x = input.detach(), w = weight.detach(), params](const TensorList& g, const Node& node) {
           // Kernels take tensors of one dtype; a gradient that arrives in another is converted.
           const Tensor dy = g[0].to(x.dtype());
           Tensor dx, dw, db;
           // The weight gradient is computed straight into its gradient destination
           // (a DDP bucket); the small bias gradient is copied there. The input
           // gradient is added to the one already summed for the input, where the
           // kernel can (a bottleneck's first convolution: the shortcut's gradient).
           const Tensor& dx_sum = node.gradient_sum(0);
           if (node.needs_input_grad(0) && node.needs_input_grad(1)) {
             std::tie(dx, dw) = LOOM_DISPATCH(dy, conv2d_backward_input_weight, dy, x, w, params,
                                              node.gradient_destination(1), dx_sum);
           } else if (node.needs_input_grad(0)) {
             dx = LOOM_DISPATCH(dy, conv2d_backward_input, dy, w, x.sizes(), params, dx_sum);
           } else if (node.needs_input_grad(1)) {
             dw = LOOM_DISPATCH(dy, conv2d_backward_weight, dy, x, w.sizes(), params, node.gradient_destination(1));
           }
           if (node.needs_input_grad(2)) {
             db = gradient_to_destination(node, 2, LOOM_DISPATCH(dy, conv2d_backward_bias, dy), dy.dtype());
           }
           return TensorList{dx, dw, db};
         });
  return out;
}

}  // namespace loom
