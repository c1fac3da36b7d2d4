// conv2d's column matrices on the CPU: the taps' tables (make_taps), im2col
// and its adjoint col2im_add, with their AVX2 / AVX-512 row and plane kernels.
#include <loom/ops/cpu/conv2d_internal.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <loom/ops/cpu/gemm.h>
#include <loom/ops/cpu/simd.h>

namespace loom::ops::cpu::conv2d_detail {
namespace {

ValidRange valid_outputs(int64_t offset, int64_t stride, int64_t size, int64_t outputs) {
  const int64_t first = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const int64_t last = size - 1 - offset < 0 ? 0 : (size - 1 - offset) / stride + 1;
  const int64_t clamped_first = std::min(first, outputs);
  return {clamped_first, std::max(clamped_first, std::min(last, outputs))};
}

}  // namespace

Taps make_taps(const Geometry& g) {
  const auto& p = g.params;
  Taps t;
  t.kernel = g.kernel_h * g.kernel_w;
  for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
    for (int64_t kj = 0; kj < g.kernel_w; ++kj) {
      Taps::Tap tap;
      tap.index = ki * g.kernel_w + kj;
      tap.offset_h = ki * p.dilation[0] - p.padding[0];
      tap.offset_w = kj * p.dilation[1] - p.padding[1];
      tap.rows = valid_outputs(tap.offset_h, p.stride[0], g.height, g.out_h);
      tap.cols = valid_outputs(tap.offset_w, p.stride[1], g.width, g.out_w);
      for (int64_t column = 0; column < 32; ++column) {
        tap.columns_inside[column] = column >= tap.cols.first && column < tap.cols.last ? -1 : 0;
      }
      if (tap.rows.first < tap.rows.last && tap.cols.first < tap.cols.last) t.taps.push_back(tap);
    }
  }
  for (int64_t column = 0; column < 32; ++column) t.columns_in_row[column] = column < g.out_w ? -1 : 0;
  t.tabled = g.output_plane() <= kTabledPlane;
  if (t.tabled) {
    for (const Taps::Tap& tap : t.taps) {
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          const bool inside = oh >= tap.rows.first && oh < tap.rows.last && ow >= tap.cols.first && ow < tap.cols.last;
          t.sources.push_back(inside ? static_cast<int32_t>((oh * p.stride[0] + tap.offset_h) * g.width +
                                                            ow * p.stride[1] + tap.offset_w)
                                     : -1);
        }
      }
    }
  }
  return t;
}

namespace {

#if defined(__x86_64__)
// f32, unit horizontal stride, output rows of at most 32: each output row of
// a tap is up to four 8-lane chunks, copied with masked loads (lanes outside
// the image read nothing and come back zero). The MNIST ConvNet's rows are 14
// and 28 wide, where the generic loops spent more time on their bounds than
// on the copy.
constexpr int64_t kMaskedRowWidth = 32;

bool masked_rows_apply(const Geometry& g) {
  return ops::cpu::cpu_has_avx2() && g.params.stride[1] == 1 && g.out_w <= kMaskedRowWidth &&
         g.output_plane() > kTabledPlane;
}

__attribute__((target("avx2"))) void im2col_masked_rows(const float* image, const Geometry& g, const Taps& taps,
                                                        float* col, int64_t ld) {
  const int64_t kernel = static_cast<int64_t>(taps.taps.size());
  const int chunks = static_cast<int>((g.out_w + 7) / 8);
  // Chunks are stored whole (AMD's masked stores are slow; masked loads are
  // not): lanes past an output row land on the following rows of this tap and
  // image, which are written afterwards. A chunk that would reach past the
  // image's Ho*Wo block (into another image's or tap's columns) is stored
  // masked.
  const int64_t plane_out = g.output_plane();
  for (int64_t c = 0; c < g.channels; ++c) {
    const float* plane = image + c * g.input_plane();
    for (int64_t t = 0; t < kernel; ++t) {
      const Taps::Tap& tap = taps.taps[t];
      float* out = col + (c * kernel + t) * ld;
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        float* dst = out + oh * g.out_w;
        const bool inside = oh >= tap.rows.first && oh < tap.rows.last;
        // Element ow of the row reads src[ow]; only lanes inside the image are loaded.
        const float* src = plane + (oh * g.params.stride[0] + tap.offset_h) * g.width + tap.offset_w;
        for (int j = 0; j < chunks; ++j) {
          // A branch, not a select: outside the image rows src is no address to load from.
          __m256 v = _mm256_setzero_ps();
          if (inside) {
            v = _mm256_maskload_ps(src + 8 * j,
                                   _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tap.columns_inside + 8 * j)));
          }
          if (oh * g.out_w + 8 * (j + 1) > plane_out) {
            _mm256_maskstore_ps(dst + 8 * j, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(taps.columns_in_row + 8 * j)),
                                v);
          } else {
            _mm256_storeu_ps(dst + 8 * j, v);
          }
        }
      }
    }
  }
}

