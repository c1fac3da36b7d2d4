// Winograd convolution F(m x m, r x r) for the f32 CPU conv2d (Lavin & Gray,
// "Fast Algorithms for Convolutional Neural Networks", 2015): each m x m block
// of output is computed from an (m+r-1)^2 input tile as
//   Y = Aᵀ [ (G w Gᵀ) ⊙ (Bᵀ d B) ] A,
// so a 5x5 kernel costs (m+r-1)^2 / m^2 multiplies per output instead of 25
// (F(4x4, 5x5): 4). The element-wise products over channels become
// (m+r-1)^2 GEMMs; the backward passes use the adjoints of the same
// transforms. Stride 1, no dilation, square kernels; conv2d.cpp decides when.
#pragma once

#include <cstdint>

namespace loom::ops::cpu::winograd {

struct Problem {
  int64_t batch, channels, height, width;  // input (N, C, H, W)
  int64_t out_channels, kernel;            // weight (O, C, r, r)
  int64_t pad_h, pad_w;
  int64_t out_h, out_w;                    // H + 2 pad_h - r + 1, ...
};

// The output tile m conv2d uses for this problem, or 0 when Winograd does not
// apply (kernel other than 3 or 5, few channels, tiny planes, no AVX2) or is
// switched off by LOOM_CPU_WINOGRAD=0.
int tile_for(const Problem& p);

// Whether tile m runs on the channels-last path (F(4x4, 3x3) and F(4x4,
// 5x5) with both channel counts multiples of 16, at most 128, under the
// AVX-512 GEMM kernel) rather than the tile-major one; see
// winograd_channels_last.cpp.
bool channels_last(const Problem& p, int m);

// output (N, O, Ho, Wo) = conv(input, weight) + bias (may be null).
void forward(const float* input, const float* weight, const float* bias, const Problem& p, int m, float* output);
// Both gradients, grad_output's tiles transformed once for the two (either
// output may be null: that gradient is skipped, and its input may be null).
void backward(const float* grad_output, const float* input, const float* weight, const Problem& p, int m,
              float* grad_input, float* grad_weight);
// grad_input (N, C, H, W) from grad_output (N, O, Ho, Wo).
void backward_input(const float* grad_output, const float* weight, const Problem& p, int m, float* grad_input);
// grad_weight (O, C, r, r) from grad_output and input.
void backward_weight(const float* grad_output, const float* input, const Problem& p, int m, float* grad_weight);

}  // namespace loom::ops::cpu::winograd
