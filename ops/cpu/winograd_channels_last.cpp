// The Winograd channels-last path on the CPU (few channels, AVX-512): the
// chunk's images copied pixel-major, every transform on whole 16-channel
// vectors of one tile, the α² products read in place.
#include <loom/ops/cpu/winograd_internal.h>

#include <algorithm>

namespace loom::ops::cpu::winograd::detail {

// ---- The channels-last path (few channels, AVX-512) ------------------------
//
// With few channels (the ConvNet's conv2: 16 -> 32, 5x5 on 14x14 planes)
// the transforms, not the α² GEMMs, dominate the tile-major path: its rows
// run over a plane row's tiles, 4 of them on 14x14 planes, and the GEMMs are
// too small for packing to pay. Here the chunk's images are first copied channels-last
// (pixel-major, 16 channels per vector), so every transform is whole-vector
// arithmetic on one tile's elements, whatever the plane size, and the buffers
// are tile-major, V[t][ξ][ν][c] and M[t][ξ][ν][o]: a tile's elements are
// contiguous for its transforms, and the α² products read them in place
// (product_tile), with no packing. Channel counts must be multiples of 16.
// GCC only: clang ignores `#pragma GCC target`, and this file's
// functions would be compiled without AVX-512 (a clang build runs the
// tile-major path).
#if LOOM_WINOGRAD_CHANNELS_LAST
namespace {

constexpr int64_t kLanes = 16;
// At most this many channels in or out: beyond, the products dominate and the
// packed GEMMs of the tile-major path run them faster (ResNet's 256-channel
// 3x3 on 8x8 planes ran slower channels-last, 128 on 16x16 faster; measured
// in benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md).
constexpr int64_t kChannelsLastMax = 128;

// The channels-last path's per-thread scratch (ops/cpu/scratch.h), one
// buffer per slot: the chunk slots are each task's own; the weight gradient
// slots the calling thread's, written by the team. (The transformed weight
// is Winograd's transformed_weight slot, gathered c-major.)
enum class ChannelsLastSlot {
  // Chunk slots, all held together.
  padded_planes,  // the chunk's images channels-last, padded: pad[i][y][x][c] (input, output or a gradient)
  input_tiles,    // V[t][ξ][ν][c], or dV
  product,        // M[t][ξ][ν][o], or dM
  // Weight gradient slots, held together with Winograd's weight_taps and
  // weight_half while dU is transformed back.
  weight_gradient_partials,  // dU[e][c][o] per task, summed in task order
  weight_gradient,           // dU[e][o][c], the layout inverse_transform_weight reads
  count
};
static_assert(distinct_slots({ChannelsLastSlot::padded_planes, ChannelsLastSlot::input_tiles,
                              ChannelsLastSlot::product}));
static_assert(distinct_slots({ChannelsLastSlot::weight_gradient_partials, ChannelsLastSlot::weight_gradient}));
float* cl_scratch(ChannelsLastSlot slot, int64_t elements) { return thread_scratch(slot, elements); }

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
// unroll, compiled for this region's target (a lambda of an AVX-512
// function cannot be inlined into the AVX2 one).
template <int N, class Fn>
inline __attribute__((always_inline)) void unroll_avx512(Fn&& fn) {
  [&]<int... I>(std::integer_sequence<int, I...>) { (fn(std::integral_constant<int, I>{}), ...); }
  (std::make_integer_sequence<int, N>{});
}

// fixed_product on 16-float vectors: 16 channels of one tile element at once.
template <class F, Which W, int Out, int In, class Store>
inline __attribute__((always_inline)) void fixed_product_16(const __m512* x, Store&& store) {
  constexpr const float* mat = fixed_matrix<F, W>();
  unroll_avx512<Out>([&](auto i) __attribute__((always_inline)) {
    __m512 sum = _mm512_setzero_ps();
    unroll_avx512<In>([&](auto j) __attribute__((always_inline)) {
      constexpr float c = mat[i * In + j];
      if constexpr (c == 1.0f) {
        sum = _mm512_add_ps(sum, x[j]);
      } else if constexpr (c == -1.0f) {
        sum = _mm512_sub_ps(sum, x[j]);
      } else if constexpr (c != 0.0f) {
        sum = _mm512_fmadd_ps(_mm512_set1_ps(c), x[j], sum);
      }
    });
    store(static_cast<int>(i), sum);
  });
}

// GCC 12 reports the unpack and shuffle intrinsics' own undefined
// pass-through operand as uninitialized (a false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// dst[j * dst_stride + i] = src[i * src_stride + j] + (add ? add[j] : 0) for
// i < rows and j < cols (both at most 16): one block of a channels-first /
// channels-last conversion, transposed in registers.
void transpose_block(const float* src, int64_t src_stride, int rows, int cols, float* dst, int64_t dst_stride,
                     const float* add = nullptr) {
  const auto col_mask = static_cast<__mmask16>((1u << cols) - 1), row_mask = static_cast<__mmask16>((1u << rows) - 1);
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) {
    r[i] = i < rows ? _mm512_maskz_loadu_ps(col_mask, src + i * src_stride) : _mm512_setzero_ps();
  }
  // Pairs of rows interleaved by 32 bits, then by 64: r[4q + k] holds, in
  // each 128-bit lane l, column 4l + k of rows 4q .. 4q+3.
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    for (int k = 0; k < 2; ++k) {
      const __m512d lo = _mm512_castps_pd(t[i + k]), hi = _mm512_castps_pd(t[i + k + 2]);
      r[i + 2 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo, hi));
      r[i + 2 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo, hi));
    }
  }
  // Then the 128-bit lanes: column j from lane j / 4 of r[4q + j % 4], q = 0 .. 3.
  for (int h = 0; h < 16; h += 8) {
    for (int k = 0; k < 4; ++k) {
      t[h + k] = _mm512_shuffle_f32x4(r[h + k], r[h + k + 4], 0x88);
      t[h + k + 4] = _mm512_shuffle_f32x4(r[h + k], r[h + k + 4], 0xdd);
    }
  }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
  }
  for (int j = 0; j < cols; ++j) {
    const __m512 v = add != nullptr ? _mm512_add_ps(r[j], _mm512_set1_ps(add[j])) : r[j];
    _mm512_mask_storeu_ps(dst + j * dst_stride, row_mask, v);
  }
}

