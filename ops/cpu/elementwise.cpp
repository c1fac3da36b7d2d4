// CPU kernels of the elementwise ops and whole-tensor reductions.
#include <loom/ops/elementwise.h>

#include <loom/core/parallel.h>
#include <loom/ops/dispatch.h>

namespace loom::ops::cpu {
namespace {
constexpr int64_t kGrain = 1 << 14;

// Runs fn<T>(out, n) on a new tensor shaped like `like` in the compute dtype of
// `like`, then converts back to `like`'s dtype.
template <class Fn>
Tensor unary_map(const Tensor& like, Fn&& fn) {
  const DType compute = cpu_compute_dtype(like.dtype());
  Tensor out = Tensor::empty(like.sizes(), compute);
  visit_compute_dtype(compute, "elementwise", [&]<class T>() { fn.template operator()<T>(out.data<T>(), out.numel()); });
  return compute == like.dtype() ? out : out.to(like.dtype());
}
}  // namespace

Tensor binary(Binary op, const Tensor& a_in, const Tensor& b_in) {
  Tensor a = cpu_compute_input(a_in), b = cpu_compute_input(b_in);
  return unary_map(a_in, [&]<class T>(T* out, int64_t n) {
    const T* x = a.data<T>();
    const T* y = b.data<T>();
    parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      switch (op) {
        case Binary::add: for (int64_t i = begin; i < end; ++i) out[i] = x[i] + y[i]; break;
        case Binary::sub: for (int64_t i = begin; i < end; ++i) out[i] = x[i] - y[i]; break;
        case Binary::mul: for (int64_t i = begin; i < end; ++i) out[i] = x[i] * y[i]; break;
      }
    });
  });
}

Tensor affine(const Tensor& x_in, double factor, double offset) {
  Tensor x = cpu_compute_input(x_in);
  return unary_map(x_in, [&]<class T>(T* out, int64_t n) {
    const T* in = x.data<T>();
    const T f = static_cast<T>(factor), o = static_cast<T>(offset);
    parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out[i] = in[i] * f + o;
    });
  });
}

Tensor unary_forward(Unary op, const Tensor& x_in) {
  Tensor x = cpu_compute_input(x_in);
  return visit_unary(op, [&]<class Op>() {
    return unary_map(x_in, [&]<class T>(T* out, int64_t n) {
      const T* in = x.data<T>();
      parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) out[i] = Op::forward(in[i]);
      });
    });
  });
}

Tensor unary_backward(Unary op, const Tensor& grad_in, const Tensor& saved_in) {
  Tensor g = cpu_compute_input(grad_in), saved = cpu_compute_input(saved_in);
  return visit_unary(op, [&]<class Op>() {
    return unary_map(grad_in, [&]<class T>(T* out, int64_t n) {
      const T* gp = g.data<T>();
      const T* sp = saved.data<T>();
      parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) out[i] = Op::backward(gp[i], sp[i]);
      });
    });
  });
}

Tensor sum_all(const Tensor& x_in) {
  Tensor x = cpu_compute_input(x_in);
  double total = visit_compute_dtype(x.dtype(), "sum", [&]<class T>() {
    const T* p = x.data<T>();
    double s = 0;
    for (int64_t i = 0; i < x.numel(); ++i) s += static_cast<double>(p[i]);
    return s;
  });
  return Tensor::full({}, total, x_in.dtype());
}

Tensor broadcast_scalar(const Tensor& g, const Shape& sizes, double factor) {
  return Tensor::full(sizes, g.item() * factor, g.dtype());
}

Tensor mul_rows(const Tensor& x_in, const Tensor& scale_in, int64_t row_size) {
  Tensor x = cpu_compute_input(x_in), scale = cpu_compute_input(scale_in);
  const int64_t rows = scale.numel();
  row_size = std::max<int64_t>(row_size, 1);
  // (outer, rows) pairs, each a row of row_size elements scaled by scale[r].
  const int64_t pairs = x.numel() / row_size;
  return unary_map(x_in, [&]<class T>(T* out, int64_t) {
    const T* in = x.data<T>();
    const T* factor = scale.data<T>();
    parallel_for(0, pairs, std::max<int64_t>(1, kGrain / row_size), [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        const T f = factor[p % rows];
        for (int64_t i = p * row_size; i < (p + 1) * row_size; ++i) out[i] = in[i] * f;
      }
    });
  });
}

Tensor mul_rows_backward_scale(const Tensor& grad_in, const Tensor& x_in, const Shape& scale_sizes, int64_t row_size) {
  Tensor g = cpu_compute_input(grad_in), x = cpu_compute_input(x_in);
  const int64_t rows = shape_numel(scale_sizes);
  row_size = std::max<int64_t>(row_size, 1);
  const int64_t outer = rows == 0 ? 0 : x.numel() / (rows * row_size);
  const DType compute = g.dtype();
  Tensor out = Tensor::empty(scale_sizes, compute);
  visit_compute_dtype(compute, "mul backward", [&]<class T>() {
    const T* gp = g.data<T>();
    const T* xp = x.data<T>();
    T* o = out.data<T>();
    const int64_t per_row = std::max<int64_t>(outer * row_size, 1);
    parallel_for(0, rows, std::max<int64_t>(1, kGrain / per_row), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        double total = 0;
        for (int64_t b = 0; b < outer; ++b) {
          const int64_t first = (b * rows + r) * row_size;
          for (int64_t i = first; i < first + row_size; ++i) total += static_cast<double>(gp[i]) * xp[i];
        }
        o[r] = static_cast<T>(total);
      }
    });
  });
  return compute == grad_in.dtype() ? out : out.to(grad_in.dtype());
}

}  // namespace loom::ops::cpu
