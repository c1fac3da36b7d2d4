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

// The kernels, CPU and CUDA twins declared once (ops/conv2d_kernels.def).
namespace ops::cpu {
#include <loom/ops/conv2d_kernels.def>
}  // namespace ops::cpu

namespace ops::cuda {
#include <loom/ops/conv2d_kernels.def>
}  // namespace ops::cuda

}  // namespace loom
