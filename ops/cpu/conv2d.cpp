// CPU kernels of conv2d: im2col / col2im around the CPU GEMM (ops/cpu/gemm.h).
// The batch is split into one range of images per thread; each thread unfolds
// its images into its own column buffer and runs single-threaded GEMMs (gemm
// does not split again inside a parallel region).
#include <loom/ops/conv2d.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <loom/core/parallel.h>
#include <loom/core/profiler.h>
#include <loom/ops/cpu/simd.h>
#include <loom/ops/cpu/conv2d_direct.h>
#include <loom/ops/cpu/gemm.h>
#include <loom/ops/cpu/scratch.h>
#include <loom/ops/cpu/winograd.h>
#include <loom/ops/dispatch.h>

namespace loom::ops::cpu {
namespace {


struct Geometry {
  int64_t batch, channels, height, width;  // input (N, C, H, W)
  int64_t out_channels, kernel_h, kernel_w;
  int64_t out_h, out_w;
  Conv2dParams params;

  int64_t input_plane() const { return height * width; }
  int64_t output_plane() const { return out_h * out_w; }
  int64_t col_rows() const { return channels * kernel_h * kernel_w; }
  // A 1x1 kernel with unit stride and no padding: im2col is the identity, so
  // the image itself is the column matrix.
  bool pointwise() const {
    return kernel_h == 1 && kernel_w == 1 && params.stride == Size2{1, 1} && params.padding == Size2{0, 0};
  }
};

Geometry make_geometry(const Shape& input, const Shape& weight, const Conv2dParams& params) {
  Geometry g{};
  g.batch = input[0];
  g.channels = input[1];
  g.height = input[2];
  g.width = input[3];
  g.out_channels = weight[0];
  g.kernel_h = weight[2];
  g.kernel_w = weight[3];
  Size2 out = conv2d_output_size({g.height, g.width}, {g.kernel_h, g.kernel_w}, params);
  g.out_h = out[0];
  g.out_w = out[1];
  g.params = params;
  return g;
}

// FLOPs of the GEMMs over `rows` column-matrix rows (C x taps) for the whole
// batch; with every tap counted, the direct convolution's (what the profiler
// reports for Winograd too, so GFLOP/s compare).
double conv_flops(const Geometry& g, int64_t rows) {
  return 2.0 * static_cast<double>(g.batch * g.out_channels * rows * g.output_plane());
}

// The direct kernels' description of g (conv2d_direct.h).
direct::Problem direct_problem(const Geometry& g) {
  return {g.batch, g.channels, g.height, g.width, g.out_channels, g.kernel_h, g.kernel_w, g.params.padding[0],
          g.params.padding[1], g.out_h, g.out_w};
}

// The Winograd description of g; kernel 0 (never used) unless the kernel is
// square with unit stride and dilation.
winograd::Problem winograd_problem(const Geometry& g) {
  const bool fits = g.kernel_h == g.kernel_w && g.params.stride == Size2{1, 1} && g.params.dilation == Size2{1, 1};
  return {g.batch, g.channels, g.height, g.width, g.out_channels, fits ? g.kernel_h : 0,
          g.params.padding[0], g.params.padding[1], g.out_h, g.out_w};
}

// Whether an f32 problem runs on the direct kernels (conv2d_direct.h): unit
// stride and dilation, C * kh * kw <= 32.
template <class T>
bool uses_direct(const Geometry& g) {
  if constexpr (std::is_same_v<T, float>) {
    if (g.params.stride != Size2{1, 1} || g.params.dilation != Size2{1, 1}) return false;
    return direct::applies(direct_problem(g));
  } else {
    return false;
  }
}

// The Winograd tile for f32 problems where conv2d uses it, else 0.
template <class T>
int winograd_tile(const Geometry& g) {
  if constexpr (std::is_same_v<T, float>) {
    return winograd::tile_for(winograd_problem(g));
  } else {
    return 0;
  }
}

// For kernel offset `offset` (= k * dilation - padding) along an axis of
// `size` input elements: the output positions [first, last) whose input
// position o * stride + offset falls inside the input.
struct ValidRange {
  int64_t first, last;
};
ValidRange valid_outputs(int64_t offset, int64_t stride, int64_t size, int64_t outputs) {
  const int64_t first = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const int64_t last = size - 1 - offset < 0 ? 0 : (size - 1 - offset) / stride + 1;
  const int64_t clamped_first = std::min(first, outputs);
  return {clamped_first, std::max(clamped_first, std::min(last, outputs))};
}

// The kernel's taps (ki, kj) with the output ranges each one reads inside
// the image, computed once per call instead of once per channel. A tap that
// reads only padding for every output position is left out: its rows of the
// column matrix would be zeros, and its weights get a zero gradient. (ResNet's
// 3x3 convolutions on 1x1 planes keep only the centre tap: 1/9 of the work.)
// Where the output plane is small (ResNet's later stages: 1x1 to 4x4) the
// rows of the column matrix are a few elements long and a per-row loop costs
// more than the copy, so the taps also carry a table: for output position o,
// the input offset within the plane, or -1 in the padding.
struct Taps {
  struct Tap {
    int64_t index;  // ki * kW + kj
    int64_t offset_h, offset_w;
    ValidRange rows, cols;
    // For the masked-row im2col (rows up to 32 wide): -1 where column 0..31 of
    // an output row reads inside the image, else 0.
    int32_t columns_inside[32];
  };
  std::vector<Tap> taps;          // the taps that read the image, in kernel order
  int64_t kernel = 0;             // kH * kW
  std::vector<int32_t> sources;   // taps.size() * Ho * Wo when `tabled`
  bool tabled = false;
  int32_t columns_in_row[32];     // -1 for columns < Wo, else 0

