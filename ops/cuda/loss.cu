// CUDA kernels of log_softmax, nll_loss, cross_entropy and argmax
// (ops/loss.h). One warp per row of the (N, C) scores; the mean over rows
// is one block adding per-row values in a fixed order (deterministic). The
// gradient of the loss is read on the device, so backward never synchronises.
// A target outside [0, C) (other than ignore_index) cannot be reported
// without a host synchronisation: it makes the loss and its gradient NaN instead.
#include <cmath>

#include <loom/ops/cuda/common.cuh>
#include <loom/ops/loss.h>

namespace loom::ops::cuda {
using namespace cuda_detail;

namespace {

constexpr int kWarpsPerBlock = kThreads / 32;

__device__ __forceinline__ float acc_exp(float v) { return expf(v); }
__device__ __forceinline__ double acc_exp(double v) { return exp(v); }
__device__ __forceinline__ float acc_log(float v) { return logf(v); }
__device__ __forceinline__ double acc_log(double v) { return log(v); }

template <class A>
__device__ __forceinline__ A quiet_nan() {
  return static_cast<A>(NAN);
}

// Rows handled by this warp: for (row = first_row(); row < rows; row += row_stride()).
__device__ __forceinline__ int64_t first_row() { return first_index() / 32; }
__device__ __forceinline__ int64_t row_stride() { return grid_stride() / 32; }

inline unsigned row_blocks(int64_t rows) { return blocks_for(rows, kWarpsPerBlock); }

// The row's maximum and log(sum(exp(x - max))) + max, in the accumulation type.
template <class T>
__device__ __forceinline__ acc_t<T> row_log_total(const T* x, int64_t cols, acc_t<T>& max) {
  using A = acc_t<T>;
  const int lane = threadIdx.x % 32;
  A m = -INFINITY;
  for (int64_t j = lane; j < cols; j += 32) {
    const A v = to_acc(x[j]);
    m = v > m ? v : m;
  }
  m = warp_max(m);
  A total = 0;
  for (int64_t j = lane; j < cols; j += 32) total += acc_exp(to_acc(x[j]) - m);
  total = warp_sum(total);
  max = m;
  return acc_log(total) + m;
}

template <class T>
static __global__ void log_softmax_kernel(const T* x, T* out, int64_t rows, int64_t cols) {
  const int lane = threadIdx.x % 32;
  for (int64_t row = first_row(); row < rows; row += row_stride()) {
    const T* xr = x + row * cols;
    acc_t<T> max;
    const acc_t<T> log_total = row_log_total(xr, cols, max);
    for (int64_t j = lane; j < cols; j += 32) out[row * cols + j] = from_acc<T>(to_acc(xr[j]) - log_total);
  }
}

// dx = g - exp(y) * sum(g) per row.
template <class T>
static __global__ void log_softmax_backward_kernel(const T* g, const T* y, T* dx, int64_t rows, int64_t cols) {
  using A = acc_t<T>;
  const int lane = threadIdx.x % 32;
  for (int64_t row = first_row(); row < rows; row += row_stride()) {
    const int64_t base = row * cols;
    A total = 0;
    for (int64_t j = lane; j < cols; j += 32) total += to_acc(g[base + j]);
    total = warp_sum(total);
    for (int64_t j = lane; j < cols; j += 32) {
      dx[base + j] = from_acc<T>(to_acc(g[base + j]) - acc_exp(to_acc(y[base + j])) * total);
    }
  }
}

// One block: out = sum(values) / n (0 when count is 0), n = count, or with
// `counts` (per-row 0 or 1) their sum, then also written to *counted.
template <class T>
static __global__ void mean_kernel(const double* values, const double* counts, int64_t count, T* out,
                                   double* counted) {
  const double total = block_sum_of(values, count);
  const double n = counts ? block_sum_of(counts, count) : static_cast<double>(count);
  if (threadIdx.x == 0) {
    out[0] = from_acc<T>(static_cast<acc_t<T>>(count > 0 ? total / n : 0.0));
    if (counted) *counted = n;
  }
}

// Per-row -log_probs[row, target]; NaN for a target out of range.
template <class T>
static __global__ void nll_rows_kernel(const T* log_probs, const int64_t* targets, double* row_loss, int64_t rows,
                                       int64_t cols) {
  for (int64_t row = first_index(); row < rows; row += grid_stride()) {
    const int64_t t = targets[row];
    row_loss[row] = (t >= 0 && t < cols) ? -static_cast<double>(to_acc(log_probs[row * cols + t])) : NAN;
  }
}

// dx[row, j] = -g / N where j is the row's target, else 0.
template <class T>
static __global__ void nll_backward_kernel(const void* grad, DType grad_dtype, const int64_t* targets, T* dx,
                                           int64_t rows, int64_t cols) {
  const acc_t<T> value = static_cast<acc_t<T>>(-load_as_double(grad, grad_dtype, 0) / static_cast<double>(rows));
  const int64_t n = rows * cols;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t row = i / cols, j = i % cols, t = targets[row];
    const acc_t<T> v = (t < 0 || t >= cols) ? quiet_nan<acc_t<T>>() : (j == t ? value : acc_t<T>(0));
    dx[i] = from_acc<T>(v);
  }
}

// Softmax probabilities P (accumulation type), the per-row loss
// log(sum exp) + max - (1 - ε) x[target] - (ε / C) Σ_j x[j] (ops/loss.h),
// and row_counted = 0 for a row whose target is ignore_index (loss 0), else 1.
template <class T>
static __global__ void cross_entropy_kernel(const T* x, const int64_t* targets, acc_t<T>* probabilities,
                                            double* row_loss, double* row_counted, int64_t rows, int64_t cols,
                                            double smoothing, int64_t ignore_index) {
  using A = acc_t<T>;
  const int lane = threadIdx.x % 32;
  for (int64_t row = first_row(); row < rows; row += row_stride()) {
    const T* xr = x + row * cols;
    A max;
    const A log_total = row_log_total(xr, cols, max);
    A all = 0;
    for (int64_t j = lane; j < cols; j += 32) {
      probabilities[row * cols + j] = acc_exp(to_acc(xr[j]) - log_total);
      all += to_acc(xr[j]);
    }
    all = warp_sum(all);
    if (lane == 0) {
      const int64_t t = targets[row];
      double loss = NAN;
      if (t == ignore_index) {
        loss = 0;
      } else if (t >= 0 && t < cols && smoothing == 0) {
        loss = static_cast<double>(log_total - to_acc(xr[t]));
      } else if (t >= 0 && t < cols) {
        loss = static_cast<double>(log_total) - (1 - smoothing) * static_cast<double>(to_acc(xr[t])) -
               smoothing / static_cast<double>(cols) * static_cast<double>(all);
      }
      row_loss[row] = loss;
      if (row_counted) row_counted[row] = t == ignore_index ? 0.0 : 1.0;
    }
  }
}

// dx = (P - (1 - ε) onehot(target) - ε / C) * f, f = g / counted (the rows
// not ignored); 0 on ignored rows.
template <class P>
static __global__ void cross_entropy_backward_kernel(const void* grad, DType grad_dtype, const P* probabilities,
                                                     const int64_t* targets, const double* counted, P* dx,
                                                     int64_t rows, int64_t cols, double smoothing,
                                                     int64_t ignore_index) {
  const double factor = load_as_double(grad, grad_dtype, 0) / *counted;
  const P f = static_cast<P>(factor);
  const P spread = static_cast<P>(factor * smoothing / static_cast<double>(cols));
  const P hit = static_cast<P>(factor * (1 - smoothing));
  const int64_t n = rows * cols;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t row = i / cols, j = i % cols, t = targets[row];
    const P v = probabilities[i] * f - spread;
    dx[i] = t == ignore_index ? P(0) : (t < 0 || t >= cols) ? quiet_nan<P>() : (j == t ? v - hit : v);
  }
}

