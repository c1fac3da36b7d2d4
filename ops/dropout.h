// Dropout (PyTorch's F.dropout) and stochastic depth (torchvision's
// ops.stochastic_depth), both inverted: kept values are scaled by
// 1 / (1 - p) in training, and evaluation is the identity.
//
// dropout: y = x * m, m[i] = 1 / (1 - p) with probability 1 - p, else 0,
//          one draw per element;             backward: dx = g * m.
// stochastic_depth, mode "row": one draw per sample (dim 0), m of shape
//          (N, 1, ..., 1) broadcast over the sample;  backward: dx = g * m.
//          Mode "batch": one draw for the whole batch.
// The masks come from a seed drawn from the global generator
// (default_generator(), manual_seed), and element i of a mask depends only on
// (seed, i) (ops/dropout_math.h): the CPU and CUDA masks of one seed agree.
#pragma once

#include <cstdint>
#include <string>

#include <loom/core/tensor.h>

namespace loom {

// p in [0, 1]. Not training, or p = 0: returns x itself.
Tensor dropout(const Tensor& x, double p, bool training);

enum class StochasticDepthMode { row, batch };
// "row" or "batch"; anything else throws naming the value.
StochasticDepthMode parse_stochastic_depth_mode(const std::string& mode);

// p in [0, 1]. Not training, or p = 0: returns x itself.
Tensor stochastic_depth(const Tensor& x, double p, StochasticDepthMode mode, bool training);

// The kernels, CPU and CUDA twins declared once (ops/dropout_kernels.def).
namespace ops::cpu {
#include <loom/ops/dropout_kernels.def>
}  // namespace ops::cpu

namespace ops::cuda {
#include <loom/ops/dropout_kernels.def>
}  // namespace ops::cuda

}  // namespace loom
