// CUDA kernels of the elementwise ops and whole-tensor reductions
// (ops/elementwise.h). Elementwise kernels walk dense tensors (contiguous or
// channels-last) in memory order and keep their strides; anything else is made
// contiguous first. sum_all accumulates in f64 in a fixed order.
#include <loom/ops/cuda/common.cuh>
#include <loom/ops/elementwise.h>

namespace loom::ops::cuda {
using namespace cuda_detail;

namespace {

// ---- kernels ----

template <class T>
static __global__ void binary_kernel(Binary op, const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const acc_t<T> x = to_acc(a[i]), y = to_acc(b[i]);
    acc_t<T> r;
    switch (op) {
      case Binary::add: r = x + y; break;
      case Binary::sub: r = x - y; break;
      case Binary::mul: r = x * y; break;
    }
    out[i] = from_acc<T>(r);
  }
}

template <class T>
static __global__ void affine_kernel(const T* x, T* out, int64_t n, acc_t<T> factor, acc_t<T> offset) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = from_acc<T>(to_acc(x[i]) * factor + offset);
}

// y = Op::forward(x) (ops/elementwise_math.h), in the accumulation type.
template <class T, class Op>
static __global__ void unary_forward_kernel(const T* x, T* out, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = from_acc<T>(Op::forward(to_acc(x[i])));
}

// dx = Op::backward(dy, saved), saved being the forward's input or output.
template <class T, class Op>
static __global__ void unary_backward_kernel(const T* grad, const T* saved, T* out, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    out[i] = from_acc<T>(Op::backward(to_acc(grad[i]), to_acc(saved[i])));
  }
}

constexpr int kSumBlocks = 512;

// Pass 1 of sum_all: one f64 partial sum per block.
template <class T>
static __global__ void sum_partials_kernel(const T* x, int64_t n, double* partials) {
  __shared__ double scratch[32];
  double total = 0;
  for (int64_t i = first_index(); i < n; i += grid_stride()) total += static_cast<double>(to_acc(x[i]));
  total = block_sum(total, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// Pass 2: one block adds the partials in order and writes the 0-d result.
template <class T>
static __global__ void sum_final_kernel(const double* partials, int count, T* out) {
  const double total = block_sum_of(partials, count);
  if (threadIdx.x == 0) out[0] = from_acc<T>(static_cast<acc_t<T>>(total));
}

// out[i] = g[0] * factor, with g read on the device (no host synchronisation).
template <class T>
static __global__ void broadcast_scalar_kernel(const T* g, double factor, T* out, int64_t n) {
  const T value = from_acc<T>(static_cast<acc_t<T>>(static_cast<double>(to_acc(g[0])) * factor));
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = value;
}

// out[(o * rows + r) * row_size + i] = x[...] * scale[r] (mul broadcast).
template <class T>
static __global__ void mul_rows_kernel(const T* x, const T* scale, T* out, int64_t n, int64_t rows, int64_t row_size) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    out[i] = from_acc<T>(to_acc(x[i]) * to_acc(scale[(i / row_size) % rows]));
  }
}

// out[r] = sum over o, i of grad[o, r, i] * x[o, r, i], one block per r
// (grid-stride over rows), summed in f64 in a fixed order.
template <class T>
static __global__ void mul_rows_backward_scale_kernel(const T* grad, const T* x, T* out, int64_t outer, int64_t rows,
                                                      int64_t row_size) {
  __shared__ double scratch[32];
  const int64_t per_row = outer * row_size;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    double total = 0;
    for (int64_t j = threadIdx.x; j < per_row; j += blockDim.x) {
      const int64_t index = ((j / row_size) * rows + r) * row_size + j % row_size;
      total += static_cast<double>(to_acc(grad[index])) * static_cast<double>(to_acc(x[index]));
    }
    total = block_sum(total, scratch);
    if (threadIdx.x == 0) out[r] = from_acc<T>(static_cast<acc_t<T>>(total));
  }
}

