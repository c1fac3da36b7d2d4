// CPU kernels of batch norm. The input is viewed as (N, C, S) with S the
// product of the trailing dims (1 for an (N, C) input). Reductions run one
// channel per task; the elementwise passes run over
// (n, c) rows with per-channel coefficients computed in f64 and applied in
// the compute dtype. Within a row, sums run in vectorised lanes of the compute
// dtype; rows are combined in f64. Planes of up to 16 elements run one flat
// loop per image instead of a loop per row (flat_rows).
#include <loom/ops/batch_norm.h>
#include <loom/ops/batch_norm_math.h>
#include <loom/ops/elementwise_math.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include <loom/core/parallel.h>
#include <loom/ops/cpu/max_pool_2x2.h>
#include <loom/ops/cpu/batch_norm_internal.h>
#include <loom/ops/cpu/simd.h>
#include <loom/ops/dispatch.h>

namespace loom::ops::cpu {
namespace {
// The kernels' shared parts (batch_norm_internal.h).
using namespace batch_norm_detail;

#if defined(__x86_64__)
// One row of the forward statistics in f32 with AVX2: the sums of x and of
// x * x in 16 lanes, then added into the f64 sums. The portable loop in
// batch_norm_stats (8 lanes) is vectorised by GCC with shuffles and spills:
// 7.7 instructions per element on the ConvNet (callgrind).
__attribute__((target("avx2"))) void row_sums_avx2(const float* x, int64_t n, double& sum, double& sum_of_squares) {
  const __m256 zero = _mm256_setzero_ps();
  __m256 sum0 = zero, sum1 = zero, squares0 = zero, squares1 = zero;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
    sum0 = _mm256_add_ps(sum0, v0);
    sum1 = _mm256_add_ps(sum1, v1);
    squares0 = _mm256_add_ps(squares0, _mm256_mul_ps(v0, v0));
    squares1 = _mm256_add_ps(squares1, _mm256_mul_ps(v1, v1));
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    sum0 = _mm256_add_ps(sum0, v);
    squares0 = _mm256_add_ps(squares0, _mm256_mul_ps(v, v));
  }
  alignas(32) float lanes_sum[8], lanes_squares[8];
  _mm256_store_ps(lanes_sum, _mm256_add_ps(sum0, sum1));
  _mm256_store_ps(lanes_squares, _mm256_add_ps(squares0, squares1));
  for (; i < n; ++i) {
    lanes_sum[0] += x[i];
    lanes_squares[0] += x[i] * x[i];
  }
  for (int lane = 0; lane < 8; ++lane) {
    sum += static_cast<double>(lanes_sum[lane]);
    sum_of_squares += static_cast<double>(lanes_squares[lane]);
  }
}
#endif
}  // namespace

Tensor batch_norm_stats(const Tensor& input_in) {
  const Tensor input = cpu_compute_input(input_in);
  const ChannelGeometry l = channel_geometry(input);
  return visit_compute_dtype(input.dtype(), "batch_norm", [&]<class T>() {
    const T* x = input.data<T>();
    if (flat_rows(l)) {  // 1x1 to 4x4 planes: straight into f64
      return channel_sums_flat(l, [&](int64_t offset, int64_t first, int64_t count, double* sum, double* squares) {
        const T* elements = x + offset + first;
        for (int64_t j = 0; j < count; ++j) {
          const double v = static_cast<double>(elements[j]);
          sum[j] += v;
          squares[j] += v * v;
        }
      });
    }
    return channel_sums(l, [&](int64_t, int64_t offset, double& sum, double& sum_of_squares) {
      const T* row = x + offset;
#if defined(__x86_64__)
      if constexpr (std::is_same_v<T, float>) {
        if (cpu_has_avx2()) return row_sums_avx2(row, l.inner, sum, sum_of_squares);
      }
#endif
      // Independent lanes in the compute dtype within a row (the compiler
      // vectorises them and the adds no longer wait on each other); rows are
      // summed in f64.
      T lane_sum[kLanes] = {}, lane_squares[kLanes] = {};
      int64_t s = 0;
      for (; s + kLanes <= l.inner; s += kLanes) {
        for (int lane = 0; lane < kLanes; ++lane) {
          const T v = row[s + lane];
          lane_sum[lane] += v;
          lane_squares[lane] += v * v;
        }
      }
      for (; s < l.inner; ++s) {
        lane_sum[0] += row[s];
        lane_squares[0] += row[s] * row[s];
      }
      for (int lane = 0; lane < kLanes; ++lane) {
        sum += static_cast<double>(lane_sum[lane]);
        sum_of_squares += static_cast<double>(lane_squares[lane]);
      }
    });
  });
}

