// CPU kernels of batch norm's backward: the reductions (sum dy, sum dy * (x -
// mean)) and the input gradient, with the fused ReLU's mask and the fused
// 2x2 pool's rebuilt gradient; see batch_norm.cpp for the layout.
#include <loom/ops/batch_norm.h>
#include <loom/ops/batch_norm_math.h>
#include <loom/ops/elementwise_math.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include <loom/core/parallel.h>
#include <loom/ops/cpu/batch_norm_internal.h>
#include <loom/ops/cpu/max_pool_2x2.h>
#include <loom/ops/cpu/scratch.h>
#include <loom/ops/cpu/simd.h>
#include <loom/ops/dispatch.h>

namespace loom::ops::cpu {
namespace {
// The kernels' shared parts (batch_norm_internal.h).
using namespace batch_norm_detail;

#if defined(__x86_64__)
// One row of the backward reduction in f32 with AVX2: the sums of g and of
// g * (x - mean), g = dy where the fused ReLU's output x * a + b is positive
// (Masked), else 0. The mask's x * a + b is a multiply then an add, as the
// forward computes it: this function's target has no FMA and the file is built
// with -ffp-contract=off, so neither side is contracted into a fused
// multiply-add that would round differently.
template <bool Masked>
__attribute__((target("avx2"))) inline void backward_sums_step(const float* dy, const float* x, __m256 va, __m256 vb,
                                                              __m256 vmean, __m256& g_sum, __m256& gx_sum) {
  const __m256 xv = _mm256_loadu_ps(x);
  __m256 g = _mm256_loadu_ps(dy);
  if constexpr (Masked) {
    const __m256 y = _mm256_add_ps(_mm256_mul_ps(xv, va), vb);
    g = _mm256_and_ps(g, _mm256_cmp_ps(y, _mm256_setzero_ps(), _CMP_GT_OQ));
  }
  g_sum = _mm256_add_ps(g_sum, g);
  gx_sum = _mm256_add_ps(gx_sum, _mm256_mul_ps(g, _mm256_sub_ps(xv, vmean)));
}

template <bool Masked>
__attribute__((target("avx2"))) void backward_row_sums_avx2(const float* dy, const float* x, int64_t n, float a,
                                                           float b, float mean, double& sum_dy,
                                                           double& sum_dy_xmu) {
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b), vmean = _mm256_set1_ps(mean);
  const __m256 zero = _mm256_setzero_ps();
  __m256 g_sum0 = zero, g_sum1 = zero, gx_sum0 = zero, gx_sum1 = zero;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    backward_sums_step<Masked>(dy + i, x + i, va, vb, vmean, g_sum0, gx_sum0);
    backward_sums_step<Masked>(dy + i + 8, x + i + 8, va, vb, vmean, g_sum1, gx_sum1);
  }
  for (; i + 8 <= n; i += 8) backward_sums_step<Masked>(dy + i, x + i, va, vb, vmean, g_sum0, gx_sum0);
  alignas(32) float lanes_g[8], lanes_gx[8];
  _mm256_store_ps(lanes_g, _mm256_add_ps(g_sum0, g_sum1));
  _mm256_store_ps(lanes_gx, _mm256_add_ps(gx_sum0, gx_sum1));
  for (; i < n; ++i) {
    const float g = masked<Masked>(dy[i], x, i, a, b);
    lanes_g[0] += g;
    lanes_gx[0] += g * (x[i] - mean);
  }
  for (int lane = 0; lane < 8; ++lane) {
    sum_dy += static_cast<double>(lanes_g[lane]);
    sum_dy_xmu += static_cast<double>(lanes_gx[lane]);
  }
}

#endif

// backward_reduce's terms of one (n, c) row of n elements: sum_dy gains the
// sum of g and sum_dy_xmu that of g * (x - mean), g = dy masked by the fused
// ReLU (x * a + b > 0) when Masked. f32 runs the AVX2 loop where the CPU has
// it; otherwise kLanes independent lanes in T, added into the f64 sums.
template <class T, bool Masked>
void row_backward_sums(const T* dy, const T* x, int64_t n, T a, T b, T mean, double& sum_dy, double& sum_dy_xmu) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<T, float>) {
    if (cpu_has_avx2()) return backward_row_sums_avx2<Masked>(dy, x, n, a, b, mean, sum_dy, sum_dy_xmu);
  }