  bool all_active() const { return static_cast<int64_t>(taps.size()) == kernel; }
  // Rows of the column matrix: C * active taps.
  int64_t col_rows(const Geometry& g) const { return g.channels * static_cast<int64_t>(taps.size()); }
};

constexpr int64_t kTabledPlane = 64;

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

// Small planes under padding (ResNet-50's 3x3 convolutions on 2x2 and 4x4
// planes): a tap that reads the image at some output positions reads the
// padding at others, and the column matrix of the whole plane is mostly zeros
// (on a 2x2 plane, 36 (tap, position) pairs of which 16 read the image). The
// output positions are grouped by the set of taps that read inside the image
// there; each class is a GEMM over exactly its taps, so the arithmetic is the
// convolution's own multiply-adds. (A 2x2 plane has four classes of one
// position and four taps each: 2.25x fewer multiply-adds than one GEMM.)
struct PositionClass {
  std::vector<int64_t> taps;       // kernel indices ki * kW + kj of the taps that read the image, in kernel order
  std::vector<int32_t> positions;  // output positions oh * Wo + ow
  std::vector<int32_t> sources;    // (taps, positions): the input element read, an offset within the plane
  int64_t count() const { return static_cast<int64_t>(positions.size()); }
  int64_t col_rows(const Geometry& g) const { return g.channels * static_cast<int64_t>(taps.size()); }
};

// Split when one GEMM over the plane would do this many times the true
// multiply-adds: 2x2 planes (2.25) under a 3x3 kernel with padding 1, not 4x4
// (1.44) or 8x8 (1.19), where the smaller GEMMs (a 4x4 plane's nine classes
// have 1 to 4 positions per image) cost more than the zeros they save:
// ResNet-50 at 32x32 ran faster with 4x4 planes in one GEMM and with 2x2 planes
// split. (Measured:
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md.)
constexpr double kClassSplitWaste = 1.6;

// The position classes of g, or none when one GEMM over the plane is the
// better plan (larger planes, little padding, kernels of over 64 taps).
std::vector<PositionClass> position_classes(const Geometry& g, const Taps& taps) {
  const int64_t plane = g.output_plane(), active = static_cast<int64_t>(taps.taps.size());
  if (!taps.tabled || taps.kernel > 64 || active == 0) return {};
  std::vector<uint64_t> masks(static_cast<size_t>(plane), 0);
  int64_t reads = 0;  // (tap, position) pairs inside the image
  for (int64_t t = 0; t < active; ++t) {
    for (int64_t o = 0; o < plane; ++o) {
      if (taps.sources[t * plane + o] < 0) continue;
      masks[o] |= uint64_t{1} << taps.taps[t].index;
      ++reads;
    }
  }
  if (static_cast<double>(active * plane) < kClassSplitWaste * static_cast<double>(reads)) return {};
  std::vector<PositionClass> classes;
  std::vector<uint64_t> class_masks;
  for (int64_t o = 0; o < plane; ++o) {
    const size_t k = static_cast<size_t>(std::find(class_masks.begin(), class_masks.end(), masks[o]) - class_masks.begin());
    if (k == class_masks.size()) {
      class_masks.push_back(masks[o]);
      classes.emplace_back();
    }
    classes[k].positions.push_back(static_cast<int32_t>(o));
  }
  for (size_t k = 0; k < classes.size(); ++k) {
    PositionClass& pc = classes[k];
    for (int64_t t = 0; t < active; ++t) {
      if ((class_masks[k] >> taps.taps[t].index & 1) == 0) continue;
      pc.taps.push_back(taps.taps[t].index);
      for (int32_t o : pc.positions) pc.sources.push_back(taps.sources[t * plane + o]);
    }
  }
  return classes;
}

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

// std::copy_n for the rows of one plane, which on ResNet-50's small planes
// are 1 to 16 elements: copy_n calls memmove for each, and with 1x1 planes
// (a batch's (N, C) transposed to (C, N) and back) those calls were a large
// part of a 1x1 convolution's time. The sizes of those planes are copied by
// moves of a size known at compile time instead. (Measured:
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md.)
template <class T>
inline void copy_plane(const T* src, int64_t n, T* dst) {
  switch (n) {
    case 1: *dst = *src; return;
    case 4: std::memcpy(dst, src, 4 * sizeof(T)); return;
    case 16: std::memcpy(dst, src, 16 * sizeof(T)); return;
    default: std::copy_n(src, n, dst);
  }
}

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

// Runs fn(i) for the images i of a group, `elements` elements copied for
// each, spread over the thread team outside a parallel region. A group that
// runs alone (BatchPlan::tasks == 1, the rule on ResNet-50's small planes at
// batch 32) splits its GEMM over the threads; the copies around the GEMM
// (im2col, zeroing the input gradient and col2im, gathering and scattering
// planes) would otherwise run on one thread while the others wait.
constexpr int64_t kImageGrainElements = int64_t{1} << 14;  // less is not worth a fork
template <class Fn>
void for_each_image(int64_t images, int64_t elements, Fn&& fn) {
  const int64_t grain = std::max<int64_t>(1, kImageGrainElements / std::max<int64_t>(elements, 1));
  parallel_for(0, images, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) fn(i);
  });
}

// (G, rows, plane) <-> (rows, G * plane): the layout of G images' planes side
// by side, so that one GEMM covers them all.
template <class T>
void gather_planes(const T* batched, int64_t images, int64_t rows, int64_t plane, T* side_by_side) {
  const int64_t ld = images * plane;
  for_each_image(images, rows * plane, [&](int64_t n) {
    for (int64_t r = 0; r < rows; ++r) {
      copy_plane(batched + (n * rows + r) * plane, plane, side_by_side + r * ld + n * plane);
    }
  });
}
// With `add`, side_by_side is added into `batched` instead of copied.
template <class T>
void scatter_planes(const T* side_by_side, int64_t images, int64_t rows, int64_t plane, T* batched, bool add = false) {
  const int64_t ld = images * plane;
  for_each_image(images, rows * plane, [&](int64_t n) {
    for (int64_t r = 0; r < rows; ++r) {
      const T* src = side_by_side + r * ld + n * plane;
      T* dst = batched + (n * rows + r) * plane;
      if (add) {
        for (int64_t i = 0; i < plane; ++i) dst[i] += src[i];
      } else {
        copy_plane(src, plane, dst);
      }
    }
  });
}

// How the batch is cut into GEMMs. A GEMM over one image has Ho*Wo columns:
// 196 for the MNIST ConvNet's second conv, but 1 to 64 in ResNet-50's later
// stages at 32x32 input, where the packing of the weight for every image and
// the ragged tiles cost more than the arithmetic. So `fold` images sit side by
// side in one column matrix (up to kTargetColumns columns). The groups of
// images are spread over the threads when there are enough of them; otherwise
// the groups run one after another and each GEMM splits its rows over the
// threads (the weight, the large operand there, is then packed once).
// With the weight packed once per call (PackedA), forward and the input
// gradient fold only up to kPackedTargetColumns: what a larger fold saves is
// then only ragged tiles, and the gathering of the images' planes and the
// scattering of the results cost more (1x1 convolutions on ResNet's 8x8 and
// 4x4 planes ran faster; measured in
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md). The
// weight gradient keeps the larger fold: its GEMMs sum over the columns, and
// each GEMM reads and writes all of dW again.
struct BatchPlan {
  int64_t fold;    // images per GEMM
  int64_t groups;  // ceil(batch / fold)
  int64_t tasks;   // groups run on `tasks` threads; 1 = in the calling thread
};

constexpr int64_t kTargetColumns = 256;
constexpr int64_t kPackedTargetColumns = 64;
constexpr int64_t kMaxColumnElements = int64_t{1} << 22;  // 16 MiB of f32 per thread

BatchPlan plan_batch(const Geometry& g, int64_t target_columns = kTargetColumns) {
  const int64_t batch = std::max<int64_t>(1, g.batch), plane = std::max<int64_t>(1, g.output_plane());
  // Whole images up to the target: a 196-column plane (the MNIST ConvNet) stays alone.
  int64_t fold = std::clamp<int64_t>(target_columns / plane, 1, batch);
  fold = std::max<int64_t>(1, std::min(fold, kMaxColumnElements / std::max<int64_t>(1, g.col_rows() * plane)));
  int64_t groups = (batch + fold - 1) / fold;
  const int64_t threads = in_parallel_region() ? 1 : get_num_threads();
  if (groups < threads) return {fold, groups, 1};
  // Even out the groups per thread: 3 groups on 2 threads become 4 smaller ones.
  const int64_t per_thread = (groups + threads - 1) / threads;
  fold = (batch + per_thread * threads - 1) / (per_thread * threads);
  groups = (batch + fold - 1) / fold;
  return {fold, groups, threads};
}

