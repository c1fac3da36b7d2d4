// The 2x2 max pool with stride 2 and no padding (the ConvNet's and ResNet's
// pools), shared by max_pool2d (pooling.cpp) and batch norm's fused ReLU +
// pool (batch_norm.cpp, batch_norm_backward.cpp), which must choose the same
// element of every window: a value takes over when it is larger or NaN
// (PyTorch's rule: the first maximum wins ties, the last NaN wins).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace loom::ops::cpu {

// Whether `candidate` takes over from `best` as a window's maximum.
template <class T>
inline bool pool_takes_over(T candidate, T best) {
  return candidate > best || std::isnan(candidate);
}

// One plane: out (out_h, out_w) and each output's plane index in arg, no
// bounds checks; by selects rather than branches, which mispredict on real data.
template <class T>
inline void pool_2x2(const T* plane, int64_t width, int64_t out_h, int64_t out_w, T* out, int64_t* arg) {
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
        const bool take = pool_takes_over(candidates[k], best);
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
// Their inverse: the 16 floats lo:hi whose even columns are `even` and odd
// columns `odd` (the permute undoes theirs; unpack interleaves per half).
__attribute__((target("avx2"))) inline void interleave_columns(__m256 even, __m256 odd, __m256& lo, __m256& hi) {
  const __m256 e = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), 0xD8));
  const __m256 o = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(odd), 0xD8));
  lo = _mm256_unpacklo_ps(e, o);
  hi = _mm256_unpackhi_ps(e, o);
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
__attribute__((target("avx2"))) inline void pool_2x2_avx2(const float* plane, int64_t width, int64_t out_h,
                                                         int64_t out_w, float* out, int64_t* arg) {
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

}  // namespace loom::ops::cpu
