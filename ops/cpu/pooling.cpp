// CPU kernels of max_pool2d and adaptive_avg_pool2d: one (n, c) plane per task.
#include <loom/ops/pooling.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include <loom/core/parallel.h>
#include <loom/ops/cpu/simd.h>
#include <loom/ops/dispatch.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace loom::ops::cpu {
namespace {
constexpr int64_t kGrain = 1 << 14;  // elements per task

// Runs fn(plane) over the N*C planes of an (N, C, H, W) tensor, in parallel.
template <class Fn>
void for_each_plane(const Shape& sizes, Fn&& fn) {
  const int64_t planes = sizes[0] * sizes[1];
  const int64_t plane_size = std::max<int64_t>(1, sizes[2] * sizes[3]);
  parallel_for(0, planes, std::max<int64_t>(1, kGrain / plane_size), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) fn(p);
  });
}

int64_t pooled_size(int64_t input, int64_t kernel, int64_t stride, int64_t padding) {
  return (input + 2 * padding - kernel) / stride + 1;
}

// Adaptive pooling window of output i of `outputs` over `inputs`: [start, end).
int64_t window_start(int64_t i, int64_t inputs, int64_t outputs) { return i * inputs / outputs; }
int64_t window_end(int64_t i, int64_t inputs, int64_t outputs) { return ((i + 1) * inputs + outputs - 1) / outputs; }
// The ConvNet's and ResNet's common case: 2x2 windows, stride 2, no padding,
// no bounds checks. A value takes over when it is larger or NaN (PyTorch's
// rule: the first maximum wins ties, the last NaN wins), by selects rather
// than branches, which mispredict on real data.
template <class T>
void pool_2x2(const T* plane, int64_t width, int64_t out_h, int64_t out_w, T* out, int64_t* arg) {
  for (int64_t oh = 0; oh < out_h; ++oh) {
    const T* top = plane + 2 * oh * width;
    const T* bottom = top + width;
    for (int64_t ow = 0; ow < out_w; ++ow) {
      const int64_t i0 = 2 * oh * width + 2 * ow;
      T best = top[2 * ow];
      int64_t index = i0;
      const T candidates[3] = {top[2 * ow + 1], bottom[2 * ow], bottom[2 * ow + 1]};
      const int64_t positions[3] = {i0 + 1, i0 + width, i0 + width + 1};
      for (int k = 0; k < 3; ++k) {
        const bool take = candidates[k] > best || std::isnan(candidates[k]);
        best = take ? candidates[k] : best;
        index = take ? positions[k] : index;
      }
      out[oh * out_w + ow] = best;
      arg[oh * out_w + ow] = index;
    }
  }
}

#if defined(__x86_64__)
// Columns 0, 2, .., 14 (even) or 1, 3, .., 15 (odd) of the 16 floats lo:hi.
// shuffle_ps works per 128-bit half; permute4x64 puts the halves in order.
__attribute__((target("avx2"))) inline __m256 even_columns(__m256 lo, __m256 hi) {
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88)), 0xD8));
}
__attribute__((target("avx2"))) inline __m256 odd_columns(__m256 lo, __m256 hi) {
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0xDD)), 0xD8));
}

// Eight outputs of pool_2x2 for f32 from the 16 input columns of their two
// rows (lo:hi): the rows are split into even and odd columns, and the three
// other candidates of each window take over by the same rule (larger, or
// NaN), index by index. `first` is the plane index of the first window's
// top-left value.
__attribute__((target("avx2"))) inline void pool_2x2_eight(__m256 t_lo, __m256 t_hi, __m256 b_lo, __m256 b_hi,
                                                          int64_t first_index, int64_t width, float* out,
                                                          int64_t* arg) {
  const __m256i first = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(first_index)),
                                         _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
  __m256 best = even_columns(t_lo, t_hi);
  __m256i index = first;
  const __m256 candidates[3] = {odd_columns(t_lo, t_hi), even_columns(b_lo, b_hi), odd_columns(b_lo, b_hi)};
  const int32_t shifts[3] = {1, static_cast<int32_t>(width), static_cast<int32_t>(width + 1)};
  for (int k = 0; k < 3; ++k) {
    const __m256 mask = _mm256_or_ps(_mm256_cmp_ps(candidates[k], best, _CMP_GT_OQ),
                                     _mm256_cmp_ps(candidates[k], candidates[k], _CMP_UNORD_Q));
    best = _mm256_blendv_ps(best, candidates[k], mask);
    index = _mm256_blendv_epi8(index, _mm256_add_epi32(first, _mm256_set1_epi32(shifts[k])),
                               _mm256_castps_si256(mask));
  }
  _mm256_storeu_ps(out, best);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(arg), _mm256_cvtepi32_epi64(_mm256_castsi256_si128(index)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(arg + 4), _mm256_cvtepi32_epi64(_mm256_extracti128_si256(index, 1)));
}

