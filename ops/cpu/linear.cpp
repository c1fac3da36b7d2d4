// CPU kernels of linear, on the CPU GEMM (ops/cpu/gemm.h).
#include <loom/ops/linear.h>

#include <Eigen/Dense>

#include <loom/core/profiler.h>
#include <loom/ops/cpu/gemm.h>
#include <loom/ops/dispatch.h>

namespace loom::ops::cpu {
namespace {
template <class T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ConstMap = Eigen::Map<const Matrix<T>>;
}  // namespace

Tensor linear_forward(const Tensor& input_in, const Tensor& weight_in, const Tensor& bias_in) {
  Tensor x = cpu_compute_input(input_in), w = cpu_compute_input(weight_in);
  Tensor b = bias_in.defined() ? cpu_compute_input(bias_in) : Tensor();
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  Tensor y = Tensor::empty({n, out}, x.dtype());
  profiler::add_flops(2.0 * n * in * out);
  visit_compute_dtype(x.dtype(), "linear", [&]<class T>() {
    T* yp = y.data<T>();
    if (b.defined()) {
      for (int64_t i = 0; i < n; ++i) std::copy(b.data<T>(), b.data<T>() + out, yp + i * out);
    }
    // y (+)= x · Wᵀ: (N, out)
    gemm(Transpose::no, Transpose::yes, n, out, in, T(1), x.data<T>(), in, w.data<T>(), in,
         b.defined() ? T(1) : T(0), yp, out);
  });
  return y.dtype() == input_in.dtype() ? y : y.to(input_in.dtype());
}

void linear_backward(const Tensor& grad_in, const Tensor& input_in, const Tensor& weight_in, bool want_input,
                     bool want_weight, bool want_bias, Tensor& grad_input, Tensor& grad_weight, Tensor& grad_bias) {
  Tensor g = cpu_compute_input(grad_in), x = cpu_compute_input(input_in), w = cpu_compute_input(weight_in);
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  // Destinations the caller passed in (gradient destinations), kept where they fit.
  const DType dtype = weight_in.dtype();
  const Tensor weight_out = fits_result(grad_weight, {out, in}, dtype, Device::cpu()) ? grad_weight : Tensor();
  const Tensor bias_out = fits_result(grad_bias, {out}, dtype, Device::cpu()) ? grad_bias : Tensor();
  // Computed in place where the compute dtype is the destination's, else converted into it below.
  auto result = [&](const Tensor& destination, Shape sizes) {
    return destination.defined() && destination.dtype() == x.dtype() ? destination : Tensor::empty(sizes, x.dtype());
  };
  grad_input = grad_weight = grad_bias = Tensor();
  profiler::add_flops(2.0 * n * in * out * ((want_input ? 1 : 0) + (want_weight ? 1 : 0)));
  visit_compute_dtype(x.dtype(), "linear backward", [&]<class T>() {
    ConstMap<T> gm(g.data<T>(), n, out);
    if (want_input) {  // dx = dy · W: (N, in)
      grad_input = Tensor::empty({n, in}, x.dtype());
      gemm(Transpose::no, Transpose::no, n, in, out, T(1), g.data<T>(), out, w.data<T>(), in, T(0),
           grad_input.data<T>(), in);
    }
    if (want_weight) {  // dW = dyᵀ · x: (out, in)
      grad_weight = result(weight_out, {out, in});
      gemm(Transpose::yes, Transpose::no, out, in, n, T(1), g.data<T>(), out, x.data<T>(), in, T(0),
           grad_weight.data<T>(), in);
    }
    if (want_bias) {
      grad_bias = result(bias_out, {out});
      Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>(grad_bias.data<T>(), out) = gm.colwise().sum();
    }
  });
  if (grad_input.defined()) grad_input = grad_input.to(input_in.dtype());
  auto finish = [&](Tensor& gradient, const Tensor& destination) {
    if (!gradient.defined()) return;
    if (destination.defined() && !gradient.is_same(destination)) {
      Tensor written = destination;
      gradient = written.copy_(gradient);
    } else {
      gradient = gradient.to(weight_in.dtype());
    }
  };
  finish(grad_weight, weight_out);
  finish(grad_bias, bias_out);
}

}  // namespace loom::ops::cpu
