// Winograd F(m x m, r x r) convolution on the CPU; see winograd.h.
//
// A chunk of images is processed at a time (its buffers stay near L2): the
// input tiles are gathered as P[r][s][c][t] (tile element, channel, tile),
// transformed along r and then s into V[ξ][ν][c][t], multiplied by the
// transformed weight U[ξ][ν][o][c] in α² GEMMs into M[ξ][ν][o][t], and
// transformed back along ξ and ν into the tiles' outputs. Every transform is a
// small matrix applied to rows that are contiguous in the tile index, so the
// arithmetic runs 8 tiles per AVX2 instruction. F(4x4, 3x3) and F(4x4, 5x5),
// the two conv2d uses, gather their input and output-gradient tiles with the
// first transform already applied along s (split_row_transformed, 4 tiles per
// instruction), which saves a pass over the chunk buffers.
// With few channels (multiples of 16, at most 128) and the AVX-512 GEMM
// kernel, the chunk runs channels-last instead (the section at the end).
#include <loom/ops/cpu/winograd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <loom/core/error.h>
#include <loom/core/parallel.h>
#include <loom/ops/cpu/gemm.h>
#include <loom/ops/cpu/scratch.h>
#include <loom/ops/cpu/simd.h>

namespace loom::ops::cpu::winograd {
namespace {

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

const Transforms& transforms(int m, int r) {
  // Every F(m, r) with r in {3, 5} and α <= 8, built once.
  static const std::vector<Transforms> table = [] {
    std::vector<Transforms> all;
    for (int r : {3, 5}) {
      for (int m = 2; m + r - 1 <= kMaxAlpha; ++m) all.push_back(make_transforms(m, r));
    }
    return all;
  }();
  for (const Transforms& t : table) {
    if (t.m == m && t.r == r) return t;
  }
  LOOM_FAIL("winograd: no F(", m, ", ", r, ") transform (r must be 3 or 5, m + r - 1 at most ", kMaxAlpha, ")");
}

// out[i * out_stride + l] = sum_j mat[i * in_rows + j] * in[j * in_stride + l]
// for l < length: the matrix applied to `in_rows` rows. The portable
// fallback of the compiled kernels below (CPUs without AVX2).
void apply_rows(const float* mat, int out_rows, int in_rows, const float* in, int64_t in_stride, float* out,
                int64_t out_stride, int64_t length) {
  for (int i = 0; i < out_rows; ++i) {
    for (int64_t l = 0; l < length; ++l) {
      float sum = 0;
      for (int j = 0; j < in_rows; ++j) sum += mat[i * in_rows + j] * in[j * in_stride + l];
      out[i * out_stride + l] = sum;
    }
  }
}

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

using RowsFn = void (*)(const float* in, int64_t in_stride, float* out, int64_t out_stride, int64_t length);
struct FastRows {
  RowsFn of[6] = {};  // indexed by Which
};

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

template <class F, Which W, int Out, int In>
void apply_rows_fixed(const float* in, int64_t in_stride, float* out, int64_t out_stride, int64_t length) {
  int64_t l = 0;
  for (; l + 8 <= length; l += 8) {
    __m256 x[In];
    unroll<In>([&](auto j) __attribute__((always_inline)) { x[j] = _mm256_loadu_ps(in + j * in_stride + l); });
    fixed_product<F, W, Out, In>(x, [&](int i, __m256 sum) { _mm256_storeu_ps(out + i * out_stride + l, sum); });
  }
  for (; l < length; ++l) {
    float x[In];
    for (int j = 0; j < In; ++j) x[j] = in[j * in_stride + l];
    fixed_product<F, W, Out, In>(x, [&](int i, float sum) { out[i * out_stride + l] = sum; });
  }
}
#pragma GCC pop_options

template <int M, int R>
FastRows fast_rows_of() {
  using F = Fixed<M, R>;
  constexpr int A = M + R - 1;
  return {{&apply_rows_fixed<F, Which::bt, A, A>, &apply_rows_fixed<F, Which::b, A, A>,
           &apply_rows_fixed<F, Which::at, M, A>, &apply_rows_fixed<F, Which::a, A, M>,
           &apply_rows_fixed<F, Which::g, A, R>, &apply_rows_fixed<F, Which::gt, R, A>}};
}
#endif

// The compiled transforms of F(m, r), or none (no AVX2: the generic apply_rows).
FastRows fast_rows(int m, int r) {
#if defined(__x86_64__)
  if (!cpu_has_avx2()) return {};
  if (r == 3) {
    switch (m) {
      case 2: return fast_rows_of<2, 3>();
      case 3: return fast_rows_of<3, 3>();
      case 4: return fast_rows_of<4, 3>();
      case 5: return fast_rows_of<5, 3>();
      case 6: return fast_rows_of<6, 3>();
    }
  }
  if (r == 5) {
    switch (m) {
      case 2: return fast_rows_of<2, 5>();
      case 3: return fast_rows_of<3, 5>();
      case 4: return fast_rows_of<4, 5>();
    }
  }
#endif
  return {};
}

// Applies transform W of t (Bᵀ, B: α x α; Aᵀ: m x α; A: α x m; G: α x r;
// Gᵀ: r x α) to rows of `length` values.
void transform_rows(const Transforms& t, Which w, const float* in, int64_t in_stride, float* out, int64_t out_stride,
                    int64_t length) {
  static const std::vector<FastRows> table = [] {
    std::vector<FastRows> all(kMaxAlpha * kMaxAlpha);
    for (int r : {3, 5}) {
      for (int m = 2; m + r - 1 <= kMaxAlpha; ++m) all[m * kMaxAlpha + r] = fast_rows(m, r);
    }
    return all;
  }();
  if (const RowsFn fast = table[t.m * kMaxAlpha + t.r].of[static_cast<int>(w)]) {
    return fast(in, in_stride, out, out_stride, length);
  }
  switch (w) {
    case Which::bt: return apply_rows(t.bt, t.alpha, t.alpha, in, in_stride, out, out_stride, length);
    case Which::b: return apply_rows(t.b, t.alpha, t.alpha, in, in_stride, out, out_stride, length);
    case Which::at: return apply_rows(t.at, t.m, t.alpha, in, in_stride, out, out_stride, length);
    case Which::a: return apply_rows(t.a, t.alpha, t.m, in, in_stride, out, out_stride, length);
    case Which::g: return apply_rows(t.g, t.alpha, t.r, in, in_stride, out, out_stride, length);
    case Which::gt: return apply_rows(t.gt, t.r, t.alpha, in, in_stride, out, out_stride, length);
  }
}

// transform_rows over `segments` runs of rows, `ld` floats apart: the layout
// of the chunk buffers below, [row][channel][ld] with `length` tiles in each.
void transform_segments(const Transforms& t, Which w, const float* in, int64_t in_stride, float* out,
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
float* scratch(WinogradSlot slot, int64_t elements) { return thread_scratch(slot, elements); }

struct Tiling {
  int64_t rows, cols, per_image;  // tiles per output plane: ceil(Ho / m) x ceil(Wo / m)
};
Tiling tiling(const Problem& p, int m) {
  const int64_t rows = (p.out_h + m - 1) / m, cols = (p.out_w + m - 1) / m;
  return {rows, cols, rows * cols};
}

// The weight transforms split their (o, c) columns over the thread team, at
// least this many per thread: ResNet's 256-channel layers have 65,536.
constexpr int64_t kWeightColumnsGrain = 4096;

// The order of transform_weight's U columns: [o][c] (o-major) or [c][o]
// (c-major: the channels-last path's products read U[e][c][o]).
// packed_transformed_weight writes PackedA's order instead.
enum class Order { o_major, c_major };

// Columns [begin, end) of the weight's taps, gathered: taps[k][q] =
// weight[source(q) * r² + k], where sources(q0, count, from) sets from[j] =
// source(q0 + j), the (o, c) index o * C + c of column q0 + j. In blocks of
// columns, so that each tap's row is written in runs: one column at a time
// wrote r² floats oc apart (a power of two), each store to the same cache set.
template <class Sources>
void gather_taps(const float* weight, int64_t taps_per_column, int64_t columns, int64_t begin, int64_t end,
                 Sources&& sources, float* taps) {
  constexpr int64_t kBlock = 64;
  int64_t from[kBlock];
  for (int64_t q0 = begin; q0 < end; q0 += kBlock) {
    const int64_t count = std::min(end - q0, kBlock);
    sources(q0, count, from);
    for (int64_t j = 0; j < count; ++j) from[j] *= taps_per_column;
    for (int64_t k = 0; k < taps_per_column; ++k) {
      float* row = taps + k * columns + q0;
      for (int64_t j = 0; j < count; ++j) row[j] = weight[from[j] + k];
    }
  }
}

// The G transforms of columns [begin, end) of taps[ki][kj][column] (through
// half[ξ][kj][column]) into u[ξ][ν][column].
void transform_taps(const Transforms& t, int64_t columns, const float* taps, float* half, float* u, int64_t begin,
                    int64_t end) {
  const int64_t r = t.r, alpha = t.alpha;
  for (int64_t kj = 0; kj < r; ++kj) {  // ki -> ξ
    transform_rows(t, Which::g, taps + kj * columns + begin, r * columns, half + kj * columns + begin, r * columns,
                   end - begin);
  }
  for (int64_t xi = 0; xi < alpha; ++xi) {  // kj -> ν
    transform_rows(t, Which::g, half + xi * r * columns + begin, columns, u + xi * alpha * columns + begin, columns,
                   end - begin);
  }
}

// U[ξ][ν][o][c] = sum over (ki, kj) of G[ξ][ki] w[o][c][ki][kj] G[ν][kj], into
// the transformed_weight slot; U[ξ][ν][c][o] with Order::c_major.
const float* transform_weight(const float* weight, const Problem& p, const Transforms& t,
                              Order order = Order::o_major) {
  const int64_t o_count = p.out_channels, c_count = p.channels, oc = o_count * c_count, r = t.r, alpha = t.alpha;
  float* taps = scratch(WinogradSlot::weight_taps, r * r * oc);      // [ki][kj][column]
  float* half = scratch(WinogradSlot::weight_half, alpha * r * oc);  // [ξ][kj][column]
  float* u = scratch(WinogradSlot::transformed_weight, alpha * alpha * oc);
  parallel_for(0, oc, kWeightColumnsGrain, [&](int64_t begin, int64_t end) {
    gather_taps(weight, r * r, oc, begin, end,
                [&](int64_t q0, int64_t count, int64_t* from) {
                  if (order == Order::o_major) {
                    for (int64_t j = 0; j < count; ++j) from[j] = q0 + j;
                    return;
                  }
                  int64_t c = q0 / o_count, o = q0 % o_count;  // column q = c * O + o
                  for (int64_t j = 0; j < count; ++j) {
                    from[j] = o * c_count + c;
                    if (++o == o_count) o = 0, ++c;
                  }
                },
                taps);
    transform_taps(t, oc, taps, half, u, begin, end);
  });
  return u;
}

// The adjoint: dw[o][c][ki][kj] = sum over (ξ, ν) of G[ξ][ki] dU[ξ][ν][o][c] G[ν][kj].
// `du` must not be in the weight_taps or weight_half slot.
void inverse_transform_weight(const float* du, const Problem& p, const Transforms& t, float* grad_weight) {
  const int64_t oc = p.out_channels * p.channels, r = t.r, alpha = t.alpha;
  float* half = scratch(WinogradSlot::weight_half, r * alpha * oc);  // [ki][ν][o][c]
  float* taps = scratch(WinogradSlot::weight_taps, r * r * oc);      // [ki][kj][o][c]
  parallel_for(0, oc, kWeightColumnsGrain, [&](int64_t begin, int64_t end) {
    for (int64_t nu = 0; nu < alpha; ++nu) {  // ξ -> ki
      transform_rows(t, Which::gt, du + nu * oc + begin, alpha * oc, half + nu * oc + begin, alpha * oc,
                     end - begin);
    }
    for (int64_t ki = 0; ki < r; ++ki) {  // ν -> kj
      transform_rows(t, Which::gt, half + ki * alpha * oc + begin, oc, taps + ki * r * oc + begin, oc, end - begin);
    }
    for (int64_t i = begin; i < end; ++i) {
      for (int64_t k = 0; k < r * r; ++k) grad_weight[i * r * r + k] = taps[k * oc + i];
    }
  });
}

// The tiles of one row of tiles and one plane row: dst[s][tw] = row[tw * m + s]
// for s < width and tw < tiles (zeros in row where the tiles reach past the
// plane). For m = 4, the common case, 4 x 4 blocks of the row are transposed
// in registers, reading row up to tiles * m + 4 values when width > 4 (the
// padded copies below are that long).
void split_row(const float* row, int64_t tiles, int m, int width, float* const* dst) {
  int64_t tw = 0;
#if defined(__x86_64__)
  if (m == 4 && width <= 8) {
    for (; tw + 4 <= tiles; tw += 4) {
      const float* block = row + 4 * tw;
      __m128 c0 = _mm_loadu_ps(block), c1 = _mm_loadu_ps(block + 4), c2 = _mm_loadu_ps(block + 8);
      __m128 c3 = _mm_loadu_ps(block + 12);
      __m128 d0 = c1, d1 = c2, d2 = c3, d3 = width > 4 ? _mm_loadu_ps(block + 16) : _mm_setzero_ps();
      _MM_TRANSPOSE4_PS(c0, c1, c2, c3);
      _MM_TRANSPOSE4_PS(d0, d1, d2, d3);
      const __m128 columns[8] = {c0, c1, c2, c3, d0, d1, d2, d3};
      for (int s = 0; s < width; ++s) _mm_storeu_ps(dst[s] + tw, columns[s]);
    }
  }
#endif
  for (; tw < tiles; ++tw) {
    for (int s = 0; s < width; ++s) dst[s][tw] = row[tw * m + s];
  }
}

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
// split_row for m = 4 with transform W of F applied along each tile's row
// on the way: dst[v][tw] = sum over s < In of W[v][s] row[tw * 4 + s], for
// v < Out. In = α (8 for F(4x4, 5x5), 6 for F(4x4, 3x3)) is an input tile
// (W = Bᵀ), In = 4 an output-gradient tile (W = A): the first of the two
// transforms is done in registers, and the tiles are not written and read
// back in between: 4 tiles per instruction after the 4 x 4 transposes. The
// last tiles of a row (fewer than 4) go through the tail, kept out of line:
// inlined, its registers were saved and restored on every call.
template <class F, Which W, int Out, int In>
[[gnu::noinline]] void split_row_transformed_tail(const float* row, int64_t tw, int64_t tiles, float* const* dst) {
  for (; tw < tiles; ++tw) {
    fixed_product<F, W, Out, In>(row + tw * 4, [&](int v, float sum) { dst[v][tw] = sum; });
  }
}
template <class F, Which W, int Out, int In>
void split_row_transformed(const float* row, int64_t tiles, float* const* dst) {
  int64_t tw = 0;
  for (; tw + 4 <= tiles; tw += 4) {
    const float* block = row + 4 * tw;
    __m128 x[8];
    x[0] = _mm_loadu_ps(block), x[1] = _mm_loadu_ps(block + 4), x[2] = _mm_loadu_ps(block + 8);
    x[3] = _mm_loadu_ps(block + 12);
    if constexpr (In > 4) {
      x[4] = x[1], x[5] = x[2], x[6] = x[3], x[7] = _mm_loadu_ps(block + 16);
      _MM_TRANSPOSE4_PS(x[4], x[5], x[6], x[7]);
    }
    _MM_TRANSPOSE4_PS(x[0], x[1], x[2], x[3]);
    fixed_product<F, W, Out, In>(x, [&](int v, __m128 sum) { _mm_storeu_ps(dst[v] + tw, sum); });
  }
  if (tw < tiles) split_row_transformed_tail<F, W, Out, In>(row, tw, tiles, dst);
}
#pragma GCC pop_options
#endif

// The adjoint of split_row: row[tw * m + s] += src[s][tw].
void merge_row(const float* const* src, int64_t tiles, int m, int width, float* row) {
  int64_t tw = 0;
#if defined(__x86_64__)
  if (m == 4 && width <= 8) {
    for (; tw + 4 <= tiles; tw += 4) {
      float* block = row + 4 * tw;
      __m128 c0 = _mm_loadu_ps(src[0] + tw), c1 = _mm_loadu_ps(src[1] + tw), c2 = _mm_loadu_ps(src[2] + tw);
      __m128 c3 = _mm_loadu_ps(src[3] + tw);
      _MM_TRANSPOSE4_PS(c0, c1, c2, c3);
      const __m128 first[4] = {c0, c1, c2, c3};
      for (int k = 0; k < 4; ++k) _mm_storeu_ps(block + 4 * k, _mm_add_ps(_mm_loadu_ps(block + 4 * k), first[k]));
      if (width <= 4) continue;
      __m128 d[4];
      for (int s = 4; s < 8; ++s) d[s - 4] = s < width ? _mm_loadu_ps(src[s] + tw) : _mm_setzero_ps();
      _MM_TRANSPOSE4_PS(d[0], d[1], d[2], d[3]);
      for (int k = 0; k < 4; ++k) {
        _mm_storeu_ps(block + 4 * (k + 1), _mm_add_ps(_mm_loadu_ps(block + 4 * (k + 1)), d[k]));
      }
    }
  }
#endif
  for (; tw < tiles; ++tw) {
    for (int s = 0; s < width; ++s) row[tw * m + s] += src[s][tw];
  }
}

// Planes are tiled through a zero-padded copy, `rows` x `cols`, holding the
// plane at (top, left): every tile row then reads (or writes) whole rows of
// the copy, with no bounds to check.
struct Padded {
  int64_t rows, cols, top, left;
};
float* padded_buffer(const Padded& layout) {
  thread_local std::vector<float> buffer;
  const int64_t size = layout.rows * layout.cols;
  if (static_cast<int64_t>(buffer.size()) < size) buffer.resize(static_cast<size_t>(size));
  return buffer.data();
}
// The columns [x0, x1) and rows [y0, y1) of a height x width plane inside the copy.
struct Overlap {
  int64_t y0, y1, x0, x1;
};
Overlap overlap(const Padded& layout, int64_t height, int64_t width) {
  const int64_t y0 = std::clamp<int64_t>(-layout.top, 0, height), x0 = std::clamp<int64_t>(-layout.left, 0, width);
  return {y0, std::clamp<int64_t>(layout.rows - layout.top, y0, height), x0,
          std::clamp<int64_t>(layout.cols - layout.left, x0, width)};
}
// The plane's part of the copy back into it (zero where the copy does not reach).
void unpad_plane(const float* padded, const Padded& layout, int64_t height, int64_t width, float* plane) {
  const Overlap o = overlap(layout, height, width);
  std::fill(plane, plane + height * width, 0.0f);
  for (int64_t y = o.y0; y < o.y1; ++y) {
    const float* src = padded + (y + layout.top) * layout.cols + layout.left;
    float* dst = plane + y * width;
    for (int64_t x = o.x0; x < o.x1; ++x) dst[x] = src[x];
  }
}

// The padded copy of an input plane that covers every input tile.
Padded input_layout(const Problem& p, const Transforms& t) {
  const Tiling tl = tiling(p, t.m);
  return {(tl.rows - 1) * t.m + t.alpha, tl.cols * t.m + t.alpha, p.pad_h, p.pad_w};
}
// ... and of an output plane: whole tiles.
Padded output_layout(const Problem& p, const Transforms& t) {
  const Tiling tl = tiling(p, t.m);
  return {tl.rows * t.m, tl.cols * t.m, 0, 0};
}

// A chunk of images n0 .. n0+images, their `tiles` tiles in each buffer
// row, rows `ld` floats apart. ld is odd: with a power-of-two row length (128
// tiles) the rows a transform reads or split_row writes at once would be a
// multiple of 4 KiB apart and fight over the same few L1 sets.
struct Chunk {
  int64_t n0, images, tiles, ld;
};

// out[x'][y'][c][t] = sum over (x, y) of W[x'][x] W[y'][y] in[x][y][c][t]:
// transform W of t along both tile dimensions of a chunk buffer, `channels`
// rows of ld per tile element, in_span x in_span elements in, out_span x
// out_span out; `half` holds out_span x in_span of them in between (out may
// be in).
void transform_2d(const Transforms& t, Which w, int64_t in_span, int64_t out_span, int64_t channels, const Chunk& k,
                  const float* in, float* half, float* out) {
  const int64_t plane = channels * k.ld;
  transform_segments(t, w, in, in_span * plane, half, in_span * plane, in_span * channels, k.ld, k.tiles);  // x -> x'
  for (int64_t x = 0; x < out_span; ++x) {
    transform_segments(t, w, half + x * in_span * plane, plane, out + x * out_span * plane, plane, channels, k.ld,
                       k.tiles);  // y -> y'
  }
}

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
Planes input_planes(const Problem& p, const Transforms& t) {
  return {p.channels, p.height, p.width, input_layout(p, t), t.alpha};
}
Planes output_planes(const Problem& p, const Transforms& t) {
  return {p.out_channels, p.out_h, p.out_w, output_layout(p, t), t.m};
}

// The tiles of the chunk's planes (the first at `planes`; zero in the padding
// and past the plane): P[r][s][c][t] of the input, dY[a][b][o][t] of the
// output gradient. Every plane lands at the same place in the padded copy, so
// its border is cleared once. split(row, tiles, dst) writes one row of each
// tile of a row of tiles: Cols elements, dst[0 .. Cols). Span (the tile's
// rows) and Cols fixed at compile time when > 0; both are shape.span when 0.
template <int Span, int Cols, class Split>
void tiles_of_span(const float* planes, const Planes& shape, const Problem& p, const Transforms& t, const Chunk& k,
                   float* tiles, Split&& split) {
  const Tiling tl = tiling(p, t.m);
  const int64_t span = Span > 0 ? Span : shape.span, cols = Cols > 0 ? Cols : span, channels = shape.channels;
  const Padded& layout = shape.layout;
  float* copy = padded_buffer(layout);
  std::fill(copy, copy + layout.rows * layout.cols, 0.0f);
  const Overlap o = overlap(layout, shape.height, shape.width);
  float* dst[kMaxAlpha];
  for (int64_t i = 0; i < k.images; ++i) {
    for (int64_t c = 0; c < channels; ++c) {
      const float* plane = planes + (i * channels + c) * shape.height * shape.width;
      for (int64_t y = o.y0; y < o.y1; ++y) {
        std::copy(plane + y * shape.width + o.x0, plane + y * shape.width + o.x1,
                  copy + (y + layout.top) * layout.cols + layout.left + o.x0);
      }
      for (int64_t th = 0; th < tl.rows; ++th) {
        for (int64_t row = 0; row < span; ++row) {
          for (int64_t col = 0; col < cols; ++col) {
            dst[col] = tiles + ((row * cols + col) * channels + c) * k.ld + i * tl.per_image + th * tl.cols;
          }
          split(copy + (th * t.m + row) * layout.cols, tl.cols, dst);
        }
      }
    }
  }
}
#if defined(__x86_64__)
// tiles_of with transform W of F (Out x In, In = shape.span) applied along
// each tile's rows on the way (split_row_transformed): Out elements per tile row.
template <class F, Which W, int Out, int In>
void gather_transformed(const float* planes, const Planes& shape, const Problem& p, const Transforms& t,
                        const Chunk& k, float* tiles) {
  tiles_of_span<In, Out>(planes, shape, p, t, k, tiles, [](const float* row, int64_t count, float* const* dst) {
    split_row_transformed<F, W, Out, In>(row, count, dst);
  });
}
#endif
void tiles_of(const float* planes, const Planes& shape, const Problem& p, const Transforms& t, const Chunk& k,
              float* tiles) {
  tiles_of_span<0, 0>(planes, shape, p, t, k, tiles, [&](const float* row, int64_t count, float* const* dst) {
    split_row(row, count, t.m, shape.span, dst);
  });
}

// Whether the tiles of F(4x4, 3x3) and F(4x4, 5x5) are gathered with their
// first transform (split_row_transformed): the transforms' compiled kernels
// are there.
bool transforms_in_gather(const Transforms& t) {
#if defined(__x86_64__)
  return t.m == 4 && (t.r == 3 || t.r == 5) && cpu_has_avx2();
#else
  return false;
#endif
}

// The adjoint of tiles_of: each plane is the sum of what its tiles hold over
// it, plus fill[c] (when fill is not null). The input gradient from
// dP[r][s][c][t]; the output, with the bias, from Y[a][b][o][t] (whose tiles
// do not overlap).
void planes_of(const float* tiles, const float* fill, const Planes& shape, const Problem& p, const Transforms& t,
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
float* transformed_input(const float* input, const Problem& p, const Transforms& t, const Chunk& k) {
  const int64_t alpha = t.alpha, ct = p.channels * k.ld;
  float* v = scratch(WinogradSlot::input_tiles, alpha * alpha * ct);
  float* half = scratch(WinogradSlot::input_half, alpha * alpha * ct);
  const float* planes = input + k.n0 * p.channels * p.height * p.width;
#if defined(__x86_64__)
  if (transforms_in_gather(t)) {
    if (t.r == 3) {
      gather_transformed<Fixed<4, 3>, Which::bt, 6, 6>(planes, input_planes(p, t), p, t, k, half);  // P[r][s] -> [r][ν]
    } else {
      gather_transformed<Fixed<4, 5>, Which::bt, 8, 8>(planes, input_planes(p, t), p, t, k, half);
    }
    const int64_t plane = p.channels * k.ld;
    transform_segments(t, Which::bt, half, alpha * plane, v, alpha * plane, alpha * p.channels, k.ld, k.tiles);  // r -> ξ
    return v;
  }
#endif
  tiles_of(planes, input_planes(p, t), p, t, k, v);
  transform_2d(t, Which::bt, alpha, alpha, p.channels, k, v, half, v);  // P[r][s] -> V[ξ][ν]
  return v;
}

// dM[ξ][ν][o][t]: the adjoint of the output transform applied to the chunk's
// output gradient tiles, in the product slot (output_half and output_tiles are
// scratch).
float* transformed_grad_output(const float* grad_output, const Problem& p, const Transforms& t, const Chunk& k) {
  const int64_t alpha = t.alpha, m = t.m, o_count = p.out_channels, ot = o_count * k.ld;
  const float* planes = grad_output + k.n0 * o_count * p.out_h * p.out_w;
  float* dm = scratch(WinogradSlot::product, alpha * alpha * ot);
#if defined(__x86_64__)
  if (transforms_in_gather(t)) {
    float* half = scratch(WinogradSlot::output_half, m * alpha * ot);  // [a][ν][o][t]
    if (t.r == 3) {
      gather_transformed<Fixed<4, 3>, Which::a, 6, 4>(planes, output_planes(p, t), p, t, k, half);  // dY[a][b] -> [a][ν]
    } else {
      gather_transformed<Fixed<4, 5>, Which::a, 8, 4>(planes, output_planes(p, t), p, t, k, half);
    }
    transform_segments(t, Which::a, half, alpha * ot, dm, alpha * ot, alpha * o_count, k.ld, k.tiles);  // a -> ξ
    return dm;
  }
#endif
  float* tiles_dy = scratch(WinogradSlot::output_tiles, m * m * ot);  // [a][b][o][t]
  tiles_of(planes, output_planes(p, t), p, t, k, tiles_dy);
  transform_2d(t, Which::a, m, alpha, o_count, k, tiles_dy, scratch(WinogradSlot::output_half, alpha * m * ot),
               dm);  // dY[a][b] -> dM[ξ][ν]
  return dm;
}

// Images per chunk and how many tasks share the batch.
struct Plan {
  int64_t fold, tasks;
};
// About 64 tiles per chunk, fewer (down to 16) when the channels would make
// a chunk buffer (α² x channels x tiles floats) larger than 8 MiB: with 128
// (the ConvNet's conv2: buffers of 0.5 to 1 MiB each, several per chunk) its
// forward and backward took longer. (Measured:
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md.)
constexpr int64_t kTargetTiles = 64, kMinTiles = 16, kChunkBufferFloats = int64_t{1} << 21;

Plan plan(const Problem& p, int m) {
  const int64_t batch = std::max<int64_t>(1, p.batch), per_image = tiling(p, m).per_image;
  const int64_t alpha = m + p.kernel - 1, widest = std::max<int64_t>(1, std::max(p.channels, p.out_channels));
  const int64_t target = std::clamp<int64_t>(kChunkBufferFloats / (alpha * alpha * widest), kMinTiles, kTargetTiles);
  const int64_t threads = in_parallel_region() ? 1 : get_num_threads();
  return {std::clamp<int64_t>(target / per_image, 1, batch), std::min(threads, batch)};
}

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

// The α² matrices U[ξ][ν] (o x c each) as GEMM operands packed once for
// every chunk's products (PackedA, into the packed_weight slot): op = U for
// the forward, Uᵀ for the input gradient.
std::vector<PackedA<float>> packed_weight(const float* u, int64_t count, int64_t o_count, int64_t c_count,
                                          Transpose t) {
  const int64_t rows = t == Transpose::no ? o_count : c_count, depth = t == Transpose::no ? c_count : o_count;
  const int64_t each = PackedA<float>::storage_size(rows, depth);
  float* storage = scratch(WinogradSlot::packed_weight, count * each);
  std::vector<PackedA<float>> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t e = 0; e < count; ++e) out.emplace_back(t, rows, depth, u + e * o_count * c_count, c_count, storage + e * each);
  return out;
}

// packed_weight(transform_weight(...)) in one go where the GEMM packs A and
// op(U_e)'s rows fill whole strips: the taps are gathered in the packing's
// order (PackedA's layout), so the G transforms write every U_e packed, into
// the packed_weight slot, and no U is packed afterwards (that pass and its read
// of U were a visible share of the forward of a 256-channel 3x3 on 8x8 planes;
// measured in
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md). The same
// values.
std::vector<PackedA<float>> packed_transformed_weight(const float* weight, const Problem& p, const Transforms& t,
                                                      Transpose op) {
  const int64_t o_count = p.out_channels, c_count = p.channels, oc = o_count * c_count, r = t.r, alpha = t.alpha;
  const int64_t rows = op == Transpose::no ? o_count : c_count, depth = op == Transpose::no ? c_count : o_count;
  constexpr int64_t kStrip = PackedA<float>::kStripRows, kSlice = PackedA<float>::kSliceDepth;
  if (!PackedA<float>::packs() || rows % kStrip != 0) {
    return packed_weight(transform_weight(weight, p, t), alpha * alpha, o_count, c_count, op);
  }
  float* taps = scratch(WinogradSlot::weight_taps, r * r * oc);      // [ki][kj][packing position]
  float* half = scratch(WinogradSlot::weight_half, alpha * r * oc);  // [ξ][kj][packing position]
  float* u = scratch(WinogradSlot::packed_weight, alpha * alpha * oc);
  // Position q of slice s, strip (rows i0 .. i0+8), depth d, row i is
  // s * kSlice * rows + i0 * kc + (d - s * kSlice) * 8 + (i - i0): the
  // strips of a slice follow one another, so each task's positions are a
  // range. op(U)(i, d) is U[o = i][c = d], or U[o = d][c = i] transposed.
  const int64_t strips = rows / kStrip, slices = (depth + kSlice - 1) / kSlice;
  parallel_for(0, slices * strips, std::max<int64_t>(1, kWeightColumnsGrain / (kStrip * kSlice)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t task = begin; task < end; ++task) {
                   const int64_t d0 = (task / strips) * kSlice, i0 = (task % strips) * kStrip;
                   const int64_t kc = std::min(kSlice, depth - d0), first = d0 * rows + i0 * kc;
                   gather_taps(weight, r * r, oc, first, first + kc * kStrip,
                               [&](int64_t q0, int64_t count, int64_t* from) {
                                 for (int64_t j = 0; j < count; ++j) {
                                   const int64_t q = q0 + j - first, d = d0 + q / kStrip, i = i0 + q % kStrip;
                                   from[j] = op == Transpose::no ? i * c_count + d : d * c_count + i;
                                 }
                               },
                               taps);
                 }
               });
  parallel_for(0, oc, kWeightColumnsGrain,
               [&](int64_t begin, int64_t end) { transform_taps(t, oc, taps, half, u, begin, end); });
  std::vector<PackedA<float>> out;
  out.reserve(static_cast<size_t>(alpha * alpha));
  for (int64_t e = 0; e < alpha * alpha; ++e) out.push_back(PackedA<float>::adopt(op, rows, depth, u + e * oc));
  return out;
}