// The first index of the row maximum; NaN never wins, unless it is element 0
// (the CPU scan's rule: a later value must compare greater).
template <class T>
static __global__ void argmax_kernel(const T* x, int64_t* out, int64_t rows, int64_t cols) {
  using A = acc_t<T>;
  const int lane = threadIdx.x % 32;
  for (int64_t row = first_row(); row < rows; row += row_stride()) {
    const T* xr = x + row * cols;
    A best = -INFINITY;
    int64_t best_index = lane < cols ? lane : INT64_MAX;
    for (int64_t j = lane; j < cols; j += 32) {
      A v = to_acc(xr[j]);
      if (isnan(v)) v = -INFINITY;
      if (v > best) {
        best = v;
        best_index = j;
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      const A other = __shfl_xor_sync(0xffffffffu, best, offset);
      const int64_t other_index = __shfl_xor_sync(0xffffffffu, best_index, offset);
      if (other > best || (other == best && other_index < best_index)) {
        best = other;
        best_index = other_index;
      }
    }
    if (lane == 0) out[row] = isnan(to_acc(xr[0])) ? 0 : best_index;
  }
}

// Checks the scores and targets of a loss entry point; the guard makes the
// scores' device current for the call (as on_device_of).
[[nodiscard]] ::loom::cuda::DeviceGuard check_targets(const char* op, const Tensor& scores, const Tensor& targets) {
  check_cuda(op, scores);
  LOOM_CHECK(targets.defined() && targets.device() == scores.device() && targets.dtype() == DType::i64, op,
             ": targets must be an i64 tensor on ", scores.device().str());
  return ::loom::cuda::DeviceGuard(scores.device().index);
}

// The mean over `rows` of per-row losses, a 0-d tensor of x's dtype:
// launch_rows.template operator()<T>(row_loss, row_counted) launches the
// kernel that writes the f64 loss of each row and, with `counted`, whether
// the row counts (0 or 1; else row_counted is null): the mean is then over
// those, their number written into *counted (a 0-d f64 tensor). Not called
// when there are no rows.
template <class LaunchRows>
Tensor mean_row_loss(const char* op, const Tensor& x, int64_t rows, LaunchRows&& launch_rows,
                     Tensor* counted = nullptr) {
  Tensor out = Tensor::empty({}, x.dtype(), x.device());
  const size_t bytes = std::max<int64_t>(rows, 1) * sizeof(double);
  ::loom::cuda::DeviceBuffer row_loss(bytes, x.device().index);
  // The row counts only for a loss that ignores targets (cross_entropy), not nll_loss.
  ::loom::cuda::DeviceBuffer row_counted = counted ? ::loom::cuda::DeviceBuffer(bytes, x.device().index)
                                                   : ::loom::cuda::DeviceBuffer();
  if (counted) *counted = Tensor::empty({}, DType::f64, x.device());
  double* counts = counted && rows > 0 ? static_cast<double*>(row_counted.data()) : nullptr;
  visit_float(x.dtype(), op, [&]<class T>() {
    if (rows > 0) {
      launch_rows.template operator()<T>(static_cast<double*>(row_loss.data()), counts);
      LOOM_CHECK_LAUNCH();
    }
    mean_kernel<T><<<1, kThreads, 0, stream_of(x)>>>(static_cast<const double*>(row_loss.data()), counts, rows,
                                                     out.data<T>(), counted ? counted->data<double>() : nullptr);
    LOOM_CHECK_LAUNCH();
  });
  return out;
}

}  // namespace