Tensor batch_norm_gather_stats(const Tensor& stats, const StatisticsCount& count, const Tensor& running_mean,
                               const Tensor& running_var, double momentum) {
  const double n = element_count("batch_norm", count);
  const int64_t channels = stats.size(1);
  const std::vector<double> sums = stats.to_vector<double>();
  Tensor mean_var = Tensor::empty({2, channels}, DType::f64);
  double* mean = mean_var.data<double>();
  double* var = mean + channels;
  for (int64_t c = 0; c < channels; ++c) {
    const math::Statistics s = math::statistics(sums[c], sums[channels + c], n);
    mean[c] = s.mean;
    var[c] = s.var;
  }
  if (running_mean.defined()) {
    std::vector<double> rm = running_mean.to_vector<double>();
    std::vector<double> rv = running_var.to_vector<double>();
    for (int64_t c = 0; c < channels; ++c) {
      rm[c] = math::running_mean_update(rm[c], mean[c], momentum);
      rv[c] = math::running_var_update(rv[c], var[c], n, momentum);
    }
    Tensor mean_buffer = running_mean, var_buffer = running_var;  // handles; copy_ writes the shared storage
    mean_buffer.copy_(Tensor::from_vector<double>(rm, {channels}));
    var_buffer.copy_(Tensor::from_vector<double>(rv, {channels}));
  }
  return mean_var;
}

Tensor batch_norm_apply(const Tensor& input_in, const Tensor& mean, const Tensor& var, const Tensor& weight,
                        const Tensor& bias, double eps, Activation activation, const Tensor& residual_in) {
  const Tensor input = cpu_compute_input(input_in);
  const Tensor residual = residual_in.defined() ? cpu_compute_input(residual_in) : Tensor();
  const ChannelGeometry l = channel_geometry(input);
  // Not a structured binding: clang before 16 (Debian's, for the fuzz build)
  // cannot capture one in the lambdas below.
  const auto coefficients = affine_coefficients(mean, var, weight, bias, eps, l.channels);
  const std::vector<double>& scale = coefficients.scale;
  const std::vector<double>& shift = coefficients.shift;
  Tensor out = Tensor::empty(input.sizes(), input.dtype());
  visit_compute_dtype(input.dtype(), "batch_norm", [&]<class T>() {
    const T* x = input.data<T>();
    const T* r = residual.defined() ? residual.data<T>() : nullptr;
    T* y = out.data<T>();
    // The epilogue is chosen once, as template arguments, outside the element loop.
    math::with_flag(activation == Activation::relu, [&]<bool Relu>() {
      math::with_flag(r != nullptr, [&]<bool Residual>() {
        if (flat_rows(l)) {
          const std::vector<T> as = spread_per_channel<T>(l, scale), bs = spread_per_channel<T>(l, shift);
          const int64_t image = l.channels * l.inner;
          for_each_image(l, [&](int64_t offset) {
            const T* xs = x + offset;
            const T* rs = Residual ? r + offset : nullptr;
            T* ys = y + offset;
            for (int64_t j = 0; j < image; ++j) {
              ys[j] = math::epilogue<Relu, Residual>(xs[j], Residual ? rs[j] : T(0), as[j], bs[j]);
            }
          });
          return;
        }
        for_each_row(l, [&](int64_t c, int64_t offset) {
          const T a = static_cast<T>(scale[c]), b = static_cast<T>(shift[c]);
          for (int64_t i = offset; i < offset + l.inner; ++i) {
            y[i] = math::epilogue<Relu, Residual>(x[i], Residual ? r[i] : T(0), a, b);
          }
        });
      });
    });
  });
  return out.to(input_in.dtype());
}

Tensor batch_norm_relu_max_pool2d_apply(const Tensor& input_in, const Tensor& mean, const Tensor& var,
                                        const Tensor& weight, const Tensor& bias, double eps) {
  const Tensor input = cpu_compute_input(input_in);
  LOOM_CHECK(input.dim() == 4 && input.size(2) >= 2 && input.size(3) >= 2,
             "batch_norm_relu_max_pool2d: expected an (N, C, H, W) input with H, W >= 2, got ", shape_str(input.sizes()));
  const ChannelGeometry l = channel_geometry(input);
  const PooledPlane p = pooled_plane(input);
  const auto coefficients = affine_coefficients(mean, var, weight, bias, eps, l.channels);
  Tensor out = Tensor::empty({input.size(0), input.size(1), p.out_h, p.out_w}, input.dtype());
  visit_compute_dtype(input.dtype(), "batch_norm_relu_max_pool2d", [&]<class T>() {
    const T* x = input.data<T>();
    T* y = out.data<T>();
    for_each_row(l, [&](int64_t c, int64_t offset) {
      const T a = static_cast<T>(coefficients.scale[c]), b = static_cast<T>(coefficients.shift[c]);
      // Only the rows the windows cover.
      const int64_t covered = 2 * p.out_h * p.width;
      T* v = thread_scratch<T>(PoolBufferSlot::plane, covered);
      int64_t* arg = thread_scratch<int64_t>(PoolBufferSlot::pool_indices, p.out_plane());
      for (int64_t i = 0; i < covered; ++i) v[i] = math::epilogue<true, false>(x[offset + i], T(0), a, b);
      T* pooled = y + pooled_offset(l, p, offset);
#if defined(__x86_64__)
      if constexpr (std::is_same_v<T, float>) {
        if (cpu_has_avx2() && covered < (int64_t{1} << 31)) return pool_2x2_avx2(v, p.width, p.out_h, p.out_w, pooled, arg);
      }
#endif
      pool_2x2(v, p.width, p.out_h, p.out_w, pooled, arg);
    });
  });
  return out.to(input_in.dtype());
}

}  // namespace loom::ops::cpu

