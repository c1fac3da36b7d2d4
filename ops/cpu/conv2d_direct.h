// Direct convolution for the f32 CPU conv2d where im2col + GEMM is thin: few
// input channels under a small kernel (C * kh * kw <= 32: the MNIST ConvNet's
// first layer, 1 x 5 x 5; ResNet's CIFAR stem, 3 x 3 x 3), unit stride and
// dilation. There the column matrix has C * kh * kw rows, the GEMM's depth in
// the forward and its width in the weight gradient, and unfolding and packing
// cost as much as the arithmetic. These kernels read a zero-padded copy of
// each image in place, 16 output columns per AVX-512 vector; conv2d.cpp
// decides when (applies).
#pragma once

#include <cstdint>

namespace loom::ops::cpu::direct {

struct Problem {
  int64_t batch, channels, height, width;      // input (N, C, H, W)
  int64_t out_channels, kernel_h, kernel_w;    // weight (O, C, kh, kw)
  int64_t pad_h, pad_w;
  int64_t out_h, out_w;                        // H + 2 pad_h - kh + 1, ...
};

// Whether the direct kernels run this problem: C * kh * kw <= 32, output rows
// of at least 8, and the AVX-512 GEMM kernel in use (gemm_kernel(): the
// widest the CPU has unless LOOM_CPU_GEMM says otherwise). The caller checks
// stride, dilation and dtype.
bool applies(const Problem& p);

// output (N, O, Ho, Wo) = conv(input, weight) + bias (may be null).
void forward(const float* input, const float* weight, const float* bias, const Problem& p, float* output);
// grad_weight (O, C, kh, kw) from grad_output (N, O, Ho, Wo) and input,
// summed over the batch in the same order whatever the timing.
void backward_weight(const float* grad_output, const float* input, const Problem& p, float* grad_weight);

}  // namespace loom::ops::cpu::direct