// pool_2x2 for f32, eight outputs at a time with AVX2. A row's last outputs
// are the last eight again (recomputed, the same values) when the row has
// eight; a shorter row (the ConvNet's 7-wide) loads its columns masked and
// keeps its outputs of the eight.
__attribute__((target("avx2"))) void pool_2x2_avx2(const float* plane, int64_t width, int64_t out_h, int64_t out_w,
                                                  float* out, int64_t* arg) {
  alignas(32) int32_t lanes[16];
  for (int32_t i = 0; i < 16; ++i) lanes[i] = i < 2 * out_w ? -1 : 0;
  const __m256i mask_lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
  const __m256i mask_hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes + 8));
  for (int64_t oh = 0; oh < out_h; ++oh) {
    const float* top = plane + 2 * oh * width;
    const float* bottom = top + width;
    float* out_row = out + oh * out_w;
    int64_t* arg_row = arg + oh * out_w;
    if (out_w < 8) {
      alignas(32) float values[8];
      alignas(32) int64_t indices[8];
      pool_2x2_eight(_mm256_maskload_ps(top, mask_lo), _mm256_maskload_ps(top + 8, mask_hi),
                     _mm256_maskload_ps(bottom, mask_lo), _mm256_maskload_ps(bottom + 8, mask_hi), 2 * oh * width,
                     width, values, indices);
      std::copy_n(values, out_w, out_row);
      std::copy_n(indices, out_w, arg_row);
      continue;
    }
    for (int64_t ow = 0;; ow += 8) {
      ow = std::min(ow, out_w - 8);
      pool_2x2_eight(_mm256_loadu_ps(top + 2 * ow), _mm256_loadu_ps(top + 2 * ow + 8), _mm256_loadu_ps(bottom + 2 * ow),
                     _mm256_loadu_ps(bottom + 2 * ow + 8), 2 * oh * width + 2 * ow, width, out_row + ow, arg_row + ow);
      if (ow + 8 >= out_w) break;
    }
  }
}
#endif
}  // namespace

Tensor max_pool2d_forward(const Tensor& input_in, Size2 kernel, Size2 stride, Size2 padding, Tensor& indices) {
  const Tensor input = cpu_compute_input(input_in);
  const int64_t height = input.size(2), width = input.size(3);
  const int64_t out_h = pooled_size(height, kernel[0], stride[0], padding[0]);
  const int64_t out_w = pooled_size(width, kernel[1], stride[1], padding[1]);
  const Shape out_sizes{input.size(0), input.size(1), out_h, out_w};
  Tensor out = Tensor::empty(out_sizes, input.dtype());
  indices = Tensor::empty(out_sizes, DType::i64);
  visit_compute_dtype(input.dtype(), "max_pool2d", [&]<class T>() {
    const T* x = input.data<T>();
    T* y = out.data<T>();
    int64_t* arg = indices.data<int64_t>();
    const bool two_by_two = kernel == Size2{2, 2} && stride == Size2{2, 2} && padding == Size2{0, 0};
    for_each_plane(input.sizes(), [&](int64_t p) {
      const T* plane = x + p * height * width;
      T* y_plane = y + p * out_h * out_w;
      int64_t* arg_plane = arg + p * out_h * out_w;
      if (two_by_two) {
#if defined(__x86_64__)
        if constexpr (std::is_same_v<T, float>) {
          if (cpu_has_avx2() && height * width < (int64_t{1} << 31)) {
            pool_2x2_avx2(plane, width, out_h, out_w, y_plane, arg_plane);
            return;
          }
        }
#endif
        pool_2x2(plane, width, out_h, out_w, y_plane, arg_plane);
        return;
      }
      for (int64_t oh = 0; oh < out_h; ++oh) {
        const int64_t h0 = std::max<int64_t>(oh * stride[0] - padding[0], 0);
        const int64_t h1 = std::min<int64_t>(oh * stride[0] - padding[0] + kernel[0], height);
        for (int64_t ow = 0; ow < out_w; ++ow) {
          const int64_t w0 = std::max<int64_t>(ow * stride[1] - padding[1], 0);
          const int64_t w1 = std::min<int64_t>(ow * stride[1] - padding[1] + kernel[1], width);
          // The index moves by a mask and the value by max, not by a branch: on
          // real data "v > best" is unpredictable, and mispredictions
          // dominated the run time. NaNs are rare and handled after the scan.
          T best = -std::numeric_limits<T>::infinity();
          int64_t best_index = h0 * width + w0;
          bool saw_nan = false;
          for (int64_t h = h0; h < h1; ++h) {
            for (int64_t w = w0; w < w1; ++w) {
              const T v = plane[h * width + w];
              const int64_t take = -static_cast<int64_t>(v > best);  // all ones or zero
              best_index = ((h * width + w) & take) | (best_index & ~take);
              best = std::max(best, v);
              saw_nan |= std::isnan(v);
            }
          }
          if (saw_nan) {  // as in PyTorch: the last NaN of the window wins
            for (int64_t h = h0; h < h1; ++h) {
              for (int64_t w = w0; w < w1; ++w) {
                if (std::isnan(plane[h * width + w])) best_index = h * width + w;
              }
            }
            best = plane[best_index];
          }
          y_plane[oh * out_w + ow] = best;
          arg_plane[oh * out_w + ow] = best_index;
        }
      }
    });
  });
  return out.to(input_in.dtype());
}