#endif

#if defined(__x86_64__)
// f32 under the AVX-512 kernel, tabled output planes read from input planes of
// at most 64 elements (ResNet-50's 3x3 and strided 1x1 convolutions on 8x8,
// 4x4 and 2x2 planes): a channel's input plane is loaded into up to four
// 512-bit registers once, and every 16 outputs of a tap are one or two
// permutes of them by the tap's table of sources, lanes in the padding zeroed:
// element by element, those table lookups were a visible share of ResNet-50's
// ImageNet stem step. (Measured:
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md.)
constexpr int64_t kRegisterPlane = 64;

bool register_planes_apply(const Geometry& g, const Taps& taps) {
  return taps.tabled && g.input_plane() <= kRegisterPlane && gemm_kernel() == GemmKernel::avx512;
}

__attribute__((target("avx512f"))) void im2col_register_planes(const float* image, const Geometry& g,
                                                                const Taps& taps, float* col, int64_t ld) {
  const int64_t plane_in = g.input_plane(), plane_out = g.output_plane();
  const int64_t kernel = static_cast<int64_t>(taps.taps.size()), chunks = (plane_out + 15) / 16;
  const auto lanes = [](int64_t n) {
    return static_cast<__mmask16>(n >= 16 ? 0xFFFF : n <= 0 ? 0 : (1u << n) - 1);
  };
  const __mmask16 m0 = lanes(plane_in), m1 = lanes(plane_in - 16), m2 = lanes(plane_in - 32),
                  m3 = lanes(plane_in - 48);
  const __mmask16 last = lanes(plane_out - 16 * (chunks - 1));
  const bool wide = plane_in > 32;
  const __m512i zero = _mm512_setzero_si512(), thirty_two = _mm512_set1_epi32(32);
  for (int64_t c = 0; c < g.channels; ++c) {
    const float* plane = image + c * plane_in;
    const __m512 v0 = _mm512_maskz_loadu_ps(m0, plane), v1 = _mm512_maskz_loadu_ps(m1, plane + 16);
    const __m512 v2 = wide ? _mm512_maskz_loadu_ps(m2, plane + 32) : _mm512_setzero_ps();
    const __m512 v3 = wide ? _mm512_maskz_loadu_ps(m3, plane + 48) : _mm512_setzero_ps();
    for (int64_t t = 0; t < kernel; ++t) {
      const int32_t* source = taps.sources.data() + t * plane_out;
      float* out = col + (c * kernel + t) * ld;
      for (int64_t j = 0; j < chunks; ++j) {
        // Lanes past the plane's end load nothing and store nothing.
        const __mmask16 valid = j == chunks - 1 ? last : 0xFFFF;
        const __m512i index = _mm512_maskz_loadu_epi32(valid, source + 16 * j);
        const __mmask16 inside = _mm512_mask_cmpge_epi32_mask(valid, index, zero);
        // permutex2var picks by the index's low 5 bits, within (v0, v1) or (v2, v3).
        const __mmask16 high = _mm512_mask_cmpge_epi32_mask(inside, index, thirty_two);
        __m512 v = _mm512_maskz_permutex2var_ps(static_cast<__mmask16>(inside & ~high), v0, index, v1);
        if (wide) v = _mm512_mask_blend_ps(high, v, _mm512_permutex2var_ps(v2, index, v3));
        if (valid == 0xFFFF) {
          _mm512_storeu_ps(out + 16 * j, v);
        } else {
          _mm512_mask_storeu_ps(out + 16 * j, valid, v);
        }
      }
    }
  }
}
#endif