// ---- The channels-last path (few channels, AVX-512) ------------------------
//
// With few channels (the ConvNet's conv2: 16 -> 32, 5x5 on 14x14 planes) the
// transforms, not the α² GEMMs, dominate the path above: its rows run over a
// plane row's tiles, 4 of them on 14x14 planes, and the GEMMs are too small
// for packing to pay. Here the chunk's images are first copied channels-last
// (pixel-major, 16 channels per vector), so every transform is whole-vector
// arithmetic on one tile's elements, whatever the plane size, and the buffers
// are tile-major, V[t][ξ][ν][c] and M[t][ξ][ν][o]: a tile's elements are
// contiguous for its transforms, and the α² products read them in place
// (product_tile), with no packing. Channel counts must be multiples of 16.
// GCC only: clang ignores `#pragma GCC target`, and the section's
// functions would be compiled without AVX-512 (a clang build runs the
// tile-major path).
#if defined(__x86_64__) && !defined(__clang__)
#define LOOM_WINOGRAD_CHANNELS_LAST 1
#else
#define LOOM_WINOGRAD_CHANNELS_LAST 0
#endif
#if LOOM_WINOGRAD_CHANNELS_LAST
constexpr int64_t kLanes = 16;
// At most this many channels in or out: beyond, the products dominate and the
// packed GEMMs of the path above run them faster (ResNet's 256-channel 3x3 on
// 8x8 planes ran slower channels-last, 128 on 16x16 faster; measured in
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md).
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

