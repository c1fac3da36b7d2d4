// Layer normalisation over the last dimension (PyTorch's F.layer_norm with
// normalized_shape = (D,)): each row of D elements is normalised by its own
// mean and biased variance. ConvNeXt's LayerNorm2d on NCHW is this op on the
// input permuted to NHWC (nn::LayerNorm2d).
//
// Forward, per row r of D elements:
//   mean_r = sum_j x[r, j] / D,  var_r = sum_j (x[r, j] - mean_r)^2 / D
//   rstd_r = 1 / sqrt(var_r + eps),  xhat = (x - mean_r) * rstd_r
//   y = xhat * weight + bias     (weight = 1, bias = 0 when undefined)
//
// Backward, with dxhat = dy * weight:
//   dx[r, j]  = rstd_r * (dxhat[r, j] - mean_j(dxhat[r, :]) - xhat[r, j] * mean_j(dxhat[r, :] * xhat[r, :]))
//   d weight  = sum over rows of dy * xhat,   d bias = sum over rows of dy
#pragma once

#include <array>

#include <loom/core/tensor.h>

namespace loom {

// input (..., D); weight, bias (D) or undefined; all of one dtype and device
// (under autocast, f16 / bf16 ones are computed in f32: ops/autocast.h).
Tensor layer_norm(const Tensor& input, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

namespace ops {
// What forward keeps for backward: per-row mean and 1 / sqrt(var + eps), (rows)
// in the accumulation dtype (f64 for f64 inputs, else f32).
struct LayerNormStatistics {
  Tensor mean, rstd;
};
struct LayerNormGradients {
  Tensor input, weight, bias;  // undefined where not asked for
};
}  // namespace ops

// The kernels, CPU and CUDA twins declared once (ops/layer_norm_kernels.def).
namespace ops::cpu {
#include <loom/ops/layer_norm_kernels.def>
}  // namespace ops::cpu

namespace ops::cuda {
#include <loom/ops/layer_norm_kernels.def>
}  // namespace ops::cuda

}  // namespace loom
