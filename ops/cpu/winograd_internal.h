// Internal declarations shared by the Winograd convolution's CPU files:
// winograd.cpp (the driver), winograd_transforms.cpp (the transform
// matrices, their row kernels and the weight's transforms),
// winograd_tiles.cpp (the tile-major path's tile gather and scatter) and
// winograd_channels_last.cpp (the channels-last path). Not part of loom's API.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include <loom/core/parallel.h>
#include <loom/ops/cpu/gemm.h>
#include <loom/ops/cpu/scratch.h>
#include <loom/ops/cpu/winograd.h>

namespace loom::ops::cpu::winograd::detail {

constexpr int kMaxAlpha = 8;

// The matrices of F(m, r), α = m + r - 1, by Toom-Cook over the points 0, 1,
// -1, 2, -2, 1/2, -1/2 (the first α - 1 of them) and infinity. G carries the
// Lagrange denominators, so Bᵀ holds the (integer, for α <= 6) coefficients
// of the node polynomials. Row-major; the transposes are kept too, since
// every transform and its adjoint is applied as "matrix times rows".
struct Transforms {
  int m = 0, r = 0, alpha = 0;
  float at[kMaxAlpha * kMaxAlpha] = {};  // Aᵀ: m x α
  float a[kMaxAlpha * kMaxAlpha] = {};   // A: α x m
  float g[kMaxAlpha * kMaxAlpha] = {};   // G: α x r
  float gt[kMaxAlpha * kMaxAlpha] = {};  // Gᵀ: r x α
  float bt[kMaxAlpha * kMaxAlpha] = {};  // Bᵀ: α x α
  float b[kMaxAlpha * kMaxAlpha] = {};   // B: α x α
};

constexpr Transforms make_transforms(int m, int r) {
  const double points[kMaxAlpha - 1] = {0, 1, -1, 2, -2, 0.5, -0.5};
  const int alpha = m + r - 1, finite = alpha - 1;
  double at[kMaxAlpha][kMaxAlpha] = {}, g[kMaxAlpha][kMaxAlpha] = {}, bt[kMaxAlpha][kMaxAlpha] = {};
  // Coefficients (ascending powers) of the product of (x - points[l]) over l != skip.
  auto node_polynomial = [&](int skip, double* coefficients) {
    std::fill(coefficients, coefficients + kMaxAlpha, 0.0);
    coefficients[0] = 1;
    int degree = 0;
    for (int l = 0; l < finite; ++l) {
      if (l == skip) continue;
      ++degree;
      for (int k = degree; k >= 0; --k) coefficients[k] = (k > 0 ? coefficients[k - 1] : 0.0) - points[l] * coefficients[k];
    }
  };
  for (int j = 0; j < finite; ++j) {
    const double p = points[j];
    double power = 1, denominator = 1;
    for (int l = 0; l < finite; ++l) {
      if (l != j) denominator *= p - points[l];
    }
    for (int i = 0; i < std::max(m, r); ++i, power *= p) {
      if (i < m) at[i][j] = power;
      if (i < r) g[j][i] = power / denominator;
    }
    node_polynomial(j, bt[j]);
  }
  at[m - 1][alpha - 1] = 1;
  g[alpha - 1][r - 1] = 1;
  node_polynomial(-1, bt[alpha - 1]);
  Transforms t{};
  t.m = m;
  t.r = r;
  t.alpha = alpha;
  for (int i = 0; i < alpha; ++i) {
    for (int j = 0; j < alpha; ++j) {
      if (i < m) t.at[i * alpha + j] = static_cast<float>(at[i][j]);
      if (i < m) t.a[j * m + i] = static_cast<float>(at[i][j]);
      if (j < r) t.g[i * r + j] = static_cast<float>(g[i][j]);
      if (j < r) t.gt[j * alpha + i] = static_cast<float>(g[i][j]);
      t.bt[i * alpha + j] = static_cast<float>(bt[i][j]);
      t.b[j * alpha + i] = static_cast<float>(bt[i][j]);
    }
  }
  return t;
}

// Every F(m, r) with r in {3, 5} and α <= 8, built once.
const Transforms& transforms(int m, int r);

// The transforms compiled for each F(m, r): the matrix is a compile-time
// constant, so zero coefficients cost nothing, ±1 are an add or a subtract,
// and the input rows stay in registers.
template <int M, int R>
struct Fixed {
  static constexpr Transforms value = make_transforms(M, R);
};
enum class Which { bt, b, at, a, g, gt };  // also the index into FastRows::of

template <class F, Which W>
constexpr const float* fixed_matrix() {
  if constexpr (W == Which::bt) return F::value.bt;
  if constexpr (W == Which::b) return F::value.b;
  if constexpr (W == Which::at) return F::value.at;
  if constexpr (W == Which::a) return F::value.a;
  if constexpr (W == Which::g) return F::value.g;
  if constexpr (W == Which::gt) return F::value.gt;
}

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
template <int N, class Fn>
inline __attribute__((always_inline)) void unroll(Fn&& fn) {
  [&]<int... I>(std::integer_sequence<int, I...>) { (fn(std::integral_constant<int, I>{}), ...); }
  (std::make_integer_sequence<int, N>{});
}

inline __m256 fmadd(__m256 a, __m256 x, __m256 sum) { return _mm256_fmadd_ps(a, x, sum); }
inline __m128 fmadd(__m128 a, __m128 x, __m128 sum) { return _mm_fmadd_ps(a, x, sum); }
inline float fmadd(float a, float x, float sum) { return std::fma(a, x, sum); }

// store(i, sum over j < In of W[i][j] x[j]) for i < Out, with transform W of
// F folded in at compile time: its zeros skipped, its ones an add or a
// subtract. V is __m256 (8 tiles at once), __m128 (4) or float (the tails):
// the arithmetic of both compiled transforms below.
template <class F, Which W, int Out, int In, class V, class Store>
inline __attribute__((always_inline)) void fixed_product(const V* x, Store&& store) {
  constexpr const float* mat = fixed_matrix<F, W>();
  unroll<Out>([&](auto i) __attribute__((always_inline)) {
    V sum{};
    unroll<In>([&](auto j) __attribute__((always_inline)) {
      constexpr float c = mat[i * In + j];
      if constexpr (c == 1.0f) {
        sum = sum + x[j];
      } else if constexpr (c == -1.0f) {
        sum = sum - x[j];
      } else if constexpr (c != 0.0f) {
        sum = fmadd(V{} + c, x[j], sum);  // V{} + c: c in every lane
      }
    });
    store(i, sum);
  });
}

#pragma GCC pop_options
#endif

// Applies transform W of t (Bᵀ, B: α x α; Aᵀ: m x α; A: α x m; G: α x r;
// Gᵀ: r x α) to rows of `length` values.
void transform_rows(const Transforms& t, Which w, const float* in, int64_t in_stride, float* out, int64_t out_stride,
                    int64_t length);
// transform_rows over `segments` runs of rows, `ld` floats apart: the layout
// of the chunk buffers below, [row][channel][ld] with `length` tiles in each.
inline void transform_segments(const Transforms& t, Which w, const float* in, int64_t in_stride, float* out,
                               int64_t out_stride, int64_t segments, int64_t ld, int64_t length) {
  for (int64_t k = 0; k < segments; ++k) transform_rows(t, w, in + k * ld, in_stride, out + k * ld, out_stride, length);
}

// Winograd's per-thread scratch (ops/cpu/scratch.h), one buffer per slot.
// The weight-side slots are the calling thread's, filled before the chunks
// run and read (or, for the per-task sums, written) by the whole team; the
// chunk slots are each task's own.
enum class WinogradSlot {
  // Chunk slots.
  input_tiles,   // V[ξ][ν][c][t] (P[r][s][c][t] on the way), or dV, then dP, in the input gradient
  input_half,    // halfway through the input tiles' 2-D transform (or dV's)
  product,       // M[ξ][ν][o][t] in the forward, dM[ξ][ν][o][t] in the backward
  output_half,   // halfway through M's or dY's 2-D transform
  output_tiles,  // Y[a][b][o][t] in the forward, dY[a][b][o][t] in the backward
  // Weight-side slots.
  transformed_weight,        // U[ξ][ν][o][c] (or [c][o]), unpacked
  weight_taps,               // the weight's taps [ki][kj][column], on the way to or from U
  weight_half,               // halfway through the weight's G transforms: [ξ][kj] or [ki][ν]
  weight_gradient_partials,  // dU per task, summed in task order
  packed_weight,             // U packed once per call for every chunk's GEMMs (PackedA)
  count
};
// What a pass holds at the same time: each task every chunk slot (dM stays
// while the input gradient uses input_tiles and input_half and the weight
// gradient transforms the input there again); the calling thread
// transformed_weight, weight_taps, weight_half and packed_weight while the
// weight is transformed and packed, then packed_weight (or
// transformed_weight) and weight_gradient_partials while the chunks run, and
// at the end weight_gradient_partials with weight_taps and weight_half while
// dU is transformed back.
static_assert(distinct_slots({WinogradSlot::input_tiles, WinogradSlot::input_half, WinogradSlot::product,
                              WinogradSlot::output_half, WinogradSlot::output_tiles}));
static_assert(distinct_slots({WinogradSlot::transformed_weight, WinogradSlot::weight_taps, WinogradSlot::weight_half,
                              WinogradSlot::packed_weight, WinogradSlot::weight_gradient_partials}));
inline float* scratch(WinogradSlot slot, int64_t elements) { return thread_scratch(slot, elements); }

struct Tiling {
  int64_t rows, cols, per_image;  // tiles per output plane: ceil(Ho / m) x ceil(Wo / m)
};
inline Tiling tiling(const Problem& p, int m) {
  const int64_t rows = (p.out_h + m - 1) / m, cols = (p.out_w + m - 1) / m;
  return {rows, cols, rows * cols};
}

// The order of transform_weight's U columns: [o][c] (o-major) or [c][o]
// (c-major: the channels-last path's products read U[e][c][o]).
// packed_transformed_weight writes PackedA's order instead.
enum class Order { o_major, c_major };

// U[ξ][ν][o][c] = sum over (ki, kj) of G[ξ][ki] w[o][c][ki][kj] G[ν][kj], into
// the transformed_weight slot; U[ξ][ν][c][o] with Order::c_major.
const float* transform_weight(const float* weight, const Problem& p, const Transforms& t,
                              Order order = Order::o_major);
// The adjoint: dw[o][c][ki][kj] = sum over (ξ, ν) of G[ξ][ki] dU[ξ][ν][o][c] G[ν][kj].
// `du` must not be in the weight_taps or weight_half slot.
void inverse_transform_weight(const float* du, const Problem& p, const Transforms& t, float* grad_weight);
// U as α² GEMM operands op(U_e), packed once for every chunk's products.
std::vector<PackedA<float>> packed_transformed_weight(const float* weight, const Problem& p, const Transforms& t,
                                                      Transpose op);

// Planes are tiled through a zero-padded copy, `rows` x `cols`, holding the
// plane at (top, left): every tile row then reads (or writes) whole rows of
// the copy, with no bounds to check.
struct Padded {
  int64_t rows, cols, top, left;
};
// The padded copy of an input plane that covers every input tile, and of an
// output plane (whole tiles).
Padded input_layout(const Problem& p, const Transforms& t);
Padded output_layout(const Problem& p, const Transforms& t);

// A chunk of images n0 .. n0+images, their `tiles` tiles in each buffer
// row, rows `ld` floats apart. ld is odd: with a power-of-two row length (128
// tiles) the rows a transform reads or split_row writes at once would be a
// multiple of 4 KiB apart and fight over the same few L1 sets.
struct Chunk {
  int64_t n0, images, tiles, ld;
};

// Transform W of t along both tile dimensions of a chunk buffer (winograd_tiles.cpp).
void transform_2d(const Transforms& t, Which w, int64_t in_span, int64_t out_span, int64_t channels, const Chunk& k,
                  const float* in, float* half, float* out);

// The planes of a chunk, `channels` per image, `height` x `width` each, and
// how they are cut into tiles: `span` rows and columns per tile (α for the
// input, m for the output), through padded copies laid out as `layout`.
// Tile element (row, col) of channel c and tile t lives at
// tiles[((row * span + col) * channels + c) * k.ld + t].
struct Planes {
  int64_t channels, height, width;
  Padded layout;
  int span;
};
Planes input_planes(const Problem& p, const Transforms& t);
Planes output_planes(const Problem& p, const Transforms& t);

// The adjoint of split_row: row[tw * m + s] += src[s][tw] (winograd_tiles.cpp).
void merge_row(const float* const* src, int64_t tiles, int m, int width, float* row);
// This thread's padded copy of a plane laid out as `layout` (winograd_tiles.cpp).
float* padded_buffer(const Padded& layout);
// The plane's part of the copy back into it (winograd_tiles.cpp).
void unpad_plane(const float* padded, const Padded& layout, int64_t height, int64_t width, float* plane);

// Inline here, as it was inlined into the forward and backward passes
// before the split (out of line, the ConvNet's step ran 1% more
// instructions; callgrind).
// The adjoint of tiles_of: each plane is the sum of what its tiles hold over
// it, plus fill[c] (when fill is not null). The input gradient from
// dP[r][s][c][t]; the output, with the bias, from Y[a][b][o][t] (whose tiles
// do not overlap).
inline void planes_of(const float* tiles, const float* fill, const Planes& shape, const Problem& p, const Transforms& t,
                      const Chunk& k, float* planes) {
  const Tiling tl = tiling(p, t.m);
  const int64_t span = shape.span, channels = shape.channels;
  float* copy = padded_buffer(shape.layout);
  const float* src[kMaxAlpha];
  for (int64_t i = 0; i < k.images; ++i) {
    for (int64_t c = 0; c < channels; ++c) {
      std::fill(copy, copy + shape.layout.rows * shape.layout.cols, fill != nullptr ? fill[c] : 0.0f);
      for (int64_t th = 0; th < tl.rows; ++th) {
        for (int64_t row = 0; row < span; ++row) {
          for (int64_t col = 0; col < span; ++col) {
            src[col] = tiles + ((row * span + col) * channels + c) * k.ld + i * tl.per_image + th * tl.cols;
          }
          merge_row(src, tl.cols, t.m, shape.span, copy + (th * t.m + row) * shape.layout.cols);
        }
      }
      unpad_plane(copy, shape.layout, shape.height, shape.width, planes + (i * channels + c) * shape.height * shape.width);
    }
  }
}

// V[ξ][ν][c][t] of the chunk, in the input_tiles slot (input_half is scratch).
float* transformed_input(const float* input, const Problem& p, const Transforms& t, const Chunk& k);
// dM[ξ][ν][o][t] of the chunk's output gradient tiles, in the product slot
// (output_half and output_tiles are scratch).
float* transformed_grad_output(const float* grad_output, const Problem& p, const Transforms& t, const Chunk& k);

// Images per chunk and how many tasks share the batch.
struct Plan {
  int64_t fold, tasks;
};
Plan plan(const Problem& p, int m);

// fn(task, chunk) for every chunk. Task t takes images [batch t / tasks,
// batch (t + 1) / tasks), in chunks of at most `fold` images as even as
// they go, in order: the same chunks, and so the same sums, on every run.
// (Whole chunks per task split the ConvNet's 25 chunks of 4 images 12 / 13.)
template <class Fn>
void for_each_chunk(const Problem& p, int m, const Plan& plan, Fn&& fn) {
  const int64_t per_image = tiling(p, m).per_image;
  auto run_task = [&](int64_t task) {
    const int64_t first = p.batch * task / plan.tasks, count = p.batch * (task + 1) / plan.tasks - first;
    const int64_t chunks = (count + plan.fold - 1) / plan.fold;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t n0 = first + count * c / chunks, images = first + count * (c + 1) / chunks - n0;
      const int64_t tiles = images * per_image;
      fn(task, Chunk{n0, images, tiles, tiles | 1});
    }
  };
  if (plan.tasks == 1) return run_task(0);
  parallel_for(0, plan.tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) run_task(task);
  });
}

#if defined(__x86_64__) && !defined(__clang__)
#define LOOM_WINOGRAD_CHANNELS_LAST 1
#else
#define LOOM_WINOGRAD_CHANNELS_LAST 0
#endif
#if LOOM_WINOGRAD_CHANNELS_LAST
// The channels-last path (winograd_channels_last.cpp), for M = 4 and R = 3 or 5.
template <int M, int R>
void cl_forward(const float* input, const float* weight, const float* bias, const Problem& p, float* output);
template <int M, int R>
void cl_backward(const float* grad_output, const float* input, const float* weight, const Problem& p,
                 float* grad_input, float* grad_weight);
#endif

}  // namespace loom::ops::cpu::winograd::detail