Tensor log_softmax_forward(const Tensor& logits_in) {
  const auto device_guard = on_device_of("log_softmax", logits_in);
  const Tensor x = contiguous_input(logits_in);
  const int64_t rows = x.size(0), cols = x.size(1);
  Tensor out = Tensor::empty(x.sizes(), x.dtype(), x.device());
  if (rows == 0 || cols == 0) return out;
  visit_float(x.dtype(), "log_softmax", [&]<class T>() {
    log_softmax_kernel<T><<<row_blocks(rows), kThreads, 0, stream_of(x)>>>(x.data<T>(), out.data<T>(), rows, cols);
    LOOM_CHECK_LAUNCH();
  });
  return out;
}

Tensor log_softmax_backward(const Tensor& grad_in, const Tensor& output_in) {
  const auto device_guard = on_device_of("log_softmax backward", output_in);
  const Tensor y = contiguous_input(output_in);
  const Tensor g = contiguous_input(grad_in.dtype() == y.dtype() ? grad_in : grad_in.to(y.dtype()));
  const int64_t rows = y.size(0), cols = y.size(1);
  Tensor dx = Tensor::empty(y.sizes(), y.dtype(), y.device());
  if (rows == 0 || cols == 0) return dx;
  visit_float(y.dtype(), "log_softmax backward", [&]<class T>() {
    log_softmax_backward_kernel<T><<<row_blocks(rows), kThreads, 0, stream_of(y)>>>(g.data<T>(), y.data<T>(),
                                                                                      dx.data<T>(), rows, cols);
    LOOM_CHECK_LAUNCH();
  });
  return dx;
}