#pragma GCC diagnostic pop

// s0 (, s1) += a * b0 (, b1): one row of product_tile.
template <int NV>
inline __attribute__((always_inline)) void fma_row(float a, __m512 b0, __m512 b1, __m512& s0, __m512& s1) {
  const __m512 x = _mm512_set1_ps(a);
  s0 = _mm512_fmadd_ps(x, b0, s0);
  if constexpr (NV == 2) s1 = _mm512_fmadd_ps(x, b1, s1);
}
template <int NV>
inline __attribute__((always_inline)) void store_row(float* c, bool accumulate, __m512 s0, __m512 s1) {
  if (accumulate) s0 = _mm512_add_ps(s0, _mm512_loadu_ps(c));
  _mm512_storeu_ps(c, s0);
  if constexpr (NV == 2) {
    if (accumulate) s1 = _mm512_add_ps(s1, _mm512_loadu_ps(c + 16));
    _mm512_storeu_ps(c + 16, s1);
  }
}

// C (8 x 16·NV, rows ldc apart) = (C +) sum over p < depth of A(r, p) B[p]:
// A(r, p) = a[r * a_row + p * a_col], read in place in any orientation, B's
// rows ldb apart. The accumulators are named variables (see conv2d_direct.cpp).
template <int NV>
void product_tile(int64_t depth, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb,
                  float* c, int64_t ldc, bool accumulate) {
  __m512 s00 = _mm512_setzero_ps(), s01 = s00, s10 = s00, s11 = s00, s20 = s00, s21 = s00, s30 = s00, s31 = s00;
  __m512 s40 = s00, s41 = s00, s50 = s00, s51 = s00, s60 = s00, s61 = s00, s70 = s00, s71 = s00;
  const float *a0 = a, *a1 = a + a_row, *a2 = a + 2 * a_row, *a3 = a + 3 * a_row;
  const float *a4 = a + 4 * a_row, *a5 = a + 5 * a_row, *a6 = a + 6 * a_row, *a7 = a + 7 * a_row;
  for (int64_t p = 0; p < depth; ++p) {
    const int64_t q = p * a_col;
    const __m512 b0 = _mm512_loadu_ps(b + p * ldb), b1 = NV == 2 ? _mm512_loadu_ps(b + p * ldb + 16) : b0;
    fma_row<NV>(a0[q], b0, b1, s00, s01);
    fma_row<NV>(a1[q], b0, b1, s10, s11);
    fma_row<NV>(a2[q], b0, b1, s20, s21);
    fma_row<NV>(a3[q], b0, b1, s30, s31);
    fma_row<NV>(a4[q], b0, b1, s40, s41);
    fma_row<NV>(a5[q], b0, b1, s50, s51);
    fma_row<NV>(a6[q], b0, b1, s60, s61);
    fma_row<NV>(a7[q], b0, b1, s70, s71);
  }
  store_row<NV>(c, accumulate, s00, s01);
  store_row<NV>(c + ldc, accumulate, s10, s11);
  store_row<NV>(c + 2 * ldc, accumulate, s20, s21);
  store_row<NV>(c + 3 * ldc, accumulate, s30, s31);
  store_row<NV>(c + 4 * ldc, accumulate, s40, s41);
  store_row<NV>(c + 5 * ldc, accumulate, s50, s51);
  store_row<NV>(c + 6 * ldc, accumulate, s60, s61);
  store_row<NV>(c + 7 * ldc, accumulate, s70, s71);
}