// Runs fn(task, first_image, images) for every group, the groups of one task
// in order; tasks run in parallel when the plan says so.
template <class Fn>
void for_each_group(const Geometry& g, const BatchPlan& plan, Fn&& fn) {
  auto run_task = [&](int64_t task) {
    const int64_t first = plan.groups * task / plan.tasks, last = plan.groups * (task + 1) / plan.tasks;
    for (int64_t group = first; group < last; ++group) {
      const int64_t n0 = group * plan.fold;
      if (n0 < g.batch) fn(task, n0, std::min(plan.fold, g.batch - n0));
    }
  };
  if (plan.tasks == 1) {
    run_task(0);
    return;
  }
  parallel_for(0, plan.tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) run_task(task);
  });
}

// conv2d's per-thread scratch (ops/cpu/scratch.h), one buffer per slot.
// The weight-side slots are the calling thread's, filled before the groups
// run and read (or, for the per-task sums, written) by the whole team; the
// group slots are each task's own.
enum class Conv2dSlot {
  // Group slots.
  columns,  // a group's column matrix X (C*taps, G*Ho*Wo), or the input gradient's Wᵀ·dY before col2im
  planes,   // O planes of a group side by side (O, G*Ho*Wo): Y before the scatter, or dY gathered
  // Weight-side slots.
  tap_weight,                // the weight's columns of the active taps, or every position class's W_k
  weight_gradient,           // dW over the active taps before it is spread, or every task's class dW_k sums
  weight_gradient_partials,  // the other tasks' dW sums, added into task 0's in task order
  packed_weight,             // the weight packed once per call for every group's GEMM (PackedA)
  count
};
// What a pass holds at the same time: the forward and the input gradient
// (by classes too) tap_weight and packed_weight with each task's columns and
// planes; the weight gradient weight_gradient and weight_gradient_partials
// with each task's columns and planes.
static_assert(distinct_slots({Conv2dSlot::tap_weight, Conv2dSlot::packed_weight, Conv2dSlot::columns,
                              Conv2dSlot::planes}));
static_assert(distinct_slots({Conv2dSlot::weight_gradient, Conv2dSlot::weight_gradient_partials,
                              Conv2dSlot::columns, Conv2dSlot::planes}));
template <class T>
T* scratch(Conv2dSlot slot, int64_t elements) {
  return thread_scratch<T>(slot, elements);
}

// Calls fn(std::integral_constant<int64_t, N>) with N = count for the tap
// counts of a 3x3 kernel's position classes on ResNet's small planes (1, 2,
// 3, 4, 6), and N = 0 (count known only at run time) otherwise: loops over a
// few taps per weight row then run with the count and the tap indices in
// registers.
template <class Fn>
void with_tap_count(int64_t count, Fn&& fn) {
  switch (count) {
    case 1: return fn(std::integral_constant<int64_t, 1>{});
    case 2: return fn(std::integral_constant<int64_t, 2>{});
    case 3: return fn(std::integral_constant<int64_t, 3>{});
    case 4: return fn(std::integral_constant<int64_t, 4>{});
    case 6: return fn(std::integral_constant<int64_t, 6>{});
    default: return fn(std::integral_constant<int64_t, 0>{});
  }
}

#if defined(__x86_64__)
// gather_taps in f32 under the AVX-512 kernel for taps that fill a register
// every few rows (n taps, 16 / n rows of `kernel` elements spanning at most
// 64: four of a 3x3 kernel, ResNet-50's position classes on 2x2 planes): the
// rows, contiguous in the weight, are loaded whole and one or two permutes
// pick the 16 outputs, contiguous in compact. Element by element this gather
// was a large part of the 3x3 convolution on 2x2 planes. (Measured:
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md.)
bool register_taps_apply(int64_t kernel, int64_t n, int64_t group) {
  if (n <= 0 || 16 % n != 0 || gemm_kernel() != GemmKernel::avx512) return false;
  const int64_t rows = 16 / n;
  return rows * kernel <= 64 && group % rows == 0;
}

// Several gathers of n taps each from the same weight (ResNet-50's four
// position classes on 2x2 planes) are done together: each block of rows is
// loaded once for all of them, so that the weight is read once, not once per
// class (the 3x3 convolution on 2x2 planes ran faster at 1 thread; measured in
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md).
__attribute__((target("avx512f"))) void gather_tap_blocks(const float* weight, int64_t begin, int64_t end,
                                                           int64_t kernel, const int64_t* const* indexes,
                                                           float* const* compacts, int64_t targets, int64_t n,
                                                           int64_t group, int64_t ld) {
  constexpr int64_t kMaxTargets = 16;
  const int64_t block = 16 / n, span = block * kernel;
  __m512i sources[kMaxTargets];
  __mmask16 highs[kMaxTargets];
  for (int64_t t = 0; t < targets; ++t) {
    alignas(64) int32_t lanes[16];
    for (int64_t l = 0; l < 16; ++l) lanes[l] = static_cast<int32_t>((l / n) * kernel + indexes[t][l % n]);
    sources[t] = _mm512_load_si512(lanes);
    highs[t] = _mm512_cmpge_epi32_mask(sources[t], _mm512_set1_epi32(32));
  }
  const auto first = [](int64_t count) {
    return static_cast<__mmask16>(count >= 16 ? 0xFFFF : count <= 0 ? 0 : (1u << count) - 1);
  };
  const __mmask16 m0 = first(span), m1 = first(span - 16), m2 = first(span - 32), m3 = first(span - 48);
  const auto row = [&](int64_t r) {  // one row, element by element
    for (int64_t t = 0; t < targets; ++t) {
      float* out = compacts[t] + (r / group) * ld + (r % group) * n;
      for (int64_t j = 0; j < n; ++j) out[j] = weight[r * kernel + indexes[t][j]];
    }
  };
  int64_t r = begin;
  for (; r < end && r % block != 0; ++r) row(r);
  for (; r + block <= end; r += block) {
    const float* w = weight + r * kernel;
    const __m512 v0 = _mm512_maskz_loadu_ps(m0, w), v1 = _mm512_maskz_loadu_ps(m1, w + 16);
    const __m512 v2 = span > 32 ? _mm512_maskz_loadu_ps(m2, w + 32) : _mm512_setzero_ps();
    const __m512 v3 = span > 32 ? _mm512_maskz_loadu_ps(m3, w + 48) : _mm512_setzero_ps();
    // The block's rows lie in one group (group % block == 0): 16 contiguous outputs.
    const int64_t at = (r / group) * ld + (r % group) * n;
    for (int64_t t = 0; t < targets; ++t) {
      // permutex2var picks by the index's low 5 bits, within (v0, v1) or (v2, v3).
      __m512 v = _mm512_permutex2var_ps(v0, sources[t], v1);
      if (span > 32) v = _mm512_mask_blend_ps(highs[t], v, _mm512_permutex2var_ps(v2, sources[t], v3));
      _mm512_storeu_ps(compacts[t] + at, v);
    }
  }
  for (; r < end; ++r) row(r);
}

