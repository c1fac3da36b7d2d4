// Elementwise ops: add (residuals), sub, mul, scalar ops, relu, gelu, silu,
// hardswish, hardsigmoid, relu6, sigmoid; and the
// whole-tensor reductions sum and mean.
//
// Backward rules:
//   add:  da = g, db = g           sub: da = g, db = -g
//   mul:  da = g * b, db = g * a   scale(x, s): dx = s * g     add_scalar: dx = g
//   mul with b broadcast (b's shape, aligned to a's last dims, is a's with the
//   dims before and after one run set to 1 or left out: (N, C, 1, 1) over
//   (N, C, H, W), squeeze-and-excitation; (C, 1, 1) over it, ConvNeXt's layer
//   scale): a viewed as (outer, rows, inner), b as (rows):
//         da = g * b broadcast,  db[r] = sum over o, i of (g * a)[o, r, i]
//   relu: dx = g * (y > 0)
//   gelu: y = x * Phi(x) (PyTorch's approximate='none', Phi the standard normal CDF),
//         dx = g * (Phi(x) + x * phi(x))
//   silu: y = x * s, s = sigmoid(x),  dx = g * s * (1 + x * (1 - s))
//   hardswish: y = x * relu6(x + 3) / 6,  dx = g * (x < -3 ? 0 : x <= 3 ? x / 3 + 1/2 : 1)
//   hardsigmoid: y = relu6(x + 3) / 6,  dx = g / 6 where -3 < x < 3, else 0
//   relu6: y = min(max(x, 0), 6),  dx = g where 0 < y < 6, else 0
//   sigmoid: y = 1 / (1 + exp(-x)),  dx = g * y * (1 - y)
//   (the kinks take PyTorch's one-sided values; ops/elementwise_math.h)
//   sum:  dx = g broadcast         mean: dx = g / numel broadcast
#pragma once

#include <loom/core/tensor.h>
#include <loom/ops/elementwise_math.h>

namespace loom {

Tensor add(const Tensor& a, const Tensor& b);  // same shape
Tensor sub(const Tensor& a, const Tensor& b);
// Same shape, or one operand broadcast over the other: its shape, aligned to
// the other's last dims, is the other's with the dims before and after one run
// set to 1 or left out ((N, C, 1, 1), (N, 1, 1, 1), (C, 1, 1) or (1, C, 1, 1)
// against (N, C, H, W); (C) against (N, H, W, C)).
Tensor mul(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, double factor);
Tensor add_scalar(const Tensor& x, double value);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);
Tensor silu(const Tensor& x);
Tensor hardswish(const Tensor& x);
Tensor hardsigmoid(const Tensor& x);
Tensor relu6(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor sum(const Tensor& x);   // 0-d result
Tensor mean(const Tensor& x);  // 0-d result

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator*(const Tensor& x, double s) { return scale(x, s); }
inline Tensor operator*(double s, const Tensor& x) { return scale(x, s); }
inline Tensor operator+(const Tensor& x, double v) { return add_scalar(x, v); }

// The kernels, CPU and CUDA twins declared once (ops/elementwise_kernels.def).
namespace ops::cpu {
#include <loom/ops/elementwise_kernels.def>
}  // namespace ops::cpu

namespace ops::cuda {
#include <loom/ops/elementwise_kernels.def>
}  // namespace ops::cuda

}  // namespace loom