// C (rows x cols) = (C +) A B as above, rows a multiple of 8 and cols of 16.
void product(int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t a_row, int64_t a_col, const float* b,
             int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  for (int64_t r = 0; r < rows; r += 8) {
    const float* a_rows = a + r * a_row;
    float* c_rows = c + r * ldc;
    int64_t j = 0;
    for (; j + 32 <= cols; j += 32) {
      product_tile<2>(depth, a_rows, a_row, a_col, b + j, ldb, c_rows + j, ldc, accumulate);
    }
    if (j < cols) product_tile<1>(depth, a_rows, a_row, a_col, b + j, ldb, c_rows + j, ldc, accumulate);
  }
}

// The chunk's geometry: tiles padded to a multiple of 8 (product_tile's
// rows; the padding tiles are zero), the padded input copy (the layout of
// input_layout) and the whole-tile output copy, both channels-last.
struct ClChunk {
  int64_t tiles, tiles8, in_rows, in_cols, out_rows, out_cols;
};
ClChunk cl_chunk(const Problem& p, const Transforms& t, const Chunk& k) {
  const Padded in = input_layout(p, t), out = output_layout(p, t);
  return {k.tiles, (k.tiles + 7) / 8 * 8, in.rows, in.cols, out.rows, out.cols};
}

// pad[i][y][x][c] of the chunk's images: channels-first planes (`channels`
// of height x width) copied channels-last at (top, left) of rows x cols, zero elsewhere.
void to_channels_last(const float* planes, int64_t images, int64_t channels, int64_t height, int64_t width,
                      int64_t rows, int64_t cols, int64_t top, int64_t left, float* pad) {
  std::fill(pad, pad + images * rows * cols * channels, 0.0f);
  const int64_t plane = height * width;
  for (int64_t i = 0; i < images; ++i) {
    for (int64_t c0 = 0; c0 < channels; c0 += kLanes) {
      for (int64_t y = 0; y < height; ++y) {
        for (int64_t x0 = 0; x0 < width; x0 += kLanes) {
          transpose_block(planes + ((i * channels + c0) * height + y) * width + x0, plane, kLanes,
                          static_cast<int>(std::min(kLanes, width - x0)),
                          pad + (((i * rows + y + top) * cols + x0 + left) * channels + c0), channels);
        }
      }
    }
  }
}
// The adjoint's copy back: planes from pad[i][top + y][left + x][c], plus add[c] when given.
void to_channels_first(const float* pad, int64_t images, int64_t channels, int64_t height, int64_t width,
                       int64_t rows, int64_t cols, int64_t top, int64_t left, const float* add, float* planes) {
  const int64_t plane = height * width;
  for (int64_t i = 0; i < images; ++i) {
    for (int64_t c0 = 0; c0 < channels; c0 += kLanes) {
      for (int64_t y = 0; y < height; ++y) {
        for (int64_t x0 = 0; x0 < width; x0 += kLanes) {
          transpose_block(pad + (((i * rows + y + top) * cols + x0 + left) * channels + c0), channels,
                          static_cast<int>(std::min(kLanes, width - x0)), kLanes,
                          planes + ((i * channels + c0) * height + y) * width + x0, plane,
                          add != nullptr ? add + c0 : nullptr);
        }
      }
    }
  }
}