// V[t][ξ][ν][c] = (Bᵀ d B)[ξ][ν] of every tile d of the padded copy.
template <class F, int M, int A>
void input_transform(const float* pad, const Tiling& tl, const ClChunk& g, int64_t images, int64_t channels,
                     float* v) {
  for_each_tile(tl, images, [&](int64_t t, int64_t i, int64_t th, int64_t tw) {
    const float* tile = pad + ((i * g.in_rows + th * M) * g.in_cols + tw * M) * channels;
    for (int64_t c0 = 0; c0 < channels; c0 += kLanes) {
      tile_transform_16<F, Which::bt, A, A, false>(tile, g.in_cols, v + t * A * A * channels, A, channels, c0);
    }
  });
}

// dM[t][ξ][ν][o] = (A dY Aᵀ)[ξ][ν] of every tile dY of the whole-tile output copy.
template <class F, int M, int A>
void grad_output_transform(const float* pad, const Tiling& tl, const ClChunk& g, int64_t images, int64_t channels,
                           float* dm) {
  for_each_tile(tl, images, [&](int64_t t, int64_t i, int64_t th, int64_t tw) {
    const float* tile = pad + ((i * g.out_rows + th * M) * g.out_cols + tw * M) * channels;
    for (int64_t o0 = 0; o0 < channels; o0 += kLanes) {
      tile_transform_16<F, Which::a, A, M, false>(tile, g.out_cols, dm + t * A * A * channels, A, channels, o0);
    }
  });
}