// spread_taps likewise, for parts of n taps each as above: a block of 16 / n
// rows of each part is one register, and each 16 outputs of the block's rows
// (contiguous in the full gradient) are the sum of masked permutes of those
// registers. Element by element, this spread was a large part of the 3x3
// convolution on 2x2 planes. (Measured:
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md.)
struct SpreadLanes {
  alignas(64) int32_t index[4][16];  // per output register of a block: lanes of the part's register
  uint16_t mask[4];                  // the output lanes this part has a tap at
};

__attribute__((target("avx512f"))) void spread_tap_blocks(const float* const* parts, const SpreadLanes* lanes,
                                                           int64_t part_count, int64_t n, int64_t begin,
                                                           int64_t end, int64_t kernel, float* full) {
  const int64_t block = 16 / n, span = block * kernel, registers = (span + 15) / 16;
  const auto row = [&](int64_t r) {  // one row, element by element
    for (int64_t k = 0; k < kernel; ++k) {
      float sum = 0.0f;
      for (int64_t p = 0; p < part_count; ++p) {
        // Row r's element k is element k of a block starting at row r.
        if (lanes[p].mask[k / 16] >> (k % 16) & 1) sum += parts[p][r * n + lanes[p].index[k / 16][k % 16]];
      }
      full[r * kernel + k] = sum;
    }
  };
  int64_t r = begin;
  for (; r < end && r % block != 0; ++r) row(r);
  for (; r + block <= end; r += block) {
    __m512 in[16];
    for (int64_t p = 0; p < part_count; ++p) in[p] = _mm512_loadu_ps(parts[p] + r * n);
    float* out = full + r * kernel;
    for (int64_t q = 0; q < registers; ++q) {
      __m512 sum = _mm512_setzero_ps();
      for (int64_t p = 0; p < part_count; ++p) {
        const __m512i index = _mm512_load_si512(lanes[p].index[q]);
        sum = _mm512_add_ps(sum, _mm512_maskz_permutexvar_ps(lanes[p].mask[q], index, in[p]));
      }
      const int64_t left = span - 16 * q;
      if (left >= 16) {
        _mm512_storeu_ps(out + 16 * q, sum);
      } else {
        _mm512_mask_storeu_ps(out + 16 * q, static_cast<__mmask16>((1u << left) - 1), sum);
      }
    }
  }
  for (; r < end; ++r) row(r);
}
#endif

// The weight's columns of some taps, for `rows` rows of `kernel` taps
// (rows = O*C): compact[r * n + j] = weight[r * kernel + index[j]], j < n.
// With `group` > 0, each group of `group` rows (one output channel's C) is
// stored `ld` apart instead: compact[(r / group) * ld + (r % group) * n + j].
// Rows split over the threads (ResNet-50's layer4 weights are 9 MiB).
constexpr int64_t kTapRowGrain = 4096;
template <class T>
void gather_taps(const T* weight, int64_t rows, int64_t kernel, const int64_t* index, int64_t n, T* compact,
                 int64_t group = 0, int64_t ld = 0) {
  if (group <= 0) group = rows, ld = rows * n;
#if defined(__x86_64__)
  if constexpr (std::is_same_v<T, float>) {
    if (register_taps_apply(kernel, n, group)) {
      parallel_for(0, rows, kTapRowGrain, [&](int64_t begin, int64_t end) {
        gather_tap_blocks(weight, begin, end, kernel, &index, &compact, 1, n, group, ld);
      });
      return;
    }
  }
#endif
  with_tap_count(n, [&](auto fixed) {
    constexpr int64_t N = decltype(fixed)::value;
    parallel_for(0, rows, kTapRowGrain, [&](int64_t begin, int64_t end) {
      // Row r = o * group + c goes to compact + o * ld + c * n; one group's
      // rows at a time, contiguous there.
      for (int64_t r = begin; r < end;) {
        const int64_t stop = std::min(end, r + group - r % group);
        T* out = compact + (r / group) * ld + (r % group) * n;
        if constexpr (N > 0) {
          int64_t taps[N];
          std::copy_n(index, N, taps);
          for (; r < stop; ++r, out += N) {
            for (int64_t j = 0; j < N; ++j) out[j] = weight[r * kernel + taps[j]];
          }
        } else {
          for (; r < stop; ++r, out += n) {
            for (int64_t j = 0; j < n; ++j) out[j] = weight[r * kernel + index[j]];
          }
        }
      }
    });
  });
}

// The adjoint of gather_taps, added: full[r * kernel + index[j]] += compact[r * n + j].
template <class T>
void add_taps(const T* compact, int64_t rows, int64_t kernel, const int64_t* index, int64_t n, T* full) {
  with_tap_count(n, [&](auto fixed) {
    constexpr int64_t N = decltype(fixed)::value;
    if constexpr (N > 0) {
      int64_t taps[N];
      std::copy_n(index, N, taps);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < N; ++j) full[r * kernel + taps[j]] += compact[r * N + j];
      }
    } else {
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < n; ++j) full[r * kernel + index[j]] += compact[r * n + j];
      }
    }
  });
}

// A weight gradient over a subset of the taps: (rows, index->size()).
template <class T>
struct CompactGrad {
  const T* values;
  const std::vector<int64_t>* index;  // the taps, in kernel order
};

// The full weight gradient (O*C rows of `kernel` taps) from compact ones over
// tap subsets: zero where no subset has the tap, else the sum of theirs. Block
// by block of rows, so that each block is zeroed and added to while it is in
// the cache (one pass over the full gradient, not a memset and then a scatter).
template <class T>
void spread_taps(const std::vector<CompactGrad<T>>& parts, int64_t rows, int64_t kernel, T* full) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<T, float>) {
    const int64_t n = parts.empty() ? 0 : static_cast<int64_t>(parts[0].index->size());
    const bool same_n = std::all_of(parts.begin(), parts.end(), [&](const CompactGrad<T>& part) {
      return static_cast<int64_t>(part.index->size()) == n;
    });
    if (same_n && parts.size() <= 16 && register_taps_apply(kernel, n, rows)) {
      // Output lane l of a block's register q is element e = 16 q + l of its
      // rows: row e / kernel, tap e % kernel, found in a part at row * n + j.
      const int64_t block = 16 / n;
      std::vector<SpreadLanes> lanes(parts.size());
      std::vector<const float*> values;
      for (size_t p = 0; p < parts.size(); ++p) {
        values.push_back(parts[p].values);
        for (int64_t q = 0; q < 4; ++q) {
          int32_t* index = lanes[p].index[q];
          std::fill_n(index, 16, 0);
          unsigned mask = 0;
          for (int64_t l = 0; l < 16; ++l) {
            const int64_t e = 16 * q + l;
            if (e >= block * kernel) continue;
            const std::vector<int64_t>& taps = *parts[p].index;
            const auto at = std::find(taps.begin(), taps.end(), e % kernel);
            if (at == taps.end()) continue;
            index[l] = static_cast<int32_t>((e / kernel) * n + (at - taps.begin()));
            mask |= 1u << l;
          }
          lanes[p].mask[q] = static_cast<uint16_t>(mask);
        }
      }
      parallel_for(0, rows, kTapRowGrain, [&](int64_t begin, int64_t end) {
        spread_tap_blocks(values.data(), lanes.data(), static_cast<int64_t>(parts.size()), n, begin, end, kernel,
                          full);
      });
      return;
    }
  }