Tensor max_pool2d_backward(const Tensor& grad_output_in, const Tensor& indices, const Shape& input_sizes) {
  const Tensor grad_output = cpu_compute_input(grad_output_in);
  const Tensor index = indices.contiguous();
  const int64_t in_plane = input_sizes[2] * input_sizes[3];
  const int64_t out_plane = grad_output.size(2) * grad_output.size(3);
  Tensor grad_input = Tensor::empty(input_sizes, grad_output.dtype());
  visit_compute_dtype(grad_output.dtype(), "max_pool2d backward", [&]<class T>() {
    const T* dy = grad_output.data<T>();
    const int64_t* arg = index.data<int64_t>();
    T* dx = grad_input.data<T>();
    for_each_plane(input_sizes, [&](int64_t p) {
      T* dx_plane = dx + p * in_plane;
      std::fill(dx_plane, dx_plane + in_plane, T(0));
      for (int64_t i = 0; i < out_plane; ++i) dx_plane[arg[p * out_plane + i]] += dy[p * out_plane + i];
    });
  });
  return grad_input.to(grad_output_in.dtype());
}

Tensor adaptive_avg_pool2d_forward(const Tensor& input_in, Size2 output_size) {
  const Tensor input = cpu_compute_input(input_in);
  const int64_t height = input.size(2), width = input.size(3);
  // Not a structured binding: clang before 16 (the fuzz build's) cannot capture one in a lambda.
  const int64_t out_h = output_size[0], out_w = output_size[1];
  Tensor out = Tensor::empty({input.size(0), input.size(1), out_h, out_w}, input.dtype());
  visit_compute_dtype(input.dtype(), "adaptive_avg_pool2d", [&]<class T>() {
    const T* x = input.data<T>();
    T* y = out.data<T>();
    for_each_plane(input.sizes(), [&](int64_t p) {
      const T* plane = x + p * height * width;
      for (int64_t oh = 0; oh < out_h; ++oh) {
        const int64_t h0 = window_start(oh, height, out_h), h1 = window_end(oh, height, out_h);
        for (int64_t ow = 0; ow < out_w; ++ow) {
          const int64_t w0 = window_start(ow, width, out_w), w1 = window_end(ow, width, out_w);
          T total = 0;
          for (int64_t h = h0; h < h1; ++h) {
            for (int64_t w = w0; w < w1; ++w) total += plane[h * width + w];
          }
          y[(p * out_h + oh) * out_w + ow] = total / static_cast<T>((h1 - h0) * (w1 - w0));
        }
      }
    });
  });
  return out.to(input_in.dtype());
}

Tensor adaptive_avg_pool2d_backward(const Tensor& grad_output_in, const Shape& input_sizes) {
  const Tensor grad_output = cpu_compute_input(grad_output_in);
  const int64_t height = input_sizes[2], width = input_sizes[3];
  const int64_t out_h = grad_output.size(2), out_w = grad_output.size(3);
  Tensor grad_input = Tensor::empty(input_sizes, grad_output.dtype());
  visit_compute_dtype(grad_output.dtype(), "adaptive_avg_pool2d backward", [&]<class T>() {
    const T* dy = grad_output.data<T>();
    T* dx = grad_input.data<T>();
    for_each_plane(input_sizes, [&](int64_t p) {
      T* plane = dx + p * height * width;
      std::fill(plane, plane + height * width, T(0));
      for (int64_t oh = 0; oh < out_h; ++oh) {
        const int64_t h0 = window_start(oh, height, out_h), h1 = window_end(oh, height, out_h);
        for (int64_t ow = 0; ow < out_w; ++ow) {
          const int64_t w0 = window_start(ow, width, out_w), w1 = window_end(ow, width, out_w);
          const T share = dy[(p * out_h + oh) * out_w + ow] / static_cast<T>((h1 - h0) * (w1 - w0));
          for (int64_t h = h0; h < h1; ++h) {
            for (int64_t w = w0; w < w1; ++w) plane[h * width + w] += share;
          }
        }
      }
    });
  });
  return grad_input.to(grad_output_in.dtype());
}

}  // namespace loom::ops::cpu