#endif
  T lane_dy[kLanes] = {}, lane_dy_xmu[kLanes] = {};
  int64_t s = 0;
  for (; s + kLanes <= n; s += kLanes) {
    for (int lane = 0; lane < kLanes; ++lane) {
      const T g = masked<Masked>(dy[s + lane], x, s + lane, a, b);
      lane_dy[lane] += g;
      lane_dy_xmu[lane] += g * (x[s + lane] - mean);
    }
  }
  for (; s < n; ++s) {
    const T g = masked<Masked>(dy[s], x, s, a, b);
    lane_dy[0] += g;
    lane_dy_xmu[0] += g * (x[s] - mean);
  }
  for (int lane = 0; lane < kLanes; ++lane) {
    sum_dy += static_cast<double>(lane_dy[lane]);
    sum_dy_xmu += static_cast<double>(lane_dy_xmu[lane]);
  }
}

// The same for flat_rows' run of `count` elements, each with its own
// coefficients (as, bs: the fused ReLU's, read when Masked; means) and its
// own f64 sums.
template <class T, bool Masked>
void flat_backward_sums(const T* dy, const T* x, int64_t count, const T* as, const T* bs, const T* means,
                        double* sum_dy, double* sum_dy_xmu) {
  for (int64_t j = 0; j < count; ++j) {
    const T g = masked<Masked>(dy[j], x, j, Masked ? as[j] : T(0), Masked ? bs[j] : T(0));
    sum_dy[j] += static_cast<double>(g);
    sum_dy_xmu[j] += static_cast<double>(g * (x[j] - means[j]));
  }
}

template <class T>
void pooled_relu_gradient_scalar(const T* x, const PooledPlane& p, T a, T b, const T* dp, T* g) {
  for (int64_t oh = 0; oh < p.out_h; ++oh) {
    for (int64_t ow = 0; ow < p.out_w; ++ow) {
      const int64_t first = 2 * oh * p.width + 2 * ow;
      const int64_t positions[4] = {first, first + 1, first + p.width, first + p.width + 1};
      T values[4];
      for (int k = 0; k < 4; ++k) values[k] = math::epilogue<true, false>(x[positions[k]], T(0), a, b);
      int chosen = 0;
      for (int k = 1; k < 4; ++k) chosen = pool_takes_over(values[k], values[chosen]) ? k : chosen;
      for (int k = 0; k < 4; ++k) g[positions[k]] = k == chosen && values[k] > T(0) ? dp[oh * p.out_w + ow] : T(0);
    }
  }
}

#if defined(__x86_64__)
// relu(x * a + b) as math::epilogue computes it: a multiply then an add (no
// FMA in this target, -ffp-contract=off), negatives to +0, NaN kept.
__attribute__((target("avx2"))) inline __m256 relu_affine_avx2(__m256 x, __m256 a, __m256 b) {
  const __m256 y = _mm256_add_ps(_mm256_mul_ps(x, a), b);
  return _mm256_andnot_ps(_mm256_cmp_ps(y, _mm256_setzero_ps(), _CMP_LT_OQ), y);
}