#endif
  constexpr int64_t kBlockRows = 512;
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  parallel_for(0, blocks, kTapRowGrain / kBlockRows, [&](int64_t begin, int64_t end) {
    for (int64_t r0 = begin * kBlockRows; r0 < std::min(rows, end * kBlockRows); r0 += kBlockRows) {
      const int64_t block = std::min(kBlockRows, rows - r0);
      std::fill_n(full + r0 * kernel, block * kernel, T(0));
      for (const CompactGrad<T>& part : parts) {
        const int64_t n = static_cast<int64_t>(part.index->size());
        add_taps(part.values + r0 * n, block, kernel, part.index->data(), n, full + r0 * kernel);
      }
    }
  });
}

// The kernel indices of the active taps.
std::vector<int64_t> active_indices(const Taps& taps) {
  std::vector<int64_t> index;
  for (const Taps::Tap& tap : taps.taps) index.push_back(tap.index);
  return index;
}

// The weight's columns for the active taps: (O, C*kH*kW) -> (O, C*active).
template <class T>
const T* active_weight(const T* weight, const Geometry& g, const Taps& taps) {
  if (taps.all_active()) return weight;
  const std::vector<int64_t> index = active_indices(taps);
  const int64_t active = static_cast<int64_t>(index.size());
  T* compact = scratch<T>(Conv2dSlot::tap_weight, g.out_channels * g.channels * active);
  gather_taps(weight, g.out_channels * g.channels, taps.kernel, index.data(), active, compact);
  return compact;
}

// A column matrix and its row stride.
template <class T>
struct Columns {
  const T* data;
  int64_t ld;
};

// Storage for the weight (m x k as the GEMMs read it), packed once for the
// groups' GEMMs (PackedA) when the batch falls into several; none when one
// GEMM covers the whole batch. That GEMM packs the weight block by block as
// it goes, in its cache, where packing it beforehand would be one more pass
// through memory over the weight: ResNet-50's layer3-4 convolutions on 1x1 and
// 2x2 planes ran faster so. (Measured:
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md.)
template <class T>
T* weight_packing(const Geometry& g, int64_t m, int64_t k) {
  if (plan_batch(g, kPackedTargetColumns).groups == 1) return nullptr;
  return scratch<T>(Conv2dSlot::packed_weight, PackedA<T>::storage_size(m, k));
}

// The column matrix of images n0 .. n0+images (C*active, images*Ho*Wo):
// im2col into the columns slot, or, for one image under a pointwise kernel, the
// image itself. Built here, its rows are gemm_b_stride apart, so that the
// forward GEMM reads it where it lies instead of packing a copy (faster on
// ResNet-50's stride-2 convolutions in one set of runs, within noise in a later
// one; measured in
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md).
template <class T>
Columns<T> group_columns(const T* input, const Geometry& g, const Taps& taps, int64_t n0, int64_t images) {
  const int64_t image_size = g.channels * g.input_plane(), plane = g.output_plane(), columns = images * plane;
  if (images == 1 && g.pointwise()) return {input + n0 * image_size, plane};
  const int64_t ld = gemm_b_stride(columns);
  T* buffer = scratch<T>(Conv2dSlot::columns, taps.col_rows(g) * ld);
  for_each_image(images, taps.col_rows(g) * plane,
                 [&](int64_t i) { im2col(input + (n0 + i) * image_size, g, taps, buffer + i * plane, ld); });
  return {buffer, ld};
}

// dY of images n0 .. n0+images as (O, images*Ho*Wo): gathered into the planes
// slot, or in place for one image.
template <class T>
const T* group_grad_output(const T* grad_output, const Geometry& g, int64_t n0, int64_t images) {
  const int64_t plane = g.output_plane();
  const T* dy = grad_output + n0 * g.out_channels * plane;
  if (images == 1) return dy;
  T* buffer = scratch<T>(Conv2dSlot::planes, g.out_channels * images * plane);
  gather_planes(dy, images, g.out_channels, plane, buffer);
  return buffer;
}

// The position classes' GEMMs. Class k of images n0 .. n0+images has
// columns (image, position) = images * count, rows (channel, tap) = C * taps:
//   forward      Y_k (O, cols)   = W_k (O, C*taps) · X_k (C*taps, cols)
//   input grad   D_k (C*taps, cols) = W_kᵀ · dY_k,  folded back into dX
//   weight grad  dW_k (O, C*taps) += dY_k · X_kᵀ,  spread into dW at the end
// where W_k is the weight's columns of class k's taps.

// W_k for every class, one after another in the tap_weight slot, its rows
// `ld` apart (the weight itself, rows C*kernel apart, for a class with every
// tap of the kernel). The rows are padded as gemm_b_stride pads B's: the
// input gradient reads W_kᵀ eight floats from each of its O rows in turn
// (packing it, or in place), and rows a large power of two apart (C*taps =
// 1024 for ResNet-50's layer3) fall into a few sets of L1 and evict each
// other.
template <class T>
struct ClassWeight {
  const T* data;
  int64_t ld;
};

template <class T>
std::vector<ClassWeight<T>> class_weights(const T* weight, const Geometry& g,
                                          const std::vector<PositionClass>& classes) {
  const int64_t kernel = g.kernel_h * g.kernel_w;
  int64_t total = 0;
  for (const PositionClass& pc : classes) total += g.out_channels * gemm_b_stride(pc.col_rows(g));
  T* compact = scratch<T>(Conv2dSlot::tap_weight, total);
  std::vector<ClassWeight<T>> out;
  std::vector<const PositionClass*> gathered;
  std::vector<T*> targets;
  for (const PositionClass& pc : classes) {
    if (static_cast<int64_t>(pc.taps.size()) == kernel) {
      out.push_back({weight, pc.col_rows(g)});
      continue;
    }
    const int64_t ld = gemm_b_stride(pc.col_rows(g));
    out.push_back({compact, ld});
    gathered.push_back(&pc);
    targets.push_back(compact);
    compact += g.out_channels * ld;
  }
  const int64_t rows = g.out_channels * g.channels;
#if defined(__x86_64__)
  // Classes with as many taps each (the four corners of a 2x2 plane): one pass over the weight for all.
  if constexpr (std::is_same_v<T, float>) {
    const int64_t n = gathered.empty() ? 0 : static_cast<int64_t>(gathered[0]->taps.size());
    const bool same_n = std::all_of(gathered.begin(), gathered.end(), [&](const PositionClass* pc) {
      return static_cast<int64_t>(pc->taps.size()) == n;
    });
    if (gathered.size() > 1 && gathered.size() <= 16 && same_n && register_taps_apply(kernel, n, g.channels)) {
      std::vector<const int64_t*> indexes;
      for (const PositionClass* pc : gathered) indexes.push_back(pc->taps.data());
      const int64_t ld = gemm_b_stride(gathered[0]->col_rows(g));
      parallel_for(0, rows, kTapRowGrain, [&](int64_t begin, int64_t end) {
        gather_tap_blocks(weight, begin, end, kernel, indexes.data(), targets.data(),
                          static_cast<int64_t>(targets.size()), n, g.channels, ld);
      });
      return out;
    }
  }
#endif
  for (size_t k = 0; k < gathered.size(); ++k) {
    const PositionClass& pc = *gathered[k];
    gather_taps(weight, rows, kernel, pc.taps.data(), static_cast<int64_t>(pc.taps.size()), targets[k], g.channels,
                gemm_b_stride(pc.col_rows(g)));
  }
  return out;
}

