// Elementwise ops: add (residuals), sub, mul, scalar ops, relu, gelu; and the
// whole-tensor reductions sum and mean.
//
// Backward rules:
//   add:  da = g, db = g           sub: da = g, db = -g
//   mul:  da = g * b, db = g * a   scale(x, s): dx = s * g     add_scalar: dx = g
//   relu: dx = g * (y > 0)
//   gelu: y = x * Phi(x) (PyTorch's approximate='none', Phi the standard normal CDF),
//         dx = g * (Phi(x) + x * phi(x))
//   sum:  dx = g broadcast         mean: dx = g / numel broadcast
#pragma once

#include <loom/core/tensor.h>
#include <loom/ops/elementwise_math.h>

namespace loom {

Tensor add(const Tensor& a, const Tensor& b);  // same shape
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, double factor);
Tensor add_scalar(const Tensor& x, double value);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);
Tensor sum(const Tensor& x);   // 0-d result
Tensor mean(const Tensor& x);  // 0-d result

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator*(const Tensor& x, double s) { return scale(x, s); }
inline Tensor operator*(double s, const Tensor& x) { return scale(x, s); }
inline Tensor operator+(const Tensor& x, double v) { return add_scalar(x, v); }

namespace ops {
enum class Binary { add, sub, mul };
}  // namespace ops

// The kernels, twins with one signature per backend (ops/dispatch.h).
namespace ops::cpu {
Tensor binary(Binary op, const Tensor& a, const Tensor& b);
// y = x * factor + offset
Tensor affine(const Tensor& x, double factor, double offset);
// y = op(x) (ops/elementwise_math.h); backward takes the output gradient and
// what the op saves (unary_saved(op)): its input or its output.
Tensor unary_forward(Unary op, const Tensor& x);
Tensor unary_backward(Unary op, const Tensor& grad, const Tensor& saved);
Tensor sum_all(const Tensor& x);  // 0-d, f64 accumulation
Tensor broadcast_scalar(const Tensor& g, const Shape& sizes, double factor);
}  // namespace ops::cpu

namespace ops::cuda {
Tensor binary(Binary op, const Tensor& a, const Tensor& b);
Tensor affine(const Tensor& x, double factor, double offset);
Tensor unary_forward(Unary op, const Tensor& x);
Tensor unary_backward(Unary op, const Tensor& grad, const Tensor& saved);
Tensor sum_all(const Tensor& x);
Tensor broadcast_scalar(const Tensor& g, const Shape& sizes, double factor);
}  // namespace ops::cuda

}  // namespace loom