// pooled_relu_gradient_scalar for f32, eight windows at a time: the pool's
// choice as in pool_2x2_eight, kept as the window position 0..3, then dp
// spread to that position of the even and odd columns and interleaved back.
// Rows of eight or more windows end on the last eight (recomputed, the same
// values); shorter rows (the ConvNet's 7) load masked. g has kGradientPadding
// floats past the plane.
__attribute__((target("avx2"))) void pooled_relu_gradient_avx2(const float* x, const PooledPlane& p, float a, float b,
                                                              const float* dp, float* g) {
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b), zero = _mm256_setzero_ps();
  alignas(32) int32_t lanes[24];
  for (int32_t i = 0; i < 16; ++i) lanes[i] = i < 2 * p.out_w ? -1 : 0;
  for (int32_t i = 0; i < 8; ++i) lanes[16 + i] = i < p.out_w ? -1 : 0;
  const __m256i mask_lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
  const __m256i mask_hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes + 8));
  const __m256i mask_dp = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes + 16));
  const bool short_rows = p.out_w < 8;
  for (int64_t oh = 0; oh < p.out_h; ++oh) {
    const float* top = x + 2 * oh * p.width;
    const float* bottom = top + p.width;
    const float* dp_row = dp + oh * p.out_w;
    float* g_top = g + 2 * oh * p.width;
    float* g_bottom = g_top + p.width;
    for (int64_t ow = 0;; ow += 8) {
      if (!short_rows) ow = std::min(ow, p.out_w - 8);
      const int64_t c = 2 * ow;
      const __m256 t_lo = relu_affine_avx2(short_rows ? _mm256_maskload_ps(top, mask_lo) : _mm256_loadu_ps(top + c), va, vb);
      const __m256 t_hi =
          relu_affine_avx2(short_rows ? _mm256_maskload_ps(top + 8, mask_hi) : _mm256_loadu_ps(top + c + 8), va, vb);
      const __m256 b_lo =
          relu_affine_avx2(short_rows ? _mm256_maskload_ps(bottom, mask_lo) : _mm256_loadu_ps(bottom + c), va, vb);
      const __m256 b_hi =
          relu_affine_avx2(short_rows ? _mm256_maskload_ps(bottom + 8, mask_hi) : _mm256_loadu_ps(bottom + c + 8), va, vb);
      const __m256 d = short_rows ? _mm256_maskload_ps(dp_row, mask_dp) : _mm256_loadu_ps(dp_row + ow);
      __m256 best = even_columns(t_lo, t_hi);
      __m256i chosen = _mm256_setzero_si256();
      const __m256 candidates[3] = {odd_columns(t_lo, t_hi), even_columns(b_lo, b_hi), odd_columns(b_lo, b_hi)};
      for (int k = 0; k < 3; ++k) {
        const __m256 take = _mm256_or_ps(_mm256_cmp_ps(candidates[k], best, _CMP_GT_OQ),
                                         _mm256_cmp_ps(candidates[k], candidates[k], _CMP_UNORD_Q));
        best = _mm256_blendv_ps(best, candidates[k], take);
        chosen = _mm256_blendv_epi8(chosen, _mm256_set1_epi32(k + 1), _mm256_castps_si256(take));
      }
      const __m256 given = _mm256_and_ps(d, _mm256_cmp_ps(best, zero, _CMP_GT_OQ));
      __m256 at[4];
      for (int k = 0; k < 4; ++k) {
        at[k] = _mm256_and_ps(given, _mm256_castsi256_ps(_mm256_cmpeq_epi32(chosen, _mm256_set1_epi32(k))));
      }
      __m256 top_lo, top_hi, bottom_lo, bottom_hi;
      interleave_columns(at[0], at[1], top_lo, top_hi);
      interleave_columns(at[2], at[3], bottom_lo, bottom_hi);
      // Whole stores also for short rows (masked ones are slow on AMD): the
      // lanes past a row's windows hold zeros, land in the next row before
      // it is written or in g's padding, and are overwritten or unused.
      _mm256_storeu_ps(g_top + c, top_lo);
      _mm256_storeu_ps(g_top + c + 8, top_hi);
      _mm256_storeu_ps(g_bottom + c, bottom_lo);
      _mm256_storeu_ps(g_bottom + c + 8, bottom_hi);
      if (short_rows || ow + 8 >= p.out_w) break;
    }
  }
}
#endif

// The gradient at one (H, W) plane of the ReLU's output from its pooled
// gradient dp (out_h, out_w), into g (H * W + kGradientPadding elements).
template <class T>
void pooled_relu_gradient(const T* x, const PooledPlane& p, T a, T b, const T* dp, T* g) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<T, float>) {
    if (cpu_has_avx2()) {
      pooled_relu_gradient_avx2(x, p, a, b, dp, g);
    } else {
      pooled_relu_gradient_scalar(x, p, a, b, dp, g);
    }
  } else {
    pooled_relu_gradient_scalar(x, p, a, b, dp, g);
  }
#else
  pooled_relu_gradient_scalar(x, p, a, b, dp, g);
#endif
  if (p.width % 2 != 0) {
    for (int64_t r = 0; r < 2 * p.out_h; ++r) g[r * p.width + p.width - 1] = T(0);
  }
  if (p.height % 2 != 0) std::fill_n(g + (p.height - 1) * p.width, p.width, T(0));
}

void check_pooled_gradient(const Tensor& grad_output, const Tensor& input) {
  const PooledPlane p = pooled_plane(input);
  LOOM_CHECK(input.dim() == 4 && grad_output.sizes() == Shape({input.size(0), input.size(1), p.out_h, p.out_w}),
             "batch_norm_relu_max_pool2d backward: the gradient ", shape_str(grad_output.sizes()),
             " is not the pooled shape of the input ", shape_str(input.sizes()));
}
}  // namespace