// X_k of `images` images from `input` (their first): (C*taps, images*count).
template <class T>
void class_im2col(const T* input, int64_t images, const Geometry& g, const PositionClass& pc, T* col) {
  const int64_t count = pc.count(), taps = static_cast<int64_t>(pc.taps.size()), columns = images * count;
  for_each_image(images, pc.col_rows(g) * count, [&](int64_t i) {
    for (int64_t c = 0; c < g.channels; ++c) {
      const T* plane = input + (i * g.channels + c) * g.input_plane();
      for (int64_t j = 0; j < taps; ++j) {
        const int32_t* source = pc.sources.data() + j * count;
        T* out = col + (c * taps + j) * columns + i * count;
        for (int64_t p = 0; p < count; ++p) out[p] = plane[source[p]];
      }
    }
  });
}

// The adjoint of class_im2col: dx (images, C, H, W) += fold of col.
template <class T>
void class_col2im_add(const T* col, int64_t images, const Geometry& g, const PositionClass& pc, T* dx) {
  const int64_t count = pc.count(), taps = static_cast<int64_t>(pc.taps.size()), columns = images * count;
  for_each_image(images, pc.col_rows(g) * count, [&](int64_t i) {
    for (int64_t c = 0; c < g.channels; ++c) {
      T* plane = dx + (i * g.channels + c) * g.input_plane();
      for (int64_t j = 0; j < taps; ++j) {
        const int32_t* source = pc.sources.data() + j * count;
        const T* in = col + (c * taps + j) * columns + i * count;
        for (int64_t p = 0; p < count; ++p) plane[source[p]] += in[p];
      }
    }
  });
}

// dY_k: the class's positions of `images` output images, (O, images*count).
template <class T>
void class_gather(const T* images_out, int64_t images, const Geometry& g, const PositionClass& pc, T* out) {
  const int64_t count = pc.count(), columns = images * count, plane = g.output_plane();
  for_each_image(images, g.out_channels * count, [&](int64_t i) {
    for (int64_t o = 0; o < g.out_channels; ++o) {
      const T* src = images_out + (i * g.out_channels + o) * plane;
      T* dst = out + o * columns + i * count;
      for (int64_t p = 0; p < count; ++p) dst[p] = src[pc.positions[p]];
    }
  });
}

// The GEMMs' FLOPs over the batch: the convolution's true multiply-adds.
double class_flops(const Geometry& g, const std::vector<PositionClass>& classes) {
  int64_t reads = 0;
  for (const PositionClass& pc : classes) reads += pc.col_rows(g) * pc.count();
  return 2.0 * static_cast<double>(g.batch * g.out_channels * reads);
}

template <class T>
void forward_by_class(const T* input, const T* weight, const T* bias, const Geometry& g,
                      const std::vector<PositionClass>& classes, T* output) {
  const int64_t plane = g.output_plane(), image_in = g.channels * g.input_plane(), image_out = g.out_channels * plane;
  const std::vector<ClassWeight<T>> weights = class_weights(weight, g, classes);
  profiler::add_flops(class_flops(g, classes));
  for_each_group(g, plan_batch(g), [&](int64_t, int64_t n0, int64_t images) {
    T* out = output + n0 * image_out;
    for (size_t k = 0; k < classes.size(); ++k) {
      const PositionClass& pc = classes[k];
      const int64_t count = pc.count(), columns = images * count, rows = pc.col_rows(g);
      T* y = scratch<T>(Conv2dSlot::planes, g.out_channels * columns);
      if (rows > 0) {
        T* col = scratch<T>(Conv2dSlot::columns, rows * columns);
        class_im2col(input + n0 * image_in, images, g, pc, col);
        gemm(Transpose::no, Transpose::no, g.out_channels, columns, rows, T(1), weights[k].data, weights[k].ld, col,
             columns, T(0), y, columns);
      } else {
        std::fill(y, y + g.out_channels * columns, T(0));  // every tap in the padding
      }
      for_each_image(images, g.out_channels * count, [&](int64_t i) {
        for (int64_t o = 0; o < g.out_channels; ++o) {
          const T b = bias != nullptr ? bias[o] : T(0);
          const T* src = y + o * columns + i * count;
          T* dst = out + i * image_out + o * plane;
          for (int64_t p = 0; p < count; ++p) dst[pc.positions[p]] = src[p] + b;
        }
      });
    }
  });
}

// With `add`, grad_input holds a gradient that this one is added to.
template <class T>
void backward_input_by_class(const T* grad_output, const T* weight, const Geometry& g,
                             const std::vector<PositionClass>& classes, T* grad_input, bool add) {
  const int64_t image_in = g.channels * g.input_plane(), image_out = g.out_channels * g.output_plane();
  const std::vector<ClassWeight<T>> weights = class_weights(weight, g, classes);
  profiler::add_flops(class_flops(g, classes));
  for_each_group(g, plan_batch(g), [&](int64_t, int64_t n0, int64_t images) {
    T* dx = grad_input + n0 * image_in;
    if (!add) for_each_image(images, image_in, [&](int64_t i) { std::fill_n(dx + i * image_in, image_in, T(0)); });
    for (size_t k = 0; k < classes.size(); ++k) {
      const PositionClass& pc = classes[k];
      const int64_t columns = images * pc.count(), rows = pc.col_rows(g);
      if (rows == 0) continue;
      T* dy = scratch<T>(Conv2dSlot::planes, g.out_channels * columns);
      class_gather(grad_output + n0 * image_out, images, g, pc, dy);
      T* col = scratch<T>(Conv2dSlot::columns, rows * columns);
      gemm(Transpose::yes, Transpose::no, rows, columns, g.out_channels, T(1), weights[k].data, weights[k].ld, dy,
           columns, T(0), col, columns);
      class_col2im_add(col, images, g, pc, dx);
    }
  });
}