// fn(t, i, th, tw): every tile of the chunk, t = i * per_image + th * cols + tw.
template <class Fn>
inline __attribute__((always_inline)) void for_each_tile(const Tiling& tl, int64_t images, Fn&& fn) {
  for (int64_t i = 0, t = 0; i < images; ++i) {
    for (int64_t th = 0; th < tl.rows; ++th) {
      for (int64_t tw = 0; tw < tl.cols; ++tw, ++t) fn(t, i, th, tw);
    }
  }
}

// One tile's 2-D transform, 16 channels from c0 on: out = W x Wᵀ for
// transform W of F (Out x In), with x[r][s] at in + (r * in_row + s) *
// channels (In x In) and out[i][j] at out + (i * out_row + j) * channels
// (Out x Out), stored or, with Add, added to what is there. Rows of x first
// (s -> j), then its columns (r -> i).
template <class F, Which W, int Out, int In, bool Add>
inline __attribute__((always_inline)) void tile_transform_16(const float* in, int64_t in_row, float* out,
                                                             int64_t out_row, int64_t channels, int64_t c0) {
  __m512 half[In * Out], x[In];
  for (int r = 0; r < In; ++r) {
    for (int s = 0; s < In; ++s) x[s] = _mm512_loadu_ps(in + (r * in_row + s) * channels + c0);
    fixed_product_16<F, W, Out, In>(x, [&](int j, __m512 sum) { half[r * Out + j] = sum; });
  }
  for (int j = 0; j < Out; ++j) {
    for (int r = 0; r < In; ++r) x[r] = half[r * Out + j];
    fixed_product_16<F, W, Out, In>(x, [&](int i, __m512 sum) {
      float* at = out + (i * out_row + j) * channels + c0;
      if constexpr (Add) sum = _mm512_add_ps(_mm512_loadu_ps(at), sum);
      _mm512_storeu_ps(at, sum);
    });
  }
}

// Every tile of a padded copy (planes of rows x cols, channels last) through
// W's transform into its slot t of `tiles` (A x A per channel): V = Bᵀ d B of
// the input's tiles d (W = bt, Rows = A), dM = A dY Aᵀ of the output
// gradient's tiles dY (W = a, Rows = M).
template <class F, Which W, int M, int A, int Rows>
void transform_from_copy(const float* pad, int64_t rows, int64_t cols, const Tiling& tl, int64_t images,
                         int64_t channels, float* tiles) {
  for_each_tile(tl, images, [&](int64_t t, int64_t i, int64_t th, int64_t tw) {
    const float* tile = pad + ((i * rows + th * M) * cols + tw * M) * channels;
    for (int64_t c0 = 0; c0 < channels; c0 += kLanes) {
      tile_transform_16<F, W, A, Rows, false>(tile, cols, tiles + t * A * A * channels, A, channels, c0);
    }
  });
}

// The reverse: every tile's slot t of `tiles` through W's transform into its
// place in the padded copy: the output's Aᵀ M A (W = at, Rows = M), written;
// the input gradient's B dV Bᵀ (W = b, Rows = A, Add), added, since the
// input's tiles overlap.
template <class F, Which W, int M, int A, int Rows, bool Add>
void transform_into_copy(const float* tiles, int64_t rows, int64_t cols, const Tiling& tl, int64_t images,
                         int64_t channels, float* pad) {
  for_each_tile(tl, images, [&](int64_t t, int64_t i, int64_t th, int64_t tw) {
    float* tile = pad + ((i * rows + th * M) * cols + tw * M) * channels;
    for (int64_t c0 = 0; c0 < channels; c0 += kLanes) {
      tile_transform_16<F, W, Rows, A, Add>(tiles + t * A * A * channels, A, tile, cols, channels, c0);
    }
  });
}
#pragma GCC pop_options

}  // namespace