// ---- launchers ----

template <class T>
void launch_binary(Binary op, const T* a, const T* b, T* out, int64_t n, cudaStream_t stream) {
  binary_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(op, a, b, out, n);
  LOOM_CHECK_LAUNCH();
}

template <class T>
void launch_sum(const T* x, int64_t n, T* out, int device, cudaStream_t stream) {
  const int blocks = static_cast<int>(std::min<int64_t>(kSumBlocks, std::max<int64_t>(1, (n + kThreads - 1) / kThreads)));
  ::loom::cuda::DeviceBuffer partials(blocks * sizeof(double), device);
  sum_partials_kernel<T><<<blocks, kThreads, 0, stream>>>(x, n, static_cast<double*>(partials.data()));
  LOOM_CHECK_LAUNCH();
  sum_final_kernel<T><<<1, kThreads, 0, stream>>>(static_cast<const double*>(partials.data()), blocks, out);
  LOOM_CHECK_LAUNCH();
}

// The two operands as kernels read them, and the output to write: dense
// tensors with equal strides are used in place and the output keeps those
// strides; otherwise all three are contiguous.
struct Operands {
  Tensor a, b, out;
};
Operands prepare(const Tensor& a, const Tensor& b) {
  if (a.strides() == b.strides() && is_dense(a)) return {a, b, empty_like_dense(a, a.dtype())};
  Tensor ac = contiguous_input(a), bc = contiguous_input(b);
  return {ac, bc, Tensor::empty(a.sizes(), a.dtype(), a.device())};
}

Tensor dense_input(const Tensor& x) { return is_dense(x) ? x : contiguous_input(x); }

}  // namespace

Tensor binary(Binary op, const Tensor& a, const Tensor& b) {
  const auto device_guard = on_device_of("elementwise op", a);
  check_cuda("elementwise op", b);
  LOOM_CHECK(a.sizes() == b.sizes() && a.dtype() == b.dtype(), "elementwise op: ", a.str(), " and ", b.str(),
             " differ in shape or dtype");
  Operands o = prepare(a, b);
  visit_float(a.dtype(), "elementwise op", [&]<class T>() {
    launch_binary<T>(op, o.a.data<T>(), o.b.data<T>(), o.out.data<T>(), o.out.numel(), stream_of(a));
  });
  return o.out;
}

Tensor affine(const Tensor& x_in, double factor, double offset) {
  const auto device_guard = on_device_of("affine", x_in);
  const Tensor x = dense_input(x_in);
  Tensor out = empty_like_dense(x, x.dtype());
  visit_float(x.dtype(), "affine", [&]<class T>() {
    affine_kernel<T><<<blocks_for(x.numel()), kThreads, 0, stream_of(x)>>>(
        x.data<T>(), out.data<T>(), x.numel(), static_cast<acc_t<T>>(factor), static_cast<acc_t<T>>(offset));
    LOOM_CHECK_LAUNCH();
  });
  return out;
}

Tensor unary_forward(Unary op, const Tensor& x_in) {
  const auto device_guard = on_device_of("unary op", x_in);
  const Tensor x = dense_input(x_in);
  Tensor out = empty_like_dense(x, x.dtype());
  visit_unary(op, [&]<class Op>() {
    visit_float(x.dtype(), "unary op", [&]<class T>() {
      unary_forward_kernel<T, Op><<<blocks_for(x.numel()), kThreads, 0, stream_of(x)>>>(x.data<T>(), out.data<T>(),
                                                                                        x.numel());
      LOOM_CHECK_LAUNCH();
    });
  });
  return out;
}