// The output copy's tiles: (Aᵀ M A) of every tile's M[t].
template <class F, int M, int A>
void output_transform(const float* product, const Tiling& tl, const ClChunk& g, int64_t images, int64_t channels,
                      float* pad) {
  for_each_tile(tl, images, [&](int64_t t, int64_t i, int64_t th, int64_t tw) {
    float* tile = pad + ((i * g.out_rows + th * M) * g.out_cols + tw * M) * channels;
    for (int64_t o0 = 0; o0 < channels; o0 += kLanes) {
      tile_transform_16<F, Which::at, M, A, false>(product + t * A * A * channels, A, tile, g.out_cols, channels, o0);
    }
  });
}

// The input gradient's padded copy: every tile's (B dV Bᵀ) added at its place
// (the tiles overlap), in tile order.
template <class F, int M, int A>
void grad_input_transform(const float* dv, const Tiling& tl, const ClChunk& g, int64_t images, int64_t channels,
                          float* pad) {
  for_each_tile(tl, images, [&](int64_t t, int64_t i, int64_t th, int64_t tw) {
    float* tile = pad + ((i * g.in_rows + th * M) * g.in_cols + tw * M) * channels;
    for (int64_t c0 = 0; c0 < channels; c0 += kLanes) {
      tile_transform_16<F, Which::b, A, A, true>(dv + t * A * A * channels, A, tile, g.in_cols, channels, c0);
    }
  });
}
#pragma GCC pop_options

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
    input_transform<F, M, A>(pad, tl, g, k.images, c_count, v);
    std::fill(v + g.tiles * e_count * c_count, v + g.tiles8 * e_count * c_count, 0.0f);
    for (int64_t e = 0; e < e_count; ++e) {  // M[t][e][o] = sum over c of V[t][e][c] U[e][c][o]
      product(g.tiles8, o_count, c_count, v + e * c_count, e_count * c_count, 1, u + e * c_count * o_count,
              o_count, product_out + e * o_count, e_count * o_count, false);
    }
    output_transform<F, M, A>(product_out, tl, g, k.images, o_count, pad);
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
    grad_output_transform<F, M, A>(pad, tl, g, k.images, o_count, dm);
    std::fill(dm + g.tiles * e_count * o_count, dm + g.tiles8 * e_count * o_count, 0.0f);
    if (grad_input != nullptr) {
      for (int64_t e = 0; e < e_count; ++e) {  // dV[t][e][c] = sum over o of dM[t][e][o] U[e][o][c]
        product(g.tiles8, c_count, o_count, dm + e * o_count, e_count * o_count, 1, u + e * o_count * c_count,
                c_count, v + e * c_count, e_count * c_count, false);
      }
      std::fill(pad, pad + k.images * g.in_rows * g.in_cols * c_count, 0.0f);
      grad_input_transform<F, M, A>(v, tl, g, k.images, c_count, pad);
      to_channels_first(pad, k.images, c_count, p.height, p.width, g.in_rows, g.in_cols, p.pad_h, p.pad_w, nullptr,
                        grad_input + k.n0 * c_count * p.height * p.width);
    }
    if (grad_weight != nullptr) {
      to_channels_last(input + k.n0 * c_count * p.height * p.width, k.images, c_count, p.height, p.width, g.in_rows,
                       g.in_cols, p.pad_h, p.pad_w, pad);
      input_transform<F, M, A>(pad, tl, g, k.images, c_count, v);
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
#endif  // LOOM_WINOGRAD_CHANNELS_LAST

}  // namespace

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