template <int M, int R>
void cl_forward(const float* input, const float* weight, const float* bias, const Problem& p, float* output) {
  using F = Fixed<M, R>;
  constexpr int A = M + R - 1;
  const Transforms& t = F::value;
  const int64_t o_count = p.out_channels, c_count = p.channels, e_count = A * A;
  const float* u = transform_weight(weight, p, t, Order::c_major);  // U[e][c][o]
  const Tiling tl = tiling(p, M);
  for_each_chunk(p, M, plan(p, M), [&](int64_t, const Chunk& k) {
    const ClChunk g = cl_chunk(p, t, k);
    float* pad = cl_scratch(ChannelsLastSlot::padded_planes,
                            k.images * std::max(g.in_rows * g.in_cols * c_count, g.out_rows * g.out_cols * o_count));
    float* v = cl_scratch(ChannelsLastSlot::input_tiles, g.tiles8 * e_count * c_count);
    float* product_out = cl_scratch(ChannelsLastSlot::product, g.tiles8 * e_count * o_count);
    to_channels_last(input + k.n0 * c_count * p.height * p.width, k.images, c_count, p.height, p.width, g.in_rows,
                     g.in_cols, p.pad_h, p.pad_w, pad);
    transform_from_copy<F, Which::bt, M, A, A>(pad, g.in_rows, g.in_cols, tl, k.images, c_count, v);
    std::fill(v + g.tiles * e_count * c_count, v + g.tiles8 * e_count * c_count, 0.0f);
    for (int64_t e = 0; e < e_count; ++e) {  // M[t][e][o] = sum over c of V[t][e][c] U[e][c][o]
      product(g.tiles8, o_count, c_count, v + e * c_count, e_count * c_count, 1, u + e * c_count * o_count,
              o_count, product_out + e * o_count, e_count * o_count, false);
    }
    transform_into_copy<F, Which::at, M, A, M, false>(product_out, g.out_rows, g.out_cols, tl, k.images, o_count, pad);
    to_channels_first(pad, k.images, o_count, p.out_h, p.out_w, g.out_rows, g.out_cols, 0, 0, bias,
                      output + k.n0 * o_count * p.out_h * p.out_w);
  });
}