#if defined(__x86_64__)
// f32 under the AVX-512 kernel, horizontal stride 2 onto output rows of 8 or
// 16 (ResNet-50's stride-2 3x3 and 1x1 convolutions onto 16x16 and 8x8
// planes at 32x32 input): every 16 outputs of a tap (one row of 16, or two
// rows of 8) are the even lanes of 32 input floats, loaded with the lanes
// outside the image masked off and picked by one permute. Element by
// element (a stride-2 loop, or the table on 8x8 planes), im2col and col2im
// were a large part of those convolutions' time. (Measured:
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md.)
bool strided_rows_apply(const Geometry& g) {
  return g.params.stride[1] == 2 && (g.out_w == 8 || g.out_w == 16) && gemm_kernel() == GemmKernel::avx512;
}

// The chunk of 16 outputs of a tap whose first output row is oh (one row of
// 16 or two of 8) is read from two halves of 16 floats: the row's first and
// second 16, or the first 16 of each row. Each half starts in the input plane
// at its row (shifted by the tap's column offset, so possibly before it) and
// loads lanes 2 * ow for the valid columns ow and the odd lanes between them;
// none for a row that reads only padding.
struct StridedChunk {
  int64_t start[2];
  __mmask16 loads[2];
  __mmask16 outputs;  // the chunk's output lanes that read the image
  __mmask16 stores;   // the chunk's output lanes inside the output plane
};

inline uint32_t lane_range(int64_t first, int64_t last) {  // bits [first, last) of 32
  if (last <= first) return 0;
  return static_cast<uint32_t>(((uint64_t{1} << last) - 1) & ~((uint64_t{1} << first) - 1));
}

StridedChunk strided_chunk(const Geometry& g, const Taps::Tap& tap, int64_t oh) {
  StridedChunk k{};
  const int64_t rows = 16 / g.out_w;
  const uint32_t loads = lane_range(2 * tap.cols.first, 2 * tap.cols.last - 1);
  const uint32_t columns = lane_range(tap.cols.first, tap.cols.last);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = oh + r;
    if (row < g.out_h) k.stores |= static_cast<__mmask16>(((1u << g.out_w) - 1) << (r * g.out_w));
    if (row < tap.rows.first || row >= tap.rows.last) continue;
    const int64_t start = (row * g.params.stride[0] + tap.offset_h) * g.width + tap.offset_w;
    k.outputs |= static_cast<__mmask16>(columns << (r * g.out_w));
    if (rows == 1) {
      k.start[0] = start, k.start[1] = start + 16;
      k.loads[0] = static_cast<__mmask16>(loads), k.loads[1] = static_cast<__mmask16>(loads >> 16);
    } else {
      k.start[r] = start, k.loads[r] = static_cast<__mmask16>(loads);
    }
  }
  return k;
}

// Every tap's chunks, [tap][chunk]: they depend on the geometry alone, so they
// are worked out once per call rather than once per channel.
std::vector<StridedChunk> strided_chunks(const Geometry& g, const Taps& taps) {
  const int64_t rows = 16 / g.out_w;
  std::vector<StridedChunk> chunks;
  chunks.reserve(taps.taps.size() * static_cast<size_t>((g.out_h + rows - 1) / rows));
  for (const Taps::Tap& tap : taps.taps) {
    for (int64_t oh = 0; oh < g.out_h; oh += rows) chunks.push_back(strided_chunk(g, tap, oh));
  }
  return chunks;
}

