// 2-D pooling over NCHW tensors: max pooling with argmax indices, average
// pooling, and PyTorch's adaptive average pooling.
//
// max_pool2d: output (N, C, Ho, Wo), Ho = (H + 2*pad_h - kH) / stride_h + 1;
// padding counts as -infinity and must be at most half the kernel. indices
// (i64, same shape) hold the flat position h * W + w of each maximum in its
// input plane (the first one on ties; a NaN wins, the last one if several, as
// in PyTorch).
//   backward: d input[n, c, indices[n, c, i]] += dy[n, c, i]
//
// avg_pool2d (PyTorch's, ceil_mode off): output (N, C, Ho, Wo) sized as
// max_pool2d's; output (i, j) averages the input over its window, zeros for
// padding, divided by the window's size counting padding (count_include_pad,
// PyTorch's default) or by its input elements only.
//   backward: each dy element, divided by its window's divisor, is added to
//   every input element of its window.
//
// adaptive_avg_pool2d: output (N, C, oh, ow); output row i averages input rows
// [floor(i * H / oh), ceil((i + 1) * H / oh)), columns likewise.
//   backward: each dy element is spread evenly over its window.
#pragma once

#include <array>
#include <cstdint>

#include <loom/core/tensor.h>

namespace loom {

using Size2 = std::array<int64_t, 2>;  // (h, w); the same alias as in ops/conv2d.h

struct MaxPool2dResult {
  Tensor output;
  Tensor indices;  // i64, not differentiable
};

// With no stride given, the stride is the kernel size.
Tensor max_pool2d(const Tensor& input, Size2 kernel);
Tensor max_pool2d(const Tensor& input, Size2 kernel, Size2 stride, Size2 padding = {0, 0});
MaxPool2dResult max_pool2d_with_indices(const Tensor& input, Size2 kernel);
MaxPool2dResult max_pool2d_with_indices(const Tensor& input, Size2 kernel, Size2 stride, Size2 padding = {0, 0});

// avg_pool2d's window: avg_pool2d(x, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}).
struct AvgPool2dParams {
  Size2 kernel{1, 1};
  Size2 stride{1, 1};
  Size2 padding{0, 0};  // at most half the kernel
  bool count_include_pad = true;
};

Tensor avg_pool2d(const Tensor& input, const AvgPool2dParams& params);

Tensor adaptive_avg_pool2d(const Tensor& input, Size2 output_size);

// The kernels, CPU and CUDA twins declared once (ops/pooling_kernels.def).
namespace ops::cpu {
#include <loom/ops/pooling_kernels.def>
}  // namespace ops::cpu

namespace ops::cuda {
#include <loom/ops/pooling_kernels.def>
}  // namespace ops::cuda

}  // namespace loom