template <class T>
void backward_weight_by_class(const T* grad_output, const T* input, const Geometry& g,
                              const std::vector<PositionClass>& classes, T* grad_weight) {
  const int64_t image_in = g.channels * g.input_plane(), image_out = g.out_channels * g.output_plane();
  const int64_t kernel = g.kernel_h * g.kernel_w;
  const BatchPlan plan = plan_batch(g);
  // Each task accumulates every class's dW_k, one after another; task 0's are
  // then the sum of all (added in task order: the same sum whatever the timing).
  std::vector<int64_t> offsets;
  int64_t size = 0;
  for (const PositionClass& pc : classes) {
    offsets.push_back(size);
    size += g.out_channels * pc.col_rows(g);
  }
  T* accumulators = scratch<T>(Conv2dSlot::weight_gradient, plan.tasks * size);
  // A task's first GEMM of a class overwrites its accumulator (beta 0); the
  // accumulators of a task without images are zeroed afterwards.
  std::vector<char> started(static_cast<size_t>(plan.tasks), 0);
  profiler::add_flops(class_flops(g, classes));
  for_each_group(g, plan, [&](int64_t task, int64_t n0, int64_t images) {
    for (size_t k = 0; k < classes.size(); ++k) {
      const PositionClass& pc = classes[k];
      const int64_t columns = images * pc.count(), rows = pc.col_rows(g);
      if (rows == 0) continue;
      T* col = scratch<T>(Conv2dSlot::columns, rows * columns);
      class_im2col(input + n0 * image_in, images, g, pc, col);
      T* dy = scratch<T>(Conv2dSlot::planes, g.out_channels * columns);
      class_gather(grad_output + n0 * image_out, images, g, pc, dy);
      gemm(Transpose::no, Transpose::yes, g.out_channels, rows, columns, T(1), dy, columns, col, columns,
           started[task] ? T(1) : T(0), accumulators + task * size + offsets[k], rows);
    }
    started[task] = 1;
  });
  sum_task_partials(accumulators, accumulators + size, started, size);
  std::vector<CompactGrad<T>> parts;
  for (size_t k = 0; k < classes.size(); ++k) parts.push_back({accumulators + offsets[k], &classes[k].taps});
  spread_taps(parts, g.out_channels * g.channels, kernel, grad_weight);
}

template <class T>
void forward(const T* input, const T* weight, const T* bias, const Geometry& g, T* output) {
  const int64_t plane = g.output_plane(), output_size = g.out_channels * plane;
  if (const int m = winograd_tile<T>(g)) {
    profiler::add_flops(conv_flops(g, g.col_rows()));
    if constexpr (std::is_same_v<T, float>) winograd::forward(input, weight, bias, winograd_problem(g), m, output);
    return;
  }
  if (uses_direct<T>(g)) {
    profiler::add_flops(conv_flops(g, g.col_rows()));
    if constexpr (std::is_same_v<T, float>) direct::forward(input, weight, bias, direct_problem(g), output);
    return;
  }
  const Taps taps = make_taps(g);
  if (const std::vector<PositionClass> classes = position_classes(g, taps); !classes.empty()) {
    return forward_by_class(input, weight, bias, g, classes, output);
  }
  const int64_t k = taps.col_rows(g);
  weight = active_weight(weight, g, taps);  // (O, C*active)
  profiler::add_flops(conv_flops(g, k));
  const PackedA<T> packed_weight(Transpose::no, g.out_channels, k, weight, k, weight_packing<T>(g, g.out_channels, k));
  const int64_t target = packed_weight.packed != nullptr ? kPackedTargetColumns : kTargetColumns;
  for_each_group(g, plan_batch(g, target), [&](int64_t, int64_t n0, int64_t images) {
    const int64_t columns = images * plane;
    const Columns<T> col = group_columns(input, g, taps, n0, images);
    // One image writes straight into the output; several go through (O, G*Ho*Wo).
    T* y = images == 1 ? output + n0 * output_size : scratch<T>(Conv2dSlot::planes, g.out_channels * columns);
    if (bias != nullptr) {
      for (int64_t o = 0; o < g.out_channels; ++o) std::fill(y + o * columns, y + (o + 1) * columns, bias[o]);
    }
    gemm(packed_weight, Transpose::no, columns, T(1), col.data, col.ld, bias != nullptr ? T(1) : T(0), y, columns);
    if (images > 1) scatter_planes(y, images, g.out_channels, plane, output + n0 * output_size);
  });
}

// With `add`, grad_input holds a gradient that this one is added to (never
// under Winograd: the caller checks winograd_tile).
template <class T>
void backward_input(const T* grad_output, const T* weight, const Geometry& g, T* grad_input, bool add) {
  const int64_t plane = g.output_plane(), image_size = g.channels * g.input_plane();
  if (const int m = winograd_tile<T>(g)) {
    LOOM_CHECK(!add, "conv2d backward: Winograd does not add into an input gradient");
    profiler::add_flops(conv_flops(g, g.col_rows()));
    if constexpr (std::is_same_v<T, float>) winograd::backward_input(grad_output, weight, winograd_problem(g), m, grad_input);
    return;
  }
  const Taps taps = make_taps(g);
  if (const std::vector<PositionClass> classes = position_classes(g, taps); !classes.empty()) {
    return backward_input_by_class(grad_output, weight, g, classes, grad_input, add);
  }
  const int64_t k = taps.col_rows(g);
  weight = active_weight(weight, g, taps);  // (O, C*active)
  profiler::add_flops(conv_flops(g, k));
  // Wᵀ.
  const PackedA<T> packed_weight(Transpose::yes, k, g.out_channels, weight, k, weight_packing<T>(g, k, g.out_channels));
  const int64_t target = packed_weight.packed != nullptr ? kPackedTargetColumns : kTargetColumns;
  for_each_group(g, plan_batch(g, target), [&](int64_t, int64_t n0, int64_t images) {
    const int64_t columns = images * plane;
    const T* dy = group_grad_output(grad_output, g, n0, images);  // (O, G*Ho*Wo)
    T* dx = grad_input + n0 * image_size;
    // col = Wᵀ · dY: (C*active, G*Ho*Wo); one pointwise image is its own
    // gradient (added to dx by the GEMM's beta).
    const bool direct = images == 1 && g.pointwise();
    T* col = direct ? dx : scratch<T>(Conv2dSlot::columns, k * columns);
    gemm(packed_weight, Transpose::no, columns, T(1), dy, columns, direct && add ? T(1) : T(0), col, columns);
    if (direct) return;
    if (g.pointwise()) return scatter_planes(col, images, g.channels, plane, dx, add);  // col2im is a copy
    if (!add) {
      for_each_image(images, image_size, [&](int64_t i) { std::fill_n(dx + i * image_size, image_size, T(0)); });
    }
    for_each_image(images, k * plane,
                   [&](int64_t i) { col2im_add(col + i * plane, columns, g, taps, dx + i * image_size); });
  });
}