int tile_for(const Problem& p) {
  // Read once: the variable, and whether this CPU has AVX2/FMA (the transforms' kernels).
  static const bool enabled = [] {
    const char* value = std::getenv("LOOM_CPU_WINOGRAD");
    if (value != nullptr && std::string(value) != "0" && std::string(value) != "1") {
      LOOM_FAIL("LOOM_CPU_WINOGRAD must be 0 (im2col + GEMM for every convolution) or 1 (Winograd where it pays, the "
                "default), not '", value, "'");
    }
    return (value == nullptr || std::string(value) == "1") && gemm_kernel_supported(GemmKernel::avx2_fma);
  }();
  if (!enabled) return 0;
  // 3x3 and 5x5 kernels on planes of at least 8x8 with enough channels for
  // the GEMMs to dominate.
  if (p.kernel != 3 && p.kernel != 5) return 0;
  if (p.channels < 8 || p.out_channels < 8) return 0;
  if (p.out_h >= 8 && p.out_w >= 8) return 4;
  // Smaller planes (down to 4x4) with many channels: F(2x2, 3x3), whose
  // transformed weight is 16/9 of the weight and whose 2x2 tiles fill a 4x4
  // plane. On ResNet-50's layer4 at 32x32 inputs (512 channels, 4x4) it ran
  // faster than im2col + GEMM and than F(4x4, 3x3), one tile per plane and a
  // weight 4x the size. (Measured:
  // benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md.)
  if (p.kernel == 3 && p.out_h >= 4 && p.out_w >= 4 && p.channels >= 512 && p.out_channels >= 512) return 2;
  return 0;
}