Tensor batch_norm_backward_reduce(const Tensor& grad_output_in, const Tensor& input_in, const Tensor& mean,
                                  const Tensor& var, double eps, const FusedRelu& relu) {
  const Tensor grad_output = cpu_compute_input(grad_output_in), input = cpu_compute_input(input_in);
  const ChannelGeometry l = channel_geometry(input);
  const std::vector<double> m = per_channel(mean, l.channels, 0.0);
  const std::vector<double> invstd = inverse_std(per_channel(var, l.channels, 1.0), eps);
  Tensor sums = visit_compute_dtype(input.dtype(), "batch_norm backward", [&]<class T>() {
    const T* x = input.data<T>();
    const T* dy = grad_output.data<T>();
    const Affine forward = affine_coefficients(mean, var, relu.weight, relu.bias, eps, l.channels);
    if (relu.pooled) {
      check_pooled_gradient(grad_output, input);
      const PooledPlane p = pooled_plane(input);
      return channel_sums(l, [&](int64_t c, int64_t offset, double& sum_dy, double& sum_dy_xmu) {
        T* g = thread_scratch<T>(PoolBufferSlot::plane, l.inner + kGradientPadding);
        pooled_relu_gradient(x + offset, p, static_cast<T>(forward.scale[c]), static_cast<T>(forward.shift[c]),
                             dy + pooled_offset(l, p, offset), g);
        row_backward_sums<T, false>(g, x + offset, l.inner, T(0), T(0), static_cast<T>(m[c]), sum_dy, sum_dy_xmu);
      });
    }
    return math::with_flag(relu.enabled, [&]<bool Masked>() {
      if (flat_rows(l)) {  // 1x1 to 4x4 planes: straight into f64
        const std::vector<T> ms = spread_per_channel<T>(l, m);
        const std::vector<T> as = Masked ? spread_per_channel<T>(l, forward.scale) : std::vector<T>();
        const std::vector<T> bs = Masked ? spread_per_channel<T>(l, forward.shift) : std::vector<T>();
        return channel_sums_flat(l, [&](int64_t offset, int64_t first, int64_t count, double* sum_dy,
                                        double* sum_dy_xmu) {
          flat_backward_sums<T, Masked>(dy + offset + first, x + offset + first, count, Masked ? as.data() + first : nullptr,
                                        Masked ? bs.data() + first : nullptr, ms.data() + first, sum_dy, sum_dy_xmu);
        });
      }
      return channel_sums(l, [&](int64_t c, int64_t offset, double& sum_dy, double& sum_dy_xmu) {
        row_backward_sums<T, Masked>(dy + offset, x + offset, l.inner, static_cast<T>(forward.scale[c]),
                                     static_cast<T>(forward.shift[c]), static_cast<T>(m[c]), sum_dy, sum_dy_xmu);
      });
    });
  });
  // sum dy * xhat = invstd * sum dy * (x - mean)
  double* second = sums.data<double>() + l.channels;
  for (int64_t c = 0; c < l.channels; ++c) second[c] *= invstd[c];
  return sums;
}

std::pair<Tensor, Tensor> batch_norm_backward_reduce_relu_output(const Tensor& grad_output_in, const Tensor& output_in,
                                                                 const Tensor& input_in, const Tensor& mean,
                                                                 const Tensor& var, double eps) {
  const Tensor grad_output = cpu_compute_input(grad_output_in), output = cpu_compute_input(output_in);
  const Tensor input = cpu_compute_input(input_in);
  LOOM_CHECK(output.sizes() == input.sizes() && grad_output.sizes() == input.sizes(),
             "batch_norm_add_relu backward: the output ", shape_str(output.sizes()), " and its gradient ",
             shape_str(grad_output.sizes()), " must have the input's shape ", shape_str(input.sizes()));
  const ChannelGeometry l = channel_geometry(input);
  const std::vector<double> m = per_channel(mean, l.channels, 0.0);
  const std::vector<double> invstd = inverse_std(per_channel(var, l.channels, 1.0), eps);
  Tensor g_out = Tensor::empty(input.sizes(), input.dtype());
  Tensor sums = visit_compute_dtype(input.dtype(), "batch_norm_add_relu backward", [&]<class T>() {
    const T* x = input.data<T>();
    const T* dy = grad_output.data<T>();
    const T* y = output.data<T>();
    T* g = g_out.data<T>();
    // Each run of elements is masked into g, then summed as backward_reduce
    // sums (unmasked) while it is in cache: the sums of the two ops, in one
    // pass over the tensors.
    const auto mask = [&](int64_t begin, int64_t count) {
      for (int64_t i = begin; i < begin + count; ++i) g[i] = ::loom::ops::Relu::backward(dy[i], y[i]);
    };
    if (flat_rows(l)) {  // 1x1 to 4x4 planes: straight into f64
      const std::vector<T> ms = spread_per_channel<T>(l, m);
      return channel_sums_flat(l, [&](int64_t offset, int64_t first, int64_t count, double* sum_dy,
                                      double* sum_dy_xmu) {
        mask(offset + first, count);
        flat_backward_sums<T, false>(g + offset + first, x + offset + first, count, nullptr, nullptr,
                                     ms.data() + first, sum_dy, sum_dy_xmu);
      });
    }
    return channel_sums(l, [&](int64_t c, int64_t offset, double& sum_dy, double& sum_dy_xmu) {
      mask(offset, l.inner);
      row_backward_sums<T, false>(g + offset, x + offset, l.inner, T(0), T(0), static_cast<T>(m[c]), sum_dy,
                                  sum_dy_xmu);
    });
  });
  double* second = sums.data<double>() + l.channels;
  for (int64_t c = 0; c < l.channels; ++c) second[c] *= invstd[c];
  return {sums, g_out.to(grad_output_in.dtype())};
}