template <int M, int R>
void cl_backward(const float* grad_output, const float* input, const float* weight, const Problem& p,
                 float* grad_input, float* grad_weight) {
  using F = Fixed<M, R>;
  constexpr int A = M + R - 1;
  const Transforms& t = F::value;
  const int64_t o_count = p.out_channels, c_count = p.channels, e_count = A * A, size = e_count * o_count * c_count;
  const float* u = grad_input != nullptr ? transform_weight(weight, p, t) : nullptr;  // U[e][o][c]
  const Tiling tl = tiling(p, M);
  const Plan chunks = plan(p, M);
  // dU[e][c][o] per task, summed in task order afterwards. A task's first
  // chunk overwrites its sum.
  float* partials =
      grad_weight != nullptr ? cl_scratch(ChannelsLastSlot::weight_gradient_partials, chunks.tasks * size) : nullptr;
  std::vector<char> started(static_cast<size_t>(chunks.tasks), 0);
  for_each_chunk(p, M, chunks, [&](int64_t task, const Chunk& k) {
    const ClChunk g = cl_chunk(p, t, k);
    float* pad = cl_scratch(ChannelsLastSlot::padded_planes,
                            k.images * std::max(g.in_rows * g.in_cols * c_count, g.out_rows * g.out_cols * o_count));
    float* v = cl_scratch(ChannelsLastSlot::input_tiles, g.tiles8 * e_count * c_count);  // V, or dV
    float* dm = cl_scratch(ChannelsLastSlot::product, g.tiles8 * e_count * o_count);
    to_channels_last(grad_output + k.n0 * o_count * p.out_h * p.out_w, k.images, o_count, p.out_h, p.out_w,
                     g.out_rows, g.out_cols, 0, 0, pad);
    transform_from_copy<F, Which::a, M, A, M>(pad, g.out_rows, g.out_cols, tl, k.images, o_count, dm);
    std::fill(dm + g.tiles * e_count * o_count, dm + g.tiles8 * e_count * o_count, 0.0f);
    if (grad_input != nullptr) {
      for (int64_t e = 0; e < e_count; ++e) {  // dV[t][e][c] = sum over o of dM[t][e][o] U[e][o][c]
        product(g.tiles8, c_count, o_count, dm + e * o_count, e_count * o_count, 1, u + e * o_count * c_count,
                c_count, v + e * c_count, e_count * c_count, false);
      }
      std::fill(pad, pad + k.images * g.in_rows * g.in_cols * c_count, 0.0f);
      transform_into_copy<F, Which::b, M, A, A, true>(v, g.in_rows, g.in_cols, tl, k.images, c_count, pad);
      to_channels_first(pad, k.images, c_count, p.height, p.width, g.in_rows, g.in_cols, p.pad_h, p.pad_w, nullptr,
                        grad_input + k.n0 * c_count * p.height * p.width);
    }
    if (grad_weight != nullptr) {
      to_channels_last(input + k.n0 * c_count * p.height * p.width, k.images, c_count, p.height, p.width, g.in_rows,
                       g.in_cols, p.pad_h, p.pad_w, pad);
      transform_from_copy<F, Which::bt, M, A, A>(pad, g.in_rows, g.in_cols, tl, k.images, c_count, v);
      std::fill(v + g.tiles * e_count * c_count, v + g.tiles8 * e_count * c_count, 0.0f);
      float* du = partials + task * size;
      for (int64_t e = 0; e < e_count; ++e) {  // dU[e][c][o] (+)= sum over t of V[t][e][c] dM[t][e][o]
        product(c_count, o_count, g.tiles8, v + e * c_count, 1, e_count * c_count, dm + e * o_count,
                e_count * o_count, du + e * c_count * o_count, o_count, started[task] != 0);
      }
      started[task] = 1;
    }
  });
  if (grad_weight == nullptr) return;
  sum_task_partials(partials, partials + size, started, size);
  // dU[e][c][o] -> dU[e][o][c], the layout of inverse_transform_weight.
  float* du = cl_scratch(ChannelsLastSlot::weight_gradient, size);
  parallel_for(0, e_count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) {
      for (int64_t c = 0; c < c_count; ++c) {
        for (int64_t o = 0; o < o_count; ++o) {
          du[(e * o_count + o) * c_count + c] = partials[(e * c_count + c) * o_count + o];
        }
      }
    }
  });
  inverse_transform_weight(du, p, t, grad_weight);
}

template void cl_forward<4, 3>(const float*, const float*, const float*, const Problem&, float*);
template void cl_forward<4, 5>(const float*, const float*, const float*, const Problem&, float*);
template void cl_backward<4, 3>(const float*, const float*, const float*, const Problem&, float*, float*);
template void cl_backward<4, 5>(const float*, const float*, const float*, const Problem&, float*, float*);
#endif  // LOOM_WINOGRAD_CHANNELS_LAST

}  // namespace loom::ops::cpu::winograd::detail

namespace loom::ops::cpu::winograd {

using namespace detail;

bool channels_last(const Problem& p, int m) {
#if LOOM_WINOGRAD_CHANNELS_LAST
  // The GEMM's kernel choice (LOOM_CPU_GEMM, set_gemm_kernel) also chooses
  // this path, as it does the direct kernels (conv2d_direct.h).
  return m == 4 && (p.kernel == 3 || p.kernel == 5) && gemm_kernel() == GemmKernel::avx512 &&
         p.channels % kLanes == 0 && p.out_channels % kLanes == 0 && p.channels <= kChannelsLastMax &&
         p.out_channels <= kChannelsLastMax;
#else
  return false;
#endif
}

}  // namespace loom::ops::cpu::winograd