void forward(const float* input, const float* weight, const float* bias, const Problem& p, int m, float* output) {
#if LOOM_WINOGRAD_CHANNELS_LAST
  if (channels_last(p, m)) {
    return p.kernel == 3 ? cl_forward<4, 3>(input, weight, bias, p, output)
                         : cl_forward<4, 5>(input, weight, bias, p, output);
  }
#endif
  const Transforms& t = transforms(m, static_cast<int>(p.kernel));
  const int64_t alpha = t.alpha, o_count = p.out_channels, c_count = p.channels;
  const std::vector<PackedA<float>> u = packed_transformed_weight(weight, p, t, Transpose::no);
  for_each_chunk(p, m, plan(p, m), [&](int64_t, const Chunk& k) {
    const int64_t ct = c_count * k.ld, ot = o_count * k.ld;
    const float* v = transformed_input(input, p, t, k);
    float* product = scratch(WinogradSlot::product, alpha * alpha * ot);  // M[ξ][ν][o][t]
    for (int64_t e = 0; e < alpha * alpha; ++e) {
      gemm(u[e], Transpose::no, k.tiles, 1.0f, v + e * ct, k.ld, 0.0f, product + e * ot, k.ld);
    }
    float* y = scratch(WinogradSlot::output_tiles, m * m * ot);  // Y[a][b][o][t]
    transform_2d(t, Which::at, alpha, m, o_count, k, product, scratch(WinogradSlot::output_half, alpha * m * ot), y);
    planes_of(y, bias, output_planes(p, t), p, t, k, output + k.n0 * o_count * p.out_h * p.out_w);
  });
}