Tensor batch_norm_backward_apply(const Tensor& grad_output_in, const Tensor& input_in, const Tensor& mean,
                                 const Tensor& var, const Tensor& weight, const Tensor& grad_sums,
                                 const StatisticsCount& count, double eps, const FusedRelu& relu) {
  const Tensor grad_output = cpu_compute_input(grad_output_in);
  // Eval mode without a fused ReLU needs no input.
  const Tensor input = relu.enabled || grad_sums.defined() ? cpu_compute_input(input_in) : Tensor();
  LOOM_CHECK(!relu.pooled || relu.enabled, "batch_norm backward: a pooled gradient needs the fused ReLU");
  if (relu.pooled) check_pooled_gradient(grad_output, input);
  // A pooled gradient is smaller than the input: the input gives the geometry.
  const ChannelGeometry l = channel_geometry(relu.pooled ? input : grad_output);
  const PooledPlane p = relu.pooled ? pooled_plane(input) : PooledPlane{};
  const std::vector<double> v = per_channel(var, l.channels, 1.0);
  const std::vector<double> w = per_channel(weight, l.channels, 1.0);
  // dx = k * dy in eval; in training dx = k * (dy - mean_dy) - p * (x - mean) (math::backward).
  std::vector<double> k(l.channels);
  for (int64_t c = 0; c < l.channels; ++c) k[c] = math::eval_backward_scale(v[c], w[c], eps);
  const Affine forward = affine_coefficients(mean, var, relu.weight, relu.bias, eps, l.channels);
  Tensor grad_input = Tensor::empty(relu.pooled ? input.sizes() : grad_output.sizes(), grad_output.dtype());
  if (!grad_sums.defined()) {
    visit_compute_dtype(grad_output.dtype(), "batch_norm backward", [&]<class T>() {
      const T* dy = grad_output.data<T>();
      const T* x = relu.enabled ? input.data<T>() : nullptr;
      T* dx = grad_input.data<T>();
      if (relu.pooled) {
        for_each_row(l, [&](int64_t c, int64_t offset) {
          T* g = thread_scratch<T>(PoolBufferSlot::plane, l.inner + kGradientPadding);
          pooled_relu_gradient(x + offset, p, static_cast<T>(forward.scale[c]), static_cast<T>(forward.shift[c]),
                               dy + pooled_offset(l, p, offset), g);
          const T kc = static_cast<T>(k[c]);
          for (int64_t s = 0; s < l.inner; ++s) dx[offset + s] = g[s] * kc;
        });
        return;
      }
      math::with_flag(relu.enabled, [&]<bool Masked>() {
        if (flat_rows(l)) {
          const std::vector<T> ks = spread_per_channel<T>(l, k);
          const std::vector<T> as = Masked ? spread_per_channel<T>(l, forward.scale) : std::vector<T>();
          const std::vector<T> bs = Masked ? spread_per_channel<T>(l, forward.shift) : std::vector<T>();
          const int64_t image = l.channels * l.inner;
          for_each_image(l, [&](int64_t offset) {
            for (int64_t j = 0; j < image; ++j) {
              const T g = masked<Masked>(dy[offset + j], x, offset + j, Masked ? as[j] : T(0), Masked ? bs[j] : T(0));
              dx[offset + j] = g * ks[j];
            }
          });
          return;
        }
        for_each_row(l, [&](int64_t c, int64_t offset) {
          const T kc = static_cast<T>(k[c]);
          const T a = static_cast<T>(forward.scale[c]), b = static_cast<T>(forward.shift[c]);
          for (int64_t s = 0; s < l.inner; ++s) {
            dx[offset + s] = masked<Masked>(dy[offset + s], x, offset + s, a, b) * kc;
          }
        });
      });
    });
    return grad_input.to(grad_output_in.dtype());
  }
  const double n = element_count("batch_norm backward", count);
  const std::vector<double> m = per_channel(mean, l.channels, 0.0);
  const std::vector<double> sums = grad_sums.to_vector<double>();
  visit_compute_dtype(grad_output.dtype(), "batch_norm backward", [&]<class T>() {
    const T* x = input.data<T>();
    const T* dy = grad_output.data<T>();
    T* dx = grad_input.data<T>();
    // Per-channel coefficients in T, once: with 1x1 planes a row is one
    // element, and computing them per row (a division in f64) cost more than
    // the row.
    struct Coefficients {
      T k, mean_dy, mean, p, a, b;
    };
    std::vector<Coefficients> coefficients(static_cast<size_t>(l.channels));
    for (int64_t c = 0; c < l.channels; ++c) {
      const math::Backward co = math::backward(v[c], w[c], eps, sums[c], sums[l.channels + c], n);
      coefficients[c] = {static_cast<T>(co.k), static_cast<T>(co.mean_dy), static_cast<T>(m[c]),
                         static_cast<T>(co.p), static_cast<T>(forward.scale[c]), static_cast<T>(forward.shift[c])};
    }
    if (relu.pooled) {
      for_each_row(l, [&](int64_t c, int64_t offset) {
        const Coefficients& co = coefficients[c];
        T* g = thread_scratch<T>(PoolBufferSlot::plane, l.inner + kGradientPadding);
        pooled_relu_gradient(x + offset, p, co.a, co.b, dy + pooled_offset(l, p, offset), g);
        const T kc = co.k, mean_dy = co.mean_dy, mc = co.mean, pc = co.p;
        for (int64_t s = 0; s < l.inner; ++s) dx[offset + s] = kc * (g[s] - mean_dy) - pc * (x[offset + s] - mc);
      });
      return;
    }
    math::with_flag(relu.enabled, [&]<bool Masked>() {
      if (flat_rows(l)) {
        // Each coefficient spread over an image, an array apiece (the loop vectorises).
        const int64_t image = l.channels * l.inner;
        std::vector<T> spread(static_cast<size_t>(6 * image));
        T* ks = spread.data();
        T* mean_dys = ks + image;
        T* means = mean_dys + image;
        T* ps = means + image;
        T* as = ps + image;
        T* bs = as + image;
        for (int64_t c = 0; c < l.channels; ++c) {
          const Coefficients& co = coefficients[c];
          const int64_t e = c * l.inner;
          std::fill_n(ks + e, l.inner, co.k);
          std::fill_n(mean_dys + e, l.inner, co.mean_dy);
          std::fill_n(means + e, l.inner, co.mean);
          std::fill_n(ps + e, l.inner, co.p);
          std::fill_n(as + e, l.inner, co.a);
          std::fill_n(bs + e, l.inner, co.b);
        }
        for_each_image(l, [&](int64_t offset) {
          const T* xs = x + offset;
          const T* dys = dy + offset;
          T* dxs = dx + offset;
          for (int64_t j = 0; j < image; ++j) {
            const T g = masked<Masked>(dys[j], xs, j, as[j], bs[j]);
            dxs[j] = ks[j] * (g - mean_dys[j]) - ps[j] * (xs[j] - means[j]);
          }
        });
        return;
      }
      for_each_row(l, [&](int64_t c, int64_t offset) {
        const Coefficients& co = coefficients[c];
        const T kc = co.k, mean_dy = co.mean_dy, mc = co.mean, pc = co.p, a = co.a, b = co.b;
        for (int64_t s = 0; s < l.inner; ++s) {
          const T x_s = x[offset + s];
          dx[offset + s] = kc * (masked<Masked>(dy[offset + s], x, offset + s, a, b) - mean_dy) - pc * (x_s - mc);
        }
      });
    });
  });
  return grad_input.to(grad_output_in.dtype());
}

}  // namespace loom::ops::cpu