template <class T>
void backward_weight(const T* grad_output, const T* input, const Geometry& g, T* full_grad_weight) {
  const int64_t plane = g.output_plane();
  if (const int m = winograd_tile<T>(g)) {
    profiler::add_flops(conv_flops(g, g.col_rows()));
    if constexpr (std::is_same_v<T, float>) {
      winograd::backward_weight(grad_output, input, winograd_problem(g), m, full_grad_weight);
    }
    return;
  }
  if (uses_direct<T>(g)) {
    profiler::add_flops(conv_flops(g, g.col_rows()));
    if constexpr (std::is_same_v<T, float>) {
      direct::backward_weight(grad_output, input, direct_problem(g), full_grad_weight);
    }
    return;
  }
  const Taps taps = make_taps(g);
  if (const std::vector<PositionClass> classes = position_classes(g, taps); !classes.empty()) {
    return backward_weight_by_class(grad_output, input, g, classes, full_grad_weight);
  }
  const BatchPlan plan = plan_batch(g);
  const int64_t k = taps.col_rows(g);
  // With taps left out, the GEMMs produce (O, C*active), spread out at the end.
  T* grad_weight = taps.all_active() ? full_grad_weight : scratch<T>(Conv2dSlot::weight_gradient, g.out_channels * k);
  profiler::add_flops(conv_flops(g, k));
  // Task 0 accumulates into grad_weight itself, the others into partials that
  // are added afterwards in task order (the same sum whatever the timing).
  const int64_t size = g.out_channels * k;
  T* partials = scratch<T>(Conv2dSlot::weight_gradient_partials, (plan.tasks - 1) * size);
  std::vector<char> started(static_cast<size_t>(plan.tasks), 0);
  for_each_group(g, plan, [&](int64_t task, int64_t n0, int64_t images) {
    T* accumulator = task == 0 ? grad_weight : partials + (task - 1) * size;
    const int64_t columns = images * plane;
    const Columns<T> col = group_columns(input, g, taps, n0, images);
    const T* dy = group_grad_output(grad_output, g, n0, images);
    // dW (+)= dY · colᵀ: (O, C*active)
    gemm(Transpose::no, Transpose::yes, g.out_channels, k, columns, T(1), dy, columns, col.data, col.ld,
         started[task] ? T(1) : T(0), accumulator, k);
    started[task] = 1;
  });
  sum_task_partials(grad_weight, partials, started, size);
  if (taps.all_active()) return;
  const std::vector<int64_t> index = active_indices(taps);
  spread_taps<T>({{grad_weight, &index}}, g.out_channels * g.channels, taps.kernel, full_grad_weight);
}

}  // namespace

Tensor conv2d_forward(const Tensor& input_in, const Tensor& weight_in, const Tensor& bias_in,
                      const Conv2dParams& params) {
  const Tensor input = cpu_compute_input(input_in), weight = cpu_compute_input(weight_in);
  const Tensor bias = bias_in.defined() ? cpu_compute_input(bias_in) : Tensor();
  const Geometry g = make_geometry(input.sizes(), weight.sizes(), params);
  Tensor out = Tensor::empty({g.batch, g.out_channels, g.out_h, g.out_w}, input.dtype());
  visit_compute_dtype(input.dtype(), "conv2d", [&]<class T>() {
    forward(input.data<T>(), weight.data<T>(), bias.defined() ? bias.data<T>() : nullptr, g, out.data<T>());
  });
  return out.to(input_in.dtype());
}

Tensor conv2d_backward_input(const Tensor& grad_output_in, const Tensor& weight_in, const Shape& input_sizes,
                             const Conv2dParams& params, const Tensor& grad_input_sum) {
  const Tensor grad_output = cpu_compute_input(grad_output_in), weight = cpu_compute_input(weight_in);
  const Geometry g = make_geometry(input_sizes, weight.sizes(), params);
  // Added into the sum where it is in the compute dtype and conv2d is not
  // Winograd (whose planes are written, not added to).
  const DType dtype = grad_output.dtype();
  const bool add = grad_output_in.dtype() == dtype && fits_result(grad_input_sum, input_sizes, dtype, Device::cpu()) &&
                   !(dtype == DType::f32 && winograd_tile<float>(g) != 0);
  Tensor grad_input = add ? grad_input_sum : Tensor::empty(input_sizes, dtype);
  visit_compute_dtype(dtype, "conv2d backward", [&]<class T>() {
    backward_input(grad_output.data<T>(), weight.data<T>(), g, grad_input.data<T>(), add);
  });
  return grad_input.to(grad_output_in.dtype());
}

Tensor conv2d_backward_weight(const Tensor& grad_output_in, const Tensor& input_in, const Shape& weight_sizes,
                              const Conv2dParams& params, const Tensor& out) {
  const Tensor grad_output = cpu_compute_input(grad_output_in), input = cpu_compute_input(input_in);
  const Geometry g = make_geometry(input.sizes(), weight_sizes, params);
  const bool into_out = fits_result(out, weight_sizes, grad_output_in.dtype(), Device::cpu());
  Tensor grad_weight =
      into_out && out.dtype() == grad_output.dtype() ? out : Tensor::empty(weight_sizes, grad_output.dtype());
  visit_compute_dtype(grad_output.dtype(), "conv2d backward", [&]<class T>() {
    backward_weight(grad_output.data<T>(), input.data<T>(), g, grad_weight.data<T>());
  });
  if (into_out && !grad_weight.is_same(out)) {  // computed in f32 for an f16 / bf16 `out`
    Tensor written = out;
    return written.copy_(grad_weight);
  }
  return grad_weight.to(grad_output_in.dtype());
}

std::pair<Tensor, Tensor> conv2d_backward_input_weight(const Tensor& grad_output, const Tensor& input,
                                                       const Tensor& weight, const Conv2dParams& params,
                                                       const Tensor& weight_out, const Tensor& grad_input_sum) {
  const Geometry g = make_geometry(input.sizes(), weight.sizes(), params);
  const bool f32 = grad_output.dtype() == DType::f32 && input.dtype() == DType::f32 && weight.dtype() == DType::f32;
  const int m = f32 ? winograd_tile<float>(g) : 0;
  if (m == 0) {
    return {conv2d_backward_input(grad_output, weight, input.sizes(), params, grad_input_sum),
            conv2d_backward_weight(grad_output, input, weight.sizes(), params, weight_out)};
  }
  const Tensor dy = cpu_compute_input(grad_output), x = cpu_compute_input(input), w = cpu_compute_input(weight);
  Tensor dx = Tensor::empty(input.sizes(), DType::f32);
  Tensor dw = fits_result(weight_out, weight.sizes(), DType::f32, Device::cpu()) ? weight_out
                                                                                 : Tensor::empty(weight.sizes(), DType::f32);
  // Counted as the two direct convolutions' FLOPs, as when they run apart.
  profiler::add_flops(2 * conv_flops(g, g.col_rows()));
  winograd::backward(dy.data<float>(), x.data<float>(), w.data<float>(), winograd_problem(g), m, dx.data<float>(),
                     dw.data<float>());
  return {dx, dw};
}

Tensor conv2d_backward_bias(const Tensor& grad_output_in) {
  const Tensor grad_output = cpu_compute_input(grad_output_in);
  const int64_t batch = grad_output.size(0), channels = grad_output.size(1);
  const int64_t plane = grad_output.numel() / std::max<int64_t>(1, batch * channels);
  Tensor grad_bias = Tensor::empty({channels}, grad_output.dtype());
  visit_compute_dtype(grad_output.dtype(), "conv2d backward", [&]<class T>() {
    const T* dy = grad_output.data<T>();
    T* db = grad_bias.data<T>();
    parallel_for(0, channels, 4, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) {
        double total = 0;
        for (int64_t n = 0; n < batch; ++n) {
          // Eigen's sum is vectorised (a plain loop is not, without -ffast-math).
          total += static_cast<double>(Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(dy + (n * channels + o) * plane, plane).sum());
        }
        db[o] = static_cast<T>(total);
      }
    });
  });
  return grad_bias.to(grad_output_in.dtype());
}

}  // namespace loom::ops::cpu