void backward(const float* grad_output, const float* input, const float* weight, const Problem& p, int m,
              float* grad_input, float* grad_weight) {
#if LOOM_WINOGRAD_CHANNELS_LAST
  if (channels_last(p, m)) {
    return p.kernel == 3 ? cl_backward<4, 3>(grad_output, input, weight, p, grad_input, grad_weight)
                         : cl_backward<4, 5>(grad_output, input, weight, p, grad_input, grad_weight);
  }
#endif
  const Transforms& t = transforms(m, static_cast<int>(p.kernel));
  const int64_t alpha = t.alpha, o_count = p.out_channels, c_count = p.channels;
  const int64_t size = alpha * alpha * o_count * c_count;
  const std::vector<PackedA<float>> ut =
      grad_input != nullptr
          ? packed_transformed_weight(weight, p, t, Transpose::yes)
          : std::vector<PackedA<float>>();
  const Plan chunks = plan(p, m);
  // dU[ξ][ν][o][c] per task, summed in task order afterwards (the same sum
  // whatever the timing). A task's first chunk overwrites its sum.
  float* partials =
      grad_weight != nullptr ? scratch(WinogradSlot::weight_gradient_partials, chunks.tasks * size) : nullptr;
  std::vector<char> started(static_cast<size_t>(chunks.tasks), 0);
  for_each_chunk(p, m, chunks, [&](int64_t task, const Chunk& k) {
    const int64_t ct = c_count * k.ld, ot = o_count * k.ld;
    const float* dm = transformed_grad_output(grad_output, p, t, k);  // the product slot, for both gradients
    if (grad_input != nullptr) {
      float* dv = scratch(WinogradSlot::input_tiles, alpha * alpha * ct);  // dV[ξ][ν][c][t] = Uᵀ dM
      for (int64_t e = 0; e < alpha * alpha; ++e) {
        gemm(ut[e], Transpose::no, k.tiles, 1.0f, dm + e * ot, k.ld, 0.0f, dv + e * ct, k.ld);
      }
      float* dp = dv;  // dP[r][s][c][t]; dV is consumed
      transform_2d(t, Which::b, alpha, alpha, c_count, k, dv, scratch(WinogradSlot::input_half, alpha * alpha * ct),
                   dp);
      planes_of(dp, nullptr, input_planes(p, t), p, t, k, grad_input + k.n0 * c_count * p.height * p.width);
    }
    if (grad_weight != nullptr) {
      const float* v = transformed_input(input, p, t, k);  // input_tiles and input_half, free again here
      float* du = partials + task * size;
      const float beta = started[task] ? 1.0f : 0.0f;
      for (int64_t e = 0; e < alpha * alpha; ++e) {
        gemm(Transpose::no, Transpose::yes, o_count, c_count, k.tiles, 1.0f, dm + e * ot, k.ld, v + e * ct, k.ld,
             beta, du + e * o_count * c_count, c_count);
      }
      started[task] = 1;
    }
  });
  if (grad_weight == nullptr) return;
  sum_task_partials(partials, partials + size, started, size);
  inverse_transform_weight(partials, p, t, grad_weight);
}

void backward_input(const float* grad_output, const float* weight, const Problem& p, int m, float* grad_input) {
  backward(grad_output, nullptr, weight, p, m, grad_input, nullptr);
}

void backward_weight(const float* grad_output, const float* input, const Problem& p, int m, float* grad_weight) {
  backward(grad_output, input, nullptr, p, m, nullptr, grad_weight);
}

}  // namespace loom::ops::cpu::winograd