Tensor nll_loss_forward(const Tensor& log_probs_in, const Tensor& targets_in) {
  const auto device_guard = check_targets("nll_loss", log_probs_in, targets_in);
  const Tensor lp = contiguous_input(log_probs_in), t = contiguous_input(targets_in);
  const int64_t rows = lp.size(0), cols = lp.size(1);
  return mean_row_loss("nll_loss", lp, rows, [&]<class T>(double* row_loss, double*) {
    nll_rows_kernel<T><<<blocks_for(rows), kThreads, 0, stream_of(lp)>>>(lp.data<T>(), t.data<int64_t>(), row_loss,
                                                                         rows, cols);
  });
}

Tensor nll_loss_backward(const Tensor& grad, const Tensor& log_probs, const Tensor& targets_in) {
  const auto device_guard = check_targets("nll_loss backward", log_probs, targets_in);
  check_cuda("nll_loss backward", grad);
  const Tensor t = contiguous_input(targets_in);
  const int64_t rows = log_probs.size(0), cols = log_probs.size(1);
  Tensor dx = Tensor::empty(log_probs.sizes(), log_probs.dtype(), log_probs.device());
  if (rows == 0 || cols == 0) return dx;
  visit_float(log_probs.dtype(), "nll_loss backward", [&]<class T>() {
    nll_backward_kernel<T><<<blocks_for(rows * cols), kThreads, 0, stream_of(dx)>>>(
        grad.raw_data(), grad.dtype(), t.data<int64_t>(), dx.data<T>(), rows, cols);
    LOOM_CHECK_LAUNCH();
  });
  return dx;
}

Tensor cross_entropy_forward(const Tensor& logits_in, const Tensor& targets_in, const CrossEntropyOptions& options,
                             Tensor& probabilities, Tensor& counted) {
  const auto device_guard = check_targets("cross_entropy", logits_in, targets_in);
  const Tensor x = contiguous_input(logits_in), t = contiguous_input(targets_in);
  const int64_t rows = x.size(0), cols = x.size(1);
  LOOM_CHECK(cols > 0, "cross_entropy: scores ", x.str(), " have no classes");
  // As on the CPU, the probabilities backward needs are kept in f32 (f64 for f64).
  probabilities = Tensor::empty(x.sizes(), x.dtype() == DType::f64 ? DType::f64 : DType::f32, x.device());
  return mean_row_loss(
      "cross_entropy", x, rows,
      [&]<class T>(double* row_loss, double* row_counted) {
        cross_entropy_kernel<T><<<row_blocks(rows), kThreads, 0, stream_of(x)>>>(
            x.data<T>(), t.data<int64_t>(), probabilities.data<acc_t<T>>(), row_loss, row_counted, rows, cols,
            options.label_smoothing(), options.ignore_index());
      },
      &counted);
}

Tensor cross_entropy_backward(const Tensor& grad, const Tensor& probabilities, const Tensor& targets_in,
                              const CrossEntropyOptions& options, const Tensor& counted) {
  const auto device_guard = check_targets("cross_entropy backward", probabilities, targets_in);
  check_cuda("cross_entropy backward", grad);
  const Tensor t = contiguous_input(targets_in);
  const int64_t rows = probabilities.size(0), cols = probabilities.size(1);
  Tensor dx = Tensor::empty(probabilities.sizes(), probabilities.dtype(), probabilities.device());
  if (rows == 0) return dx;
  auto launch = [&]<class P>() {
    cross_entropy_backward_kernel<P><<<blocks_for(rows * cols), kThreads, 0, stream_of(dx)>>>(
        grad.raw_data(), grad.dtype(), probabilities.data<P>(), t.data<int64_t>(), counted.data<double>(), dx.data<P>(),
        rows, cols, options.label_smoothing(), options.ignore_index());
    LOOM_CHECK_LAUNCH();
  };
  if (probabilities.dtype() == DType::f64) {
    launch.template operator()<double>();
  } else {
    launch.template operator()<float>();
  }
  return dx;
}

Tensor argmax(const Tensor& x_in) {
  const auto device_guard = on_device_of("argmax", x_in);
  const Tensor x = contiguous_input(x_in);
  const int64_t rows = x.size(0), cols = x.size(1);
  Tensor out = Tensor::empty({rows}, DType::i64, x.device());
  if (rows == 0) return out;
  if (cols == 0) return out.zero_();  // as on the CPU
  visit_float(x.dtype(), "argmax", [&]<class T>() {
    argmax_kernel<T><<<row_blocks(rows), kThreads, 0, stream_of(x)>>>(x.data<T>(), out.data<int64_t>(), rows, cols);
    LOOM_CHECK_LAUNCH();
  });
  return out;
}

}  // namespace loom::ops::cuda
