// 2-D convolution (cross-correlation, as in PyTorch) over NCHW tensors.
//
// Shapes: input (N, C, H, W), weight (O, C / groups, kH, kW), bias (O) or
// undefined, output (N, O, Ho, Wo) with
// Ho = (H + 2*pad_h - dil_h*(kH-1) - 1) / stride_h + 1 (and likewise Wo).
//
// Groups (PyTorch's): the C input and O output channels split into `groups`
// equal runs; output run g sees only input run g, through weight rows
// [g * O / groups, (g + 1) * O / groups). groups == C is the depthwise
// convolution (MobileNet, EfficientNet), O = C * multiplier. The backward rules
// below hold per group.
//
// Backward rules, per image n, with col_n = im2col(input_n) of shape
// (C*kH*kW, Ho*Wo) and dY_n = grad_output_n viewed as (O, Ho*Wo):
//   d input_n = col2im(W^T · dY_n)          (W viewed as (O, C*kH*kW))
//   d weight  = sum_n dY_n · col_n^T
//   d bias    = sum over n, ho, wo of dY
//
// Under autocast (ops/autocast.h) it computes in the autocast dtype.
#pragma once

#include <array>
#include <cstdint>

#include <utility>

#include <loom/core/tensor.h>

namespace loom {

using Size2 = std::array<int64_t, 2>;  // (h, w)

// Convolution geometry; each pair is (h, w):
//   conv2d(x, w, b, {.stride = {2, 2}, .padding = {1, 1}})
//   conv2d(x, w, b, {.padding = {1, 1}, .groups = 32})   // depthwise over 32 channels
struct Conv2dParams {
  Size2 stride{1, 1};
  Size2 padding{0, 0};
  Size2 dilation{1, 1};
  // Channel groups; C and O must be multiples of it.
  int64_t groups = 1;
};

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
              const Conv2dParams& params = {});

// (Ho, Wo) for an input of (H, W), a kernel of (kH, kW) and `params`; throws
// when the window does not fit.
Size2 conv2d_output_size(Size2 input, Size2 kernel, const Conv2dParams& params);

// The kernels, twins with one signature per backend (ops/dispatch.h). With
// params.groups == 1 the CPU runs its dense kernels; otherwise a direct
// depthwise kernel when groups == C (ops/cpu/conv2d_grouped.cpp), else the
// dense kernels once per group. cuDNN takes the groups itself on CUDA.
namespace ops::cpu {
// All tensors of one dtype (f32, f64; f16 / bf16 computed in f32), which the
// results keep. `bias` may be undefined.
Tensor conv2d_forward(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dParams& params);
// `grad_input_sum`, when defined and fitting (input_sizes, grad_output's
// dtype, f32 or f64, contiguous), is the input's gradient summed so far
// (Node::gradient_sum): the input gradient is added into it and it is
// returned, except where conv2d runs Winograd, which returns a fresh one.
Tensor conv2d_backward_input(const Tensor& grad_output, const Tensor& weight, const Shape& input_sizes,
                             const Conv2dParams& params, const Tensor& grad_input_sum = Tensor());
// `out`, when defined and fitting (weight_sizes, grad_output's dtype and
// device, contiguous), receives the weight gradient and is returned (a
// gradient destination, Node::gradient_destination); otherwise it is allocated.
Tensor conv2d_backward_weight(const Tensor& grad_output, const Tensor& input, const Shape& weight_sizes,
                              const Conv2dParams& params, const Tensor& out = Tensor());
// Both gradients at once: {grad_input, grad_weight}, the weight's into `out`
// and the input's into `grad_input_sum` as above. On the CPU, where conv2d
// uses Winograd (f32) the output gradient's tiles are transformed once for
// the two; elsewhere the two functions above run. On CUDA the output gradient is put into the input's
// memory order once for cuDNN's two passes.
std::pair<Tensor, Tensor> conv2d_backward_input_weight(const Tensor& grad_output, const Tensor& input,
                                                       const Tensor& weight, const Conv2dParams& params,
                                                       const Tensor& out = Tensor(),
                                                       const Tensor& grad_input_sum = Tensor());
Tensor conv2d_backward_bias(const Tensor& grad_output);  // (O)

// The grouped paths (params.groups > 1), with the entry points' contracts;
// they never add into a gradient sum and return fresh tensors, except the
// weight gradient, written into `out` when it fits.
Tensor conv2d_grouped_forward(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dParams& params);
Tensor conv2d_grouped_backward_input(const Tensor& grad_output, const Tensor& weight, const Shape& input_sizes,
                                     const Conv2dParams& params);
Tensor conv2d_grouped_backward_weight(const Tensor& grad_output, const Tensor& input, const Shape& weight_sizes,
                                      const Conv2dParams& params, const Tensor& out);
}  // namespace ops::cpu

// The CUDA twins. Their input gradient is always a fresh tensor:
// `grad_input_sum` is not added into (cuDNN's beta could), and the engine
// adds the two.
namespace ops::cuda {
Tensor conv2d_forward(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dParams& params);
Tensor conv2d_backward_input(const Tensor& grad_output, const Tensor& weight, const Shape& input_sizes,
                             const Conv2dParams& params, const Tensor& grad_input_sum = Tensor());
Tensor conv2d_backward_weight(const Tensor& grad_output, const Tensor& input, const Shape& weight_sizes,
                              const Conv2dParams& params, const Tensor& out = Tensor());
std::pair<Tensor, Tensor> conv2d_backward_input_weight(const Tensor& grad_output, const Tensor& input,
                                                       const Tensor& weight, const Conv2dParams& params,
                                                       const Tensor& out = Tensor(),
                                                       const Tensor& grad_input_sum = Tensor());
Tensor conv2d_backward_bias(const Tensor& grad_output);
}  // namespace ops::cuda

}  // namespace loom