Tensor unary_backward(Unary op, const Tensor& grad_in, const Tensor& saved) {
  const auto device_guard = on_device_of("unary op backward", grad_in);
  check_cuda("unary op backward", saved);
  // The gradient may arrive in another dtype or memory order than the saved tensor.
  const Tensor grad = grad_in.dtype() == saved.dtype() ? grad_in : grad_in.to(saved.dtype());
  Operands o = prepare(grad, saved);
  visit_unary(op, [&]<class Op>() {
    visit_float(o.a.dtype(), "unary op backward", [&]<class T>() {
      unary_backward_kernel<T, Op><<<blocks_for(o.out.numel()), kThreads, 0, stream_of(o.a)>>>(
          o.a.data<T>(), o.b.data<T>(), o.out.data<T>(), o.out.numel());
      LOOM_CHECK_LAUNCH();
    });
  });
  return o.out;
}

Tensor sum_all(const Tensor& x_in) {
  const auto device_guard = on_device_of("sum", x_in);
  const Tensor x = dense_input(x_in);
  Tensor out = Tensor::empty({}, x.dtype(), x.device());
  visit_float(x.dtype(), "sum", [&]<class T>() {
    launch_sum<T>(x.data<T>(), x.numel(), out.data<T>(), x.device().index, stream_of(x));
  });
  return out;
}

Tensor broadcast_scalar(const Tensor& g, const Shape& sizes, double factor) {
  const auto device_guard = on_device_of("broadcast", g);
  LOOM_CHECK(g.numel() == 1, "broadcast: expected a one-element gradient, got ", g.str());
  Tensor out = Tensor::empty(sizes, g.dtype(), g.device());
  visit_float(g.dtype(), "broadcast", [&]<class T>() {
    broadcast_scalar_kernel<T><<<blocks_for(out.numel()), kThreads, 0, stream_of(g)>>>(g.data<T>(), factor,
                                                                                        out.data<T>(), out.numel());
    LOOM_CHECK_LAUNCH();
  });
  return out;
}

Tensor mul_rows(const Tensor& x_in, const Tensor& scale_in, int64_t row_size) {
  const auto device_guard = on_device_of("mul", x_in);
  check_cuda("mul", scale_in);
  const Tensor x = contiguous_input(x_in), scale = contiguous_input(scale_in);
  Tensor out = Tensor::empty(x.sizes(), x.dtype(), x.device());
  if (x.numel() == 0) return out;
  const int64_t rows = std::max<int64_t>(scale.numel(), 1);
  row_size = std::max<int64_t>(row_size, 1);
  visit_float(x.dtype(), "mul", [&]<class T>() {
    mul_rows_kernel<T><<<blocks_for(x.numel()), kThreads, 0, stream_of(x)>>>(x.data<T>(), scale.data<T>(),
                                                                             out.data<T>(), x.numel(), rows, row_size);
    LOOM_CHECK_LAUNCH();
  });
  return out;
}

Tensor mul_rows_backward_scale(const Tensor& grad_in, const Tensor& x_in, const Shape& scale_sizes, int64_t row_size) {
  const auto device_guard = on_device_of("mul backward", grad_in);
  check_cuda("mul backward", x_in);
  const Tensor grad = contiguous_input(grad_in), x = contiguous_input(x_in.to(grad_in.dtype()));
  Tensor out = Tensor::empty(scale_sizes, grad.dtype(), grad.device());
  const int64_t rows = out.numel();
  if (rows == 0) return out;
  row_size = std::max<int64_t>(row_size, 1);
  const int64_t outer = grad.numel() / (rows * row_size);
  visit_float(grad.dtype(), "mul backward", [&]<class T>() {
    const unsigned blocks = static_cast<unsigned>(std::clamp<int64_t>(rows, 1, 1 << 16));
    mul_rows_backward_scale_kernel<T><<<blocks, kThreads, 0, stream_of(grad)>>>(grad.data<T>(), x.data<T>(),
                                                                                out.data<T>(), outer, rows, row_size);
    LOOM_CHECK_LAUNCH();
  });
  return out;
}

}  // namespace loom::ops::cuda
