// CPU kernels of layer_norm (ops/layer_norm.h): one row per task forward and
// for the input gradient; the weight and bias gradients by blocks of columns,
// each summing its columns over the rows in order (so the result does not
// depend on the thread count). Row statistics are accumulated in f64.
#include <loom/ops/layer_norm.h>

#include <algorithm>
#include <cmath>

#include <loom/core/parallel.h>
#include <loom/ops/dispatch.h>

namespace loom::ops::cpu {
namespace {
constexpr int64_t kGrain = 1 << 14;  // elements per task

int64_t rows_per_task(int64_t row_size) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(row_size, 1)); }
}  // namespace

Tensor layer_norm_forward(const Tensor& input_in, const Tensor& weight_in, const Tensor& bias_in, double eps,
                          LayerNormStatistics& statistics) {
  const Tensor input = cpu_compute_input(input_in);
  const Tensor weight = weight_in.defined() ? cpu_compute_input(weight_in) : Tensor();
  const Tensor bias = bias_in.defined() ? cpu_compute_input(bias_in) : Tensor();
  const int64_t features = input.size(input.dim() - 1), rows = input.numel() / features;
  const DType compute = input.dtype();
  Tensor out = Tensor::empty(input.sizes(), compute);
  statistics.mean = Tensor::empty({rows}, compute);
  statistics.rstd = Tensor::empty({rows}, compute);
  visit_compute_dtype(compute, "layer_norm", [&]<class T>() {
    const T* x = input.data<T>();
    const T* w = weight.defined() ? weight.data<T>() : nullptr;
    const T* b = bias.defined() ? bias.data<T>() : nullptr;
    T* y = out.data<T>();
    T* mean_out = statistics.mean.data<T>();
    T* rstd_out = statistics.rstd.data<T>();
    parallel_for(0, rows, rows_per_task(features), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* row = x + r * features;
        double total = 0;
        for (int64_t j = 0; j < features; ++j) total += row[j];
        const double mean = total / static_cast<double>(features);
        double squares = 0;
        for (int64_t j = 0; j < features; ++j) squares += (row[j] - mean) * (row[j] - mean);
        const double rstd = 1.0 / std::sqrt(squares / static_cast<double>(features) + eps);
        mean_out[r] = static_cast<T>(mean);
        rstd_out[r] = static_cast<T>(rstd);
        const T m = static_cast<T>(mean), s = static_cast<T>(rstd);
        T* out_row = y + r * features;
        for (int64_t j = 0; j < features; ++j) {
          T v = (row[j] - m) * s;
          if (w != nullptr) v *= w[j];
          if (b != nullptr) v += b[j];
          out_row[j] = v;
        }
      }
    });
  });
  return compute == input_in.dtype() ? out : out.to(input_in.dtype());
}

LayerNormGradients layer_norm_backward(const Tensor& grad_in, const Tensor& input_in, const Tensor& weight_in,
                                       const LayerNormStatistics& statistics, std::array<bool, 3> needs) {
  const Tensor dy = cpu_compute_input(grad_in), input = cpu_compute_input(input_in);
  const Tensor weight = weight_in.defined() ? cpu_compute_input(weight_in) : Tensor();
  const int64_t features = input.size(input.dim() - 1), rows = input.numel() / features;
  const DType compute = input.dtype();
  LayerNormGradients grads;
  visit_compute_dtype(compute, "layer_norm backward", [&]<class T>() {
    const T* g = dy.data<T>();
    const T* x = input.data<T>();
    const T* w = weight.defined() ? weight.data<T>() : nullptr;
    const T* mean = statistics.mean.data<T>();
    const T* rstd = statistics.rstd.data<T>();
    if (needs[0]) {
      grads.input = Tensor::empty(input.sizes(), compute);
      T* dx = grads.input.data<T>();
      parallel_for(0, rows, rows_per_task(features), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const T* g_row = g + r * features;
          const T* x_row = x + r * features;
          double sum_dxhat = 0, sum_dxhat_xhat = 0;
          for (int64_t j = 0; j < features; ++j) {
            const T dxhat = w != nullptr ? g_row[j] * w[j] : g_row[j];
            sum_dxhat += dxhat;
            sum_dxhat_xhat += dxhat * ((x_row[j] - mean[r]) * rstd[r]);
          }
          const T a = static_cast<T>(sum_dxhat / static_cast<double>(features));
          const T b = static_cast<T>(sum_dxhat_xhat / static_cast<double>(features));
          T* dx_row = dx + r * features;
          for (int64_t j = 0; j < features; ++j) {
            const T dxhat = w != nullptr ? g_row[j] * w[j] : g_row[j];
            const T xhat = (x_row[j] - mean[r]) * rstd[r];
            dx_row[j] = rstd[r] * (dxhat - a - xhat * b);
          }
        }
      });
    }
    if (needs[1] || needs[2]) {
      Tensor dw = Tensor::empty({features}, compute), db = Tensor::empty({features}, compute);
      T* dw_p = dw.data<T>();
      T* db_p = db.data<T>();
      parallel_for(0, features, std::max<int64_t>(1, kGrain / std::max<int64_t>(rows, 1)), [&](int64_t begin,
                                                                                              int64_t end) {
        for (int64_t j = begin; j < end; ++j) {
          double sum_dy_xhat = 0, sum_dy = 0;
          for (int64_t r = 0; r < rows; ++r) {
            const T grad = g[r * features + j];
            sum_dy_xhat += grad * ((x[r * features + j] - mean[r]) * rstd[r]);
            sum_dy += grad;
          }
          dw_p[j] = static_cast<T>(sum_dy_xhat);
          db_p[j] = static_cast<T>(sum_dy);
        }
      });
      if (needs[1]) grads.weight = dw;
      if (needs[2]) grads.bias = db;
    }
  });
  if (compute != input_in.dtype()) {
    for (Tensor* t : {&grads.input, &grads.weight, &grads.bias}) {
      if (t->defined()) *t = t->to(input_in.dtype());
    }
  }
  return grads;
}

}  // namespace loom::ops::cpu
