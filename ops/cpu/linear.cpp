// CPU kernels of linear, as Eigen GEMMs on row-major maps.
#include "ops/linear.h"

#include <Eigen/Dense>

#include "ops/dispatch.h"

namespace loom::ops::cpu {
namespace {
template <class T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using Map = Eigen::Map<Matrix<T>>;
template <class T>
using ConstMap = Eigen::Map<const Matrix<T>>;
}  // namespace

Tensor linear_forward(const Tensor& input_in, const Tensor& weight_in, const Tensor& bias_in) {
  Tensor x = cpu_compute_input(input_in), w = cpu_compute_input(weight_in);
  Tensor b = bias_in.defined() ? cpu_compute_input(bias_in) : Tensor();
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  Tensor y = Tensor::empty({n, out}, x.dtype());
  visit_compute_dtype(x.dtype(), "linear", [&]<class T>() {
    Map<T> ym(y.data<T>(), n, out);
    ym.noalias() = ConstMap<T>(x.data<T>(), n, in) * ConstMap<T>(w.data<T>(), out, in).transpose();
    if (b.defined()) ym.rowwise() += Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(b.data<T>(), out);
  });
  return y.dtype() == input_in.dtype() ? y : y.to(input_in.dtype());
}

void linear_backward(const Tensor& grad_in, const Tensor& input_in, const Tensor& weight_in, bool want_input,
                     bool want_weight, bool want_bias, Tensor& grad_input, Tensor& grad_weight, Tensor& grad_bias) {
  Tensor g = cpu_compute_input(grad_in), x = cpu_compute_input(input_in), w = cpu_compute_input(weight_in);
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  visit_compute_dtype(x.dtype(), "linear backward", [&]<class T>() {
    ConstMap<T> gm(g.data<T>(), n, out);
    if (want_input) {
      grad_input = Tensor::empty({n, in}, x.dtype());
      Map<T>(grad_input.data<T>(), n, in).noalias() = gm * ConstMap<T>(w.data<T>(), out, in);
    }
    if (want_weight) {
      grad_weight = Tensor::empty({out, in}, x.dtype());
      Map<T>(grad_weight.data<T>(), out, in).noalias() = gm.transpose() * ConstMap<T>(x.data<T>(), n, in);
    }
    if (want_bias) {
      grad_bias = Tensor::empty({out}, x.dtype());
      Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>(grad_bias.data<T>(), out) = gm.colwise().sum();
    }
  });
  if (grad_input.defined()) grad_input = grad_input.to(input_in.dtype());
  if (grad_weight.defined()) grad_weight = grad_weight.to(weight_in.dtype());
  if (grad_bias.defined()) grad_bias = grad_bias.to(weight_in.dtype());
}

}  // namespace loom::ops::cpu