__attribute__((target("avx512f"))) void im2col_strided_rows(const float* image, const Geometry& g, const Taps& taps,
                                                             float* col, int64_t ld) {
  const int64_t kernel = static_cast<int64_t>(taps.taps.size()), rows = 16 / g.out_w;
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const std::vector<StridedChunk> chunks = strided_chunks(g, taps);
  for (int64_t c = 0; c < g.channels; ++c) {
    const float* plane = image + c * g.input_plane();
    const StridedChunk* chunk = chunks.data();
    for (int64_t t = 0; t < kernel; ++t) {
      float* out = col + (c * kernel + t) * ld;
      for (int64_t oh = 0; oh < g.out_h; oh += rows) {
        const StridedChunk& k = *chunk++;
        // Masked-off lanes load nothing: a start before the plane never reads there.
        const __m512 a = _mm512_maskz_loadu_ps(k.loads[0], plane + k.start[0]);
        const __m512 b = _mm512_maskz_loadu_ps(k.loads[1], plane + k.start[1]);
        const __m512 v = _mm512_maskz_permutex2var_ps(k.outputs, a, even, b);
        float* dst = out + oh * g.out_w;
        if (k.stores == 0xFFFF) {
          _mm512_storeu_ps(dst, v);
        } else {
          _mm512_mask_storeu_ps(dst, k.stores, v);
        }
      }
    }
  }
}

// The adjoint: the chunk's outputs 0-7 and 8-15 go to the even lanes of its
// two halves and are added there.
__attribute__((target("avx512f"))) void col2im_strided_rows(const float* col, int64_t ld, const Geometry& g,
                                                            const Taps& taps, float* image) {
  const int64_t kernel = static_cast<int64_t>(taps.taps.size()), rows = 16 / g.out_w;
  const __m512i spread[2] = {_mm512_setr_epi32(0, 0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7, 0),
                             _mm512_setr_epi32(8, 0, 9, 0, 10, 0, 11, 0, 12, 0, 13, 0, 14, 0, 15, 0)};
  const std::vector<StridedChunk> chunks = strided_chunks(g, taps);
  for (int64_t c = 0; c < g.channels; ++c) {
    float* plane = image + c * g.input_plane();
    const StridedChunk* chunk = chunks.data();
    for (int64_t t = 0; t < kernel; ++t) {
      const float* in = col + (c * kernel + t) * ld;
      for (int64_t oh = 0; oh < g.out_h; oh += rows) {
        const StridedChunk& k = *chunk++;
        if (k.outputs == 0) continue;
        const __m512 v = _mm512_maskz_loadu_ps(k.stores, in + oh * g.out_w);
        for (int half = 0; half < 2; ++half) {
          const __mmask16 even = k.loads[half] & 0x5555;
          if (even == 0) continue;
          float* dst = plane + k.start[half];
          const __m512 sum =
              _mm512_add_ps(_mm512_maskz_loadu_ps(even, dst), _mm512_maskz_permutexvar_ps(even, spread[half], v));
          _mm512_mask_storeu_ps(dst, even, sum);
        }
      }
    }
  }
}
#endif

}  // namespace

// image (C, H, W) -> its block of columns in col (C*kH*kW rows, row stride
// `ld`, Ho*Wo columns), zeros where the window is in the padding.
template <class T>
void im2col(const T* image, const Geometry& g, const Taps& taps, T* col, int64_t ld) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<T, float>) {
    if (masked_rows_apply(g)) return im2col_masked_rows(image, g, taps, col, ld);
    if (strided_rows_apply(g)) return im2col_strided_rows(image, g, taps, col, ld);
  }
#endif
  const auto& p = g.params;
  const int64_t plane_out = g.output_plane(), kernel = static_cast<int64_t>(taps.taps.size());
  if (g.pointwise()) {  // each channel's plane is its row: a copy, not a table lookup per element
    for (int64_t c = 0; c < g.channels; ++c) copy_plane(image + c * plane_out, plane_out, col + c * ld);
    return;
  }
#if defined(__x86_64__)
  if constexpr (std::is_same_v<T, float>) {
    if (register_planes_apply(g, taps)) return im2col_register_planes(image, g, taps, col, ld);
  }
