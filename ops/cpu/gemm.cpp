// Packed GEMM in the style of BLIS / GotoBLAS: C is computed in MC x NC blocks;
// for each KC slice, B is packed into NR-wide column strips and A into MR-tall
// row strips, and a 6 x 16 register-blocked AVX2/FMA micro-kernel does the
// arithmetic. Packing absorbs the transposes and zero-pads ragged edges.
#include <loom/ops/cpu/gemm.h>

#include <immintrin.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include <loom/core/parallel.h>

namespace loom::ops::cpu {
namespace {

constexpr int64_t kMR = 6;    // rows of C per micro-tile
constexpr int64_t kNR = 16;   // columns of C per micro-tile (two 8-float registers)
constexpr int64_t kKC = 256;  // depth of a packed slice
constexpr int64_t kMC = 96;   // rows of A packed at once (multiple of kMR)
constexpr int64_t kNC = 2048; // columns of B packed at once (multiple of kNR)

bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

// Transposes eight rows of 8 floats in registers: row q of the result holds
// element q of every input row.
__attribute__((target("avx2,fma"))) inline void transpose_8x8_registers(__m256 (&r)[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// Transposes the 8 x 8 block rows[0..8)[0..8) (each row 8 floats apart by
// `stride`) into out[q * out_stride + r] = rows[r][q].
__attribute__((target("avx2,fma"))) inline void transpose_8x8(const float* in, int64_t stride, float* out,
                                                               int64_t out_stride) {
  __m256 r[8];
  for (int q = 0; q < 8; ++q) r[q] = _mm256_loadu_ps(in + q * stride);
  transpose_8x8_registers(r);
  for (int q = 0; q < 8; ++q) _mm256_storeu_ps(out + q * out_stride, r[q]);
}

// pack_a's full strips of a non-transposed A: six rows, eight values of each
// at a time, transposed in registers (two zero rows fill the block). Each
// column of six is stored as 8 floats, the last two overwritten by the next
// column; the strip's last store reaches 2 floats past it (packed_a has room).
__attribute__((target("avx2,fma"))) void pack_a_strip_rows(const float* rows, int64_t lda, int64_t depth,
                                                            float* packed) {
  int64_t p = 0;
  for (; p + 8 <= depth; p += 8) {
    __m256 r[8];
    for (int q = 0; q < kMR; ++q) r[q] = _mm256_loadu_ps(rows + q * lda + p);
    r[6] = r[7] = _mm256_setzero_ps();
    transpose_8x8_registers(r);
    for (int q = 0; q < 8; ++q) _mm256_storeu_ps(packed + (p + q) * kMR, r[q]);
  }
  for (; p < depth; ++p) {
    for (int64_t q = 0; q < kMR; ++q) packed[p * kMR + q] = rows[q * lda + p];
  }
}

// pack_a's full strips of a transposed A (stored (k, m)): each p's six values
// are contiguous, loaded with a 6-lane mask and stored as 8 floats, the last
// two overwritten by the next p (the strip's last store reaches 2 floats past
// it, as in pack_a_strip_rows). The backward-input GEMMs of conv2d and linear
// (Wᵀ · dY) pack A this way; element by element it cost as much as a GEMM
// with a few dozen columns spends in its micro-kernel.
__attribute__((target("avx2,fma"))) void pack_a_strip_columns(const float* columns, int64_t lda, int64_t depth,
                                                               float* packed) {
  const __m256i six = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
  for (int64_t p = 0; p < depth; ++p) _mm256_storeu_ps(packed + p * kMR, _mm256_maskload_ps(columns + p * lda, six));
}

// Packs op(A)[row0 .. row0+rows, p0 .. p0+depth] as MR-tall strips:
// packed[strip][p][r], zero beyond `rows`. One loop per storage order, so the
// inner loops read memory in order.
void pack_a(Transpose t, const float* a, int64_t lda, int64_t row0, int64_t rows, int64_t p0, int64_t depth,
            float* packed) {
  for (int64_t strip = 0; strip < rows; strip += kMR) {
    const int64_t height = std::min(kMR, rows - strip);
    if (height < kMR) std::fill(packed, packed + depth * kMR, 0.0f);
    if (t == Transpose::no && height == kMR) {
      pack_a_strip_rows(a + (row0 + strip) * lda + p0, lda, depth, packed);
    } else if (height == kMR) {
      pack_a_strip_columns(a + p0 * lda + row0 + strip, lda, depth, packed);
    } else if (t == Transpose::no) {
      // A is (m, k): row i of the strip is contiguous in p.
      for (int64_t r = 0; r < height; ++r) {
        const float* row = a + (row0 + strip + r) * lda + p0;
        for (int64_t p = 0; p < depth; ++p) packed[p * kMR + r] = row[p];
      }
    } else {
      // A is stored (k, m): for each p the strip's rows are contiguous.
      for (int64_t p = 0; p < depth; ++p) {
        const float* column = a + (p0 + p) * lda + row0 + strip;
        for (int64_t r = 0; r < height; ++r) packed[p * kMR + r] = column[r];
      }
    }
    packed += depth * kMR;
  }
}

// Packs op(B)[p0 .. p0+depth, col0 .. col0+cols] as NR-wide strips:
// packed[strip][p][c], zero beyond `cols`.
__attribute__((target("avx2,fma"))) void pack_b(Transpose t, const float* b, int64_t ldb, int64_t p0, int64_t depth,
                                                int64_t col0, int64_t cols, float* packed) {
  for (int64_t strip = 0; strip < cols; strip += kNR) {
    const int64_t width = std::min(kNR, cols - strip);
    if (width < kNR) std::fill(packed, packed + depth * kNR, 0.0f);
    if (t == Transpose::no) {
      // B is (k, n): each p contributes `width` contiguous values.
      for (int64_t p = 0; p < depth; ++p) {
        const float* row = b + (p0 + p) * ldb + col0 + strip;
        float* out = packed + p * kNR;
        if (width == kNR) {
          for (int64_t c = 0; c < kNR; ++c) out[c] = row[c];
        } else {
          for (int64_t c = 0; c < width; ++c) out[c] = row[c];
        }
      }
    } else {
      // B is stored (n, k): column c of the strip is contiguous in p. Full
      // strips go through 8 x 8 register transposes, the rest element-wise.
      const float* columns = b + (col0 + strip) * ldb + p0;
      int64_t p = 0;
      if (width == kNR) {
        for (; p + 8 <= depth; p += 8) {
          transpose_8x8(columns + p, ldb, packed + p * kNR, kNR);
          transpose_8x8(columns + 8 * ldb + p, ldb, packed + p * kNR + 8, kNR);
        }
      }
      for (int64_t c = 0; c < width; ++c) {
        const float* column = columns + c * ldb;
        for (int64_t q = p; q < depth; ++q) packed[q * kNR + c] = column[q];
      }
    }
    packed += depth * kNR;
  }
}

// One row of the micro-tile: (low, high) += a_value * (b0, b1), the 16 columns
// of B's current row in two registers. Inlined: the accumulators stay in registers.
__attribute__((target("avx2,fma"), always_inline)) inline void fma_row(float a_value, __m256 b0, __m256 b1,
                                                                       __m256& low, __m256& high) {
  const __m256 av = _mm256_set1_ps(a_value);
  low = _mm256_fmadd_ps(av, b0, low);
  high = _mm256_fmadd_ps(av, b1, high);
}

// C tile (rows x cols <= 6 x 16) = alpha * A_strip · B_strip + beta * C tile;
// with `transposed_c` the tile is stored transposed (element (r, col) at
// c[col * ldc + r]), for problems computed as Cᵀ = Bᵀ Aᵀ.
// alpha and beta arrive through memory: as float arguments they would pin a
// vector register for the whole loop and force an accumulator to spill.
// `b_stride` is the distance between B's rows: kNR when packed, ldb when
// the strip is read in place.
__attribute__((target("avx2,fma"))) void micro_kernel_avx2(int64_t depth, const float* a, const float* b,
                                                            int64_t b_stride, float* c, int64_t ldc,
                                                            const float* alpha_beta, int64_t rows, int64_t cols,
                                                            bool transposed_c) {
  __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
  __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(), c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
  __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps(), c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
  for (int64_t p = 0; p < depth; ++p) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
    fma_row(a[0], b0, b1, c00, c01);
    fma_row(a[1], b0, b1, c10, c11);
    fma_row(a[2], b0, b1, c20, c21);
    fma_row(a[3], b0, b1, c30, c31);
    fma_row(a[4], b0, b1, c40, c41);
    fma_row(a[5], b0, b1, c50, c51);
    a += kMR;
    b += b_stride;
  }
  const __m256 accumulators[kMR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  const float alpha = alpha_beta[0], beta = alpha_beta[1];
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
  if (rows == kMR && cols == kNR && !transposed_c) {
    for (int64_t r = 0; r < kMR; ++r) {
      float* out = c + r * ldc;
      for (int half = 0; half < 2; ++half) {
        __m256 v = _mm256_mul_ps(va, accumulators[r][half]);
        if (beta != 0.0f) v = _mm256_fmadd_ps(vb, _mm256_loadu_ps(out + 8 * half), v);
        _mm256_storeu_ps(out + 8 * half, v);
      }
    }
    return;
  }
  alignas(32) float tile[kMR][kNR];
  for (int64_t r = 0; r < kMR; ++r) {
    _mm256_store_ps(tile[r], accumulators[r][0]);
    _mm256_store_ps(tile[r] + 8, accumulators[r][1]);
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t col = 0; col < cols; ++col) {
      float& out = transposed_c ? c[col * ldc + r] : c[r * ldc + col];
      out = alpha * tile[r][col] + (beta != 0.0f ? beta * out : 0.0f);
    }
  }
}

// Whether a non-transposed B with rows `ldb` floats apart can be read in
// place. Its micro-strip is KC rows of one 64-byte line each; when ldb is a
// multiple of a large power of two those lines fall into a few of L1's 64
// sets and evict each other (1024-float rows: 4x slower), so such B is packed.
bool b_readable_in_place(Transpose tb, int64_t ldb) {
  if (tb != Transpose::no) return false;
  return ldb % 16 != 0 || std::gcd<int64_t>(ldb / 16, 64) <= 2;
}

// With `transposed_c`, C is stored transposed: the caller computes Cᵀ.
// A non-transposed B is read in place, 16 columns at a time, rows ldb apart
// (the micro-kernel's 16 x KC strip of it stays in L1 across A's strips as a
// packed one would); only a ragged last strip is packed, with zeros.
// With `shared_b`, B was packed beforehand for the whole problem (see
// pack_b_whole) and is read from there: threads that split A's rows share one
// packing of B instead of each packing all of it.
void gemm_packed_f32(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                     int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, bool transposed_c,
                     const float* shared_b = nullptr) {
  thread_local std::vector<float> packed_a, packed_b;
  packed_a.resize(static_cast<size_t>(kMC * kKC + 8));  // + the overhang of pack_a_strip_rows
  const bool direct_b = shared_b == nullptr && b_readable_in_place(tb, ldb);
  const int64_t n_padded = (n + kNR - 1) / kNR * kNR;
  for (int64_t jc = 0; jc < n; jc += kNC) {
    const int64_t nc = std::min(kNC, n - jc);
    const int64_t nc_padded = (nc + kNR - 1) / kNR * kNR;
    const int64_t full_strips_end = direct_b ? nc / kNR * kNR : 0;  // columns read in place
    if (shared_b == nullptr) packed_b.resize(static_cast<size_t>((nc_padded - full_strips_end) * kKC));
    for (int64_t pc = 0; pc < k; pc += kKC) {
      const int64_t kc = std::min(kKC, k - pc);
      const float alpha_beta[2] = {alpha, pc == 0 ? beta : 1.0f};
      // This (jc, pc) block's strips: in the shared packing, or packed here.
      const float* block_b = shared_b != nullptr ? shared_b + pc * n_padded + jc * kc : packed_b.data();
      if (shared_b == nullptr && full_strips_end < nc) {
        pack_b(tb, b, ldb, pc, kc, jc + full_strips_end, nc - full_strips_end, packed_b.data());
      }
      for (int64_t ic = 0; ic < m; ic += kMC) {
        const int64_t mc = std::min(kMC, m - ic);
        pack_a(ta, a, lda, ic, mc, pc, kc, packed_a.data());
        for (int64_t jr = 0; jr < nc; jr += kNR) {
          const bool in_place = jr < full_strips_end;
          const float* b_strip = in_place ? b + pc * ldb + jc + jr
                                          : block_b + ((jr - full_strips_end) / kNR) * kc * kNR;
          const int64_t b_stride = in_place ? ldb : kNR;
          for (int64_t ir = 0; ir < mc; ir += kMR) {
            float* tile = transposed_c ? c + (jc + jr) * ldc + ic + ir : c + (ic + ir) * ldc + jc + jr;
            micro_kernel_avx2(kc, packed_a.data() + (ir / kMR) * kc * kMR, b_strip, b_stride, tile, ldc, alpha_beta,
                              std::min(kMR, mc - ir), std::min(kNR, nc - jr), transposed_c);
          }
        }
      }
    }
  }
}

template <class T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using StridedMap = Eigen::Map<RowMajor<T>, 0, Eigen::OuterStride<>>;
template <class T>
using ConstStridedMap = Eigen::Map<const RowMajor<T>, 0, Eigen::OuterStride<>>;

template <class T>
void gemm_eigen(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  StridedMap<T> cm(c, m, n, Eigen::OuterStride<>(ldc));
  if (beta == T(0)) {
    cm.setZero();
  } else if (beta != T(1)) {
    cm *= beta;
  }
  if (k == 0) return;
  const ConstStridedMap<T> am(a, ta == Transpose::no ? m : k, ta == Transpose::no ? k : m, Eigen::OuterStride<>(lda));
  const ConstStridedMap<T> bm(b, tb == Transpose::no ? k : n, tb == Transpose::no ? n : k, Eigen::OuterStride<>(ldb));
  if (ta == Transpose::no && tb == Transpose::no) cm.noalias() += alpha * am * bm;
  if (ta == Transpose::no && tb == Transpose::yes) cm.noalias() += alpha * am * bm.transpose();
  if (ta == Transpose::yes && tb == Transpose::no) cm.noalias() += alpha * am.transpose() * bm;
  if (ta == Transpose::yes && tb == Transpose::yes) cm.noalias() += alpha * am.transpose() * bm.transpose();
}

// Splits the rows of C over the thread team when the problem is big enough.
template <class T, class Fn>
void split_rows(int64_t m, int64_t n, int64_t k, Transpose ta, const T* a, int64_t lda, T* c, int64_t ldc, Fn&& fn) {
  const int64_t work = m * n * k;
  if (in_parallel_region() || get_num_threads() == 1 || work < (int64_t{1} << 21) || m < 2 * kMR) {
    fn(m, a, c);
    return;
  }
  const int64_t rows_per_grain = std::max<int64_t>(kMR, (int64_t{1} << 20) / std::max<int64_t>(n * k, 1));
  parallel_for(0, m, rows_per_grain, [&](int64_t begin, int64_t end) {
    const T* a_rows = ta == Transpose::no ? a + begin * lda : a + begin;
    fn(end - begin, a_rows, c + begin * ldc);
  });
}

}  // namespace

const char* gemm_kernel_name() { return cpu_has_avx2_fma() ? "avx2-fma" : "eigen"; }

void gemm(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (!cpu_has_avx2_fma() || k == 0) {
    split_rows(m, n, k, ta, a, lda, c, ldc, [&](int64_t rows, const float* a_rows, float* c_rows) {
      gemm_eigen<float>(ta, tb, rows, n, k, alpha, a_rows, lda, b, ldb, beta, c_rows, ldc);
    });
    return;
  }
  // The 6 x 16 tiles fit some shapes badly (m = 32: the sixth strip is a
  // third full). Cᵀ = op(B)ᵀ op(A)ᵀ swaps the roles of m and n; take the
  // orientation that wastes fewer tile slots. Packing a transposed B costs a
  // pass over it that an in-place B does not: an orientation whose B is read
  // in place wins unless it wastes a quarter more tile slots.
  auto slots = [](int64_t rows, int64_t cols) {
    return ((rows + kMR - 1) / kMR * kMR) * ((cols + kNR - 1) / kNR * kNR);
  };
  const Transpose flip_a = ta == Transpose::no ? Transpose::yes : Transpose::no;
  const Transpose flip_b = tb == Transpose::no ? Transpose::yes : Transpose::no;
  const double cost_as_is = slots(m, n) * (b_readable_in_place(tb, ldb) ? 1.0 : 1.25);
  const double cost_flipped = slots(n, m) * (b_readable_in_place(flip_a, lda) ? 1.0 : 1.25);
  const bool flipped = cost_flipped < cost_as_is;
  // The problem as computed: C' (m' x n') = op(A') op(B'), C' = C or Cᵀ.
  const Transpose ta2 = flipped ? flip_b : ta, tb2 = flipped ? flip_a : tb;
  const int64_t m2 = flipped ? n : m, n2 = flipped ? m : n;
  const float* a2 = flipped ? b : a;
  const float* b2 = flipped ? a : b;
  const int64_t lda2 = flipped ? ldb : lda, ldb2 = flipped ? lda : ldb;
  const int64_t threads = in_parallel_region() ? 1 : get_num_threads();
  if (threads == 1 || m * n * k < (int64_t{1} << 21) || m2 < 2 * kMR) {
    gemm_packed_f32(ta2, tb2, m2, n2, k, alpha, a2, lda2, b2, ldb2, beta, c, ldc, flipped);
    return;
  }
  // Rows of C' split over the threads in whole 6-row strips. A B that must
  // be packed is packed once, by all threads together, for all of them.
  const float* shared_b = nullptr;
  if (!b_readable_in_place(tb2, ldb2)) {
    const int64_t n_padded = (n2 + kNR - 1) / kNR * kNR;
    thread_local std::vector<float> whole_b;
    whole_b.resize(static_cast<size_t>(n_padded * k));
    float* whole = whole_b.data();  // the lambda runs on other threads, whose whole_b is another vector
    // Slice pc (depth kc) holds its strips at whole_b + pc * n_padded, each
    // strip kc x kNR: the layout gemm_packed_f32 reads with `shared_b`.
    const int64_t slices = (k + kKC - 1) / kKC, strips = n_padded / kNR;
    parallel_for(0, slices * strips, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t pc = (task / strips) * kKC, strip = task % strips;
        const int64_t kc = std::min(kKC, k - pc), col0 = strip * kNR;
        pack_b(tb2, b2, ldb2, pc, kc, col0, std::min(kNR, n2 - col0), whole + pc * n_padded + col0 * kc);
      }
    });
    shared_b = whole;
  }
  const int64_t strips_of_rows = (m2 + kMR - 1) / kMR;
  parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t row0 = std::min(m2, strips_of_rows * t / threads * kMR);
      const int64_t row1 = std::min(m2, strips_of_rows * (t + 1) / threads * kMR);
      if (row0 >= row1) continue;
      const float* a_rows = ta2 == Transpose::no ? a2 + row0 * lda2 : a2 + row0;
      float* c_rows = flipped ? c + row0 : c + row0 * ldc;
      gemm_packed_f32(ta2, tb2, row1 - row0, n2, k, alpha, a_rows, lda2, b2, ldb2, beta, c_rows, ldc, flipped,
                      shared_b);
    }
  });
}

void gemm(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  split_rows(m, n, k, ta, a, lda, c, ldc, [&](int64_t rows, const double* a_rows, double* c_rows) {
    gemm_eigen<double>(ta, tb, rows, n, k, alpha, a_rows, lda, b, ldb, beta, c_rows, ldc);
  });
}

}  // namespace loom::ops::cpu