#endif
  for (int64_t c = 0; c < g.channels; ++c) {
    const T* plane = image + c * g.input_plane();
    T* rows_of_c = col + c * kernel * ld;
    if (taps.tabled) {
      for (int64_t t = 0; t < kernel; ++t) {
        const int32_t* source = taps.sources.data() + t * plane_out;
        T* out = rows_of_c + t * ld;
        for (int64_t o = 0; o < plane_out; ++o) out[o] = source[o] >= 0 ? plane[source[o]] : T(0);
      }
      continue;
    }
    for (int64_t t = 0; t < kernel; ++t) {
      const Taps::Tap& tap = taps.taps[t];
      const ValidRange rows = tap.rows, cols = tap.cols;
      T* out = rows_of_c + t * ld;
      // Rows are short (a 14-wide output row is 56 bytes): plain loops, which
      // the compiler vectorises, beat a memset / memmove call per row.
      for (int64_t i = 0; i < rows.first * g.out_w; ++i) out[i] = T(0);
      for (int64_t oh = rows.first; oh < rows.last; ++oh) {
        T* dst = out + oh * g.out_w;
        const T* src = plane + (oh * p.stride[0] + tap.offset_h) * g.width + tap.offset_w;
        for (int64_t ow = 0; ow < cols.first; ++ow) dst[ow] = T(0);
        if (p.stride[1] == 1) {
          for (int64_t ow = cols.first; ow < cols.last; ++ow) dst[ow] = src[ow];
        } else {
          for (int64_t ow = cols.first; ow < cols.last; ++ow) dst[ow] = src[ow * p.stride[1]];
        }
        for (int64_t ow = cols.last; ow < g.out_w; ++ow) dst[ow] = T(0);
      }
      for (int64_t i = rows.last * g.out_w; i < plane_out; ++i) out[i] = T(0);
    }
  }
}

// The adjoint of im2col: image (C, H, W) += fold of its block of col.
template <class T>
void col2im_add(const T* col, int64_t ld, const Geometry& g, const Taps& taps, T* image) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<T, float>) {
    if (strided_rows_apply(g)) return col2im_strided_rows(col, ld, g, taps, image);
  }
#endif
  const auto& p = g.params;
  const int64_t plane_out = g.output_plane(), kernel = static_cast<int64_t>(taps.taps.size());
  for (int64_t c = 0; c < g.channels; ++c) {
    T* plane = image + c * g.input_plane();
    const T* rows_of_c = col + c * kernel * ld;
    if (taps.tabled) {
      for (int64_t t = 0; t < kernel; ++t) {
        const int32_t* source = taps.sources.data() + t * plane_out;
        const T* in = rows_of_c + t * ld;
        for (int64_t o = 0; o < plane_out; ++o) {
          if (source[o] >= 0) plane[source[o]] += in[o];
        }
      }
      continue;
    }
    for (int64_t t = 0; t < kernel; ++t) {
      const Taps::Tap& tap = taps.taps[t];
      const T* in = rows_of_c + t * ld;
      for (int64_t oh = tap.rows.first; oh < tap.rows.last; ++oh) {
        const T* src = in + oh * g.out_w;
        T* dst = plane + (oh * p.stride[0] + tap.offset_h) * g.width + tap.offset_w;
        if (p.stride[1] == 1) {
          for (int64_t ow = tap.cols.first; ow < tap.cols.last; ++ow) dst[ow] += src[ow];
        } else {
          for (int64_t ow = tap.cols.first; ow < tap.cols.last; ++ow) dst[ow * p.stride[1]] += src[ow];
        }
      }
    }
  }
}

template void im2col<float>(const float*, const Geometry&, const Taps&, float*, int64_t);
template void im2col<double>(const double*, const Geometry&, const Taps&, double*, int64_t);
template void col2im_add<float>(const float*, int64_t, const Geometry&, const Taps&, float*);
template void col2im_add<double>(const double*, int64_t, const Geometry&, const Taps&, double*);

}  // namespace loom::ops::cpu::conv2d_detail
