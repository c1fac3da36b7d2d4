// Packed GEMM in the style of BLIS / GotoBLAS: C is computed in MC x NC blocks;
// for each KC slice, B is packed into NR-wide column strips and A into MR-tall
// row strips, and a register-blocked micro-kernel does the arithmetic: 8 x 32
// with AVX-512 (sixteen 16-float accumulators: two vector loads of B and eight
// broadcasts of A feed 16 FMAs) or 6 x 16 with AVX2/FMA (twelve 8-float ones).
// Packing absorbs the transposes and zero-pads ragged edges; where it would
// not pay, full strips are read where they lie (B whose rows do not alias in
// L1; A for products of few columns). The kernel is chosen at run time: the
// widest the CPU has, or the one LOOM_CPU_GEMM names.
#include <loom/ops/cpu/gemm.h>

#include <immintrin.h>

#include <Eigen/Dense>
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/core/error.h>
#include <loom/core/parallel.h>

namespace loom::ops::cpu {
namespace {

constexpr int64_t kKC = 256;   // depth of a packed slice
constexpr int64_t kMC = 96;    // rows of A packed at once (a multiple of every MR)
constexpr int64_t kNC = 2048;  // columns of B packed at once (a multiple of every NR)
constexpr int64_t kInPlaceAColumns = 128;     // see a_readable_in_place
constexpr int64_t kInPlaceARowsColumns = 64;  // likewise

bool cpu_has(GemmKernel kernel) {
  static const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  // __builtin_cpu_supports also checks that the OS saves the 512-bit registers.
  static const bool avx512 = avx2_fma && __builtin_cpu_supports("avx512f");
  switch (kernel) {
    case GemmKernel::avx512: return avx512;
    case GemmKernel::avx2_fma: return avx2_fma;
    case GemmKernel::eigen: return true;
  }
  return false;
}

// LOOM_CPU_GEMM as read at the first use: the kernel it names (the widest
// this CPU has when unset), or the error to report.
struct EnvironmentKernel {
  GemmKernel kernel = GemmKernel::eigen;
  std::string error;  // "" when the variable is unset or valid
};

const EnvironmentKernel& environment_kernel() {
  static const EnvironmentKernel parsed = [] {
    EnvironmentKernel result;
    result.kernel = cpu_has(GemmKernel::avx512)     ? GemmKernel::avx512
                    : cpu_has(GemmKernel::avx2_fma) ? GemmKernel::avx2_fma
                                                    : GemmKernel::eigen;
    const char* value = std::getenv("LOOM_CPU_GEMM");
    if (value == nullptr || *value == '\0') return result;
    for (GemmKernel kernel : {GemmKernel::avx512, GemmKernel::avx2_fma, GemmKernel::eigen}) {
      if (std::string(value) != gemm_kernel_name(kernel)) continue;
      if (!cpu_has(kernel)) result.error = str("LOOM_CPU_GEMM=", value, ": this CPU does not have ", value);
      result.kernel = kernel;
      return result;
    }
    result.error = str("LOOM_CPU_GEMM must be avx512, avx2-fma or eigen (the f32 GEMM kernel), not '", value, "'");
    return result;
  }();
  return parsed;
}

constexpr int kNoOverride = -1;
std::atomic<int> kernel_override{kNoOverride};  // set_gemm_kernel's choice

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

// pack_a's full strips of a non-transposed A: MR (at most 8) rows, eight
// values of each at a time, transposed in registers (zero rows fill the block
// when MR < 8). Each column of MR is stored as 8 floats, the rest overwritten
// by the next column; the strip's last store reaches 8 - MR floats past it
// (packed_a has room).
template <int64_t MR>
__attribute__((target("avx2,fma"))) void pack_a_strip_rows(const float* rows, int64_t lda, int64_t depth,
                                                            float* packed) {
  static_assert(MR <= 8);
  int64_t p = 0;
  for (; p + 8 <= depth; p += 8) {
    __m256 r[8];
    for (int q = 0; q < MR; ++q) r[q] = _mm256_loadu_ps(rows + q * lda + p);
    for (int q = MR; q < 8; ++q) r[q] = _mm256_setzero_ps();
    transpose_8x8_registers(r);
    for (int q = 0; q < 8; ++q) _mm256_storeu_ps(packed + (p + q) * MR, r[q]);
  }
  for (; p < depth; ++p) {
    for (int64_t q = 0; q < MR; ++q) packed[p * MR + q] = rows[q * lda + p];
  }
}

// pack_a's full strips of a transposed A (stored (k, m)): each p's MR values
// are contiguous, loaded (with a lane mask when MR < 8) and stored as 8
// floats, the rest overwritten by the next p (the strip's last store reaches
// 8 - MR floats past it, as in pack_a_strip_rows). The backward-input GEMMs of
// conv2d and linear (Wᵀ · dY) pack A this way; element by element it cost as
// much as a GEMM with a few dozen columns spends in its micro-kernel.
template <int64_t MR>
__attribute__((target("avx2,fma"))) void pack_a_strip_columns(const float* columns, int64_t lda, int64_t depth,
                                                               float* packed) {
  static_assert(MR == 6 || MR == 8);
  if constexpr (MR == 8) {
    for (int64_t p = 0; p < depth; ++p) _mm256_storeu_ps(packed + p * MR, _mm256_loadu_ps(columns + p * lda));
  } else {
    const __m256i six = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
    for (int64_t p = 0; p < depth; ++p) _mm256_storeu_ps(packed + p * MR, _mm256_maskload_ps(columns + p * lda, six));
  }
}

// Packs op(A)[row0 .. row0+rows, p0 .. p0+depth] as MR-tall strips:
// packed[strip][p][r], zero beyond `rows`. One loop per storage order, so the
// inner loops read memory in order.
template <int64_t MR>
void pack_a(Transpose t, const float* a, int64_t lda, int64_t row0, int64_t rows, int64_t p0, int64_t depth,
            float* packed) {
  for (int64_t strip = 0; strip < rows; strip += MR) {
    const int64_t height = std::min(MR, rows - strip);
    if (height < MR) std::fill(packed, packed + depth * MR, 0.0f);
    if (t == Transpose::no && height == MR) {
      pack_a_strip_rows<MR>(a + (row0 + strip) * lda + p0, lda, depth, packed);
    } else if (height == MR) {
      pack_a_strip_columns<MR>(a + p0 * lda + row0 + strip, lda, depth, packed);
    } else if (t == Transpose::no) {
      // A is (m, k): row i of the strip is contiguous in p.
      for (int64_t r = 0; r < height; ++r) {
        const float* row = a + (row0 + strip + r) * lda + p0;
        for (int64_t p = 0; p < depth; ++p) packed[p * MR + r] = row[p];
      }
    } else {
      // A is stored (k, m): for each p the strip's rows are contiguous.
      for (int64_t p = 0; p < depth; ++p) {
        const float* column = a + (p0 + p) * lda + row0 + strip;
        for (int64_t r = 0; r < height; ++r) packed[p * MR + r] = column[r];
      }
    }
    packed += depth * MR;
  }
}

// Packs op(B)[p0 .. p0+depth, col0 .. col0+cols] as NR-wide strips:
// packed[strip][p][c], zero beyond `cols`.
template <int64_t NR>
__attribute__((target("avx2,fma"))) void pack_b(Transpose t, const float* b, int64_t ldb, int64_t p0, int64_t depth,
                                                int64_t col0, int64_t cols, float* packed) {
  static_assert(NR % 8 == 0);
  if (t == Transpose::no && cols >= 2 * NR) {
    // Whole strips, a band of rows at a time across all of them: strip by
    // strip, every row of a strip is a new page when ldb is a large power of
    // two (NCHW planes of 1024), which the hardware prefetcher does not
    // follow; across the strips each row is read in order.
    constexpr int64_t kBand = 8;
    const int64_t whole = cols / NR;
    for (int64_t p1 = 0; p1 < depth; p1 += kBand) {
      const int64_t p2 = std::min(depth, p1 + kBand);
      for (int64_t strip = 0; strip < whole; ++strip) {
        float* out = packed + strip * depth * NR;
        for (int64_t p = p1; p < p2; ++p) {
          const float* row = b + (p0 + p) * ldb + col0 + strip * NR;
          for (int64_t c = 0; c < NR; ++c) out[p * NR + c] = row[c];
        }
      }
    }
    if (whole * NR == cols) return;
    packed += whole * depth * NR;
    col0 += whole * NR;
    cols -= whole * NR;
  }
  for (int64_t strip = 0; strip < cols; strip += NR) {
    const int64_t width = std::min(NR, cols - strip);
    if (width < NR) std::fill(packed, packed + depth * NR, 0.0f);
    if (t == Transpose::no) {
      // B is (k, n): each p contributes `width` contiguous values.
      for (int64_t p = 0; p < depth; ++p) {
        const float* row = b + (p0 + p) * ldb + col0 + strip;
        float* out = packed + p * NR;
        if (width == NR) {
          for (int64_t c = 0; c < NR; ++c) out[c] = row[c];
        } else {
          for (int64_t c = 0; c < width; ++c) out[c] = row[c];
        }
      }
    } else {
      // B is stored (n, k): column c of the strip is contiguous in p. Whole
      // groups of 8 columns go through 8 x 8 register transposes, the rest
      // (a ragged strip's last columns, the depth's tail) element-wise. (The
      // ConvNet's first convolution has a weight gradient of 25 columns:
      // element by element, its packing cost as much as its arithmetic.)
      // Group by group, so that 8 rows of B are read at a time, not all NR:
      // with rows 1024 floats apart (a 32 x 32 plane's weight gradient) that
      // was faster than the other order (measured in
      // benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md).
      const float* columns = b + (col0 + strip) * ldb + p0;
      const int64_t grouped = width / 8 * 8, depth8 = depth / 8 * 8;
      for (int64_t group = 0; group < grouped; group += 8) {
        for (int64_t p = 0; p < depth8; p += 8) {
          transpose_8x8(columns + group * ldb + p, ldb, packed + p * NR + group, NR);
        }
      }
      for (int64_t c = 0; c < width; ++c) {
        const float* column = columns + c * ldb;
        for (int64_t q = c < grouped ? depth8 : 0; q < depth; ++q) packed[q * NR + c] = column[q];
      }
    }
    packed += depth * NR;
  }
}

// Both micro-kernels compute
//   C tile (rows x cols <= MR x NR) = alpha * A_strip · B_strip + beta * C tile;
// with `transposed_c` the tile is stored transposed (element (r, col) at
// c[col * ldc + r]), for problems computed as Cᵀ = Bᵀ Aᵀ.
// alpha and beta arrive through memory: as float arguments they would pin a
// vector register for the whole loop and force an accumulator to spill.
// `b_stride` is the distance between B's rows: NR when packed, ldb when
// the strip is read in place; `a_stride` likewise between A's depth steps
// (MR when packed, lda for a transposed A read in place). The accumulators
// are named variables, not an array, so that the compiler keeps every one in
// a register.

// The slow path of both micro-kernels: C tile = alpha * tile + beta * C tile
// for the `rows` x `cols` corner of a micro-tile spilled to memory (rows of
// `nr` floats), stored transposed when `transposed_c`.
void store_tile(const float* tile, int64_t nr, int64_t rows, int64_t cols, float* c, int64_t ldc, float alpha,
                float beta, bool transposed_c) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t col = 0; col < cols; ++col) {
      float& out = transposed_c ? c[col * ldc + r] : c[r * ldc + col];
      out = alpha * tile[r * nr + col] + (beta != 0.0f ? beta * out : 0.0f);
    }
  }
}

// One row of the AVX2 micro-tile: (low, high) += a_value * (b0, b1), the 16
// columns of B's current row in two registers.
__attribute__((target("avx2,fma"), always_inline)) inline void fma_row(float a_value, __m256 b0, __m256 b1,
                                                                       __m256& low, __m256& high) {
  const __m256 av = _mm256_set1_ps(a_value);
  low = _mm256_fmadd_ps(av, b0, low);
  high = _mm256_fmadd_ps(av, b1, high);
}

// 6 x 16: twelve 8-float accumulators.
__attribute__((target("avx2,fma"))) void micro_kernel_avx2(int64_t depth, const float* a, int64_t a_stride,
                                                            const float* b, int64_t b_stride, float* c, int64_t ldc,
                                                            const float* alpha_beta, int64_t rows, int64_t cols,
                                                            bool transposed_c) {
  constexpr int64_t mr = 6, nr = 16;
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
    a += a_stride;
    b += b_stride;
  }
  const __m256 accumulators[mr][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  const float alpha = alpha_beta[0], beta = alpha_beta[1];
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
  if (rows == mr && cols == nr && !transposed_c) {
    for (int64_t r = 0; r < mr; ++r) {
      float* out = c + r * ldc;
      for (int half = 0; half < 2; ++half) {
        __m256 v = _mm256_mul_ps(va, accumulators[r][half]);
        if (beta != 0.0f) v = _mm256_fmadd_ps(vb, _mm256_loadu_ps(out + 8 * half), v);
        _mm256_storeu_ps(out + 8 * half, v);
      }
    }
    return;
  }
  alignas(32) float tile[mr][nr];
  for (int64_t r = 0; r < mr; ++r) {
    _mm256_store_ps(tile[r], accumulators[r][0]);
    _mm256_store_ps(tile[r] + 8, accumulators[r][1]);
  }
  store_tile(&tile[0][0], nr, rows, cols, c, ldc, alpha, beta, transposed_c);
}

// One row of the AVX-512 micro-tile: (low, high) += a_value * (b0, b1), the
// 32 columns of B's current row in two registers.
__attribute__((target("avx512f"), always_inline)) inline void fma_row(float a_value, __m512 b0, __m512 b1,
                                                                      __m512& low, __m512& high) {
  const __m512 av = _mm512_set1_ps(a_value);
  low = _mm512_fmadd_ps(av, b0, low);
  high = _mm512_fmadd_ps(av, b1, high);
}

// 8 x 32: sixteen 16-float accumulators. A ragged tile that is not
// transposed is loaded and stored with lane masks, so it costs no more than
// a full one and never touches C beyond its `cols` columns.
// With kRowsInPlace, A's strip is 8 rows of a row-major A read in place,
// `a_stride` (lda) apart, each contiguous over the depth.
template <bool kRowsInPlace>
__attribute__((target("avx512f"))) void micro_kernel_avx512_t(int64_t depth, const float* a, int64_t a_stride,
                                                               const float* b, int64_t b_stride, float* c,
                                                               int64_t ldc, const float* alpha_beta, int64_t rows,
                                                               int64_t cols, bool transposed_c) {
  constexpr int64_t mr = 8, nr = 32;
  __m512 c00 = _mm512_setzero_ps(), c01 = _mm512_setzero_ps(), c10 = _mm512_setzero_ps(), c11 = _mm512_setzero_ps();
  __m512 c20 = _mm512_setzero_ps(), c21 = _mm512_setzero_ps(), c30 = _mm512_setzero_ps(), c31 = _mm512_setzero_ps();
  __m512 c40 = _mm512_setzero_ps(), c41 = _mm512_setzero_ps(), c50 = _mm512_setzero_ps(), c51 = _mm512_setzero_ps();
  __m512 c60 = _mm512_setzero_ps(), c61 = _mm512_setzero_ps(), c70 = _mm512_setzero_ps(), c71 = _mm512_setzero_ps();
  if constexpr (kRowsInPlace) {
    const float* a4 = a + 4 * a_stride;
    const int64_t l1 = a_stride, l2 = 2 * a_stride, l3 = 3 * a_stride;
    for (int64_t p = 0; p < depth; ++p) {
      const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
      fma_row(a[p], b0, b1, c00, c01);
      fma_row(a[l1 + p], b0, b1, c10, c11);
      fma_row(a[l2 + p], b0, b1, c20, c21);
      fma_row(a[l3 + p], b0, b1, c30, c31);
      fma_row(a4[p], b0, b1, c40, c41);
      fma_row(a4[l1 + p], b0, b1, c50, c51);
      fma_row(a4[l2 + p], b0, b1, c60, c61);
      fma_row(a4[l3 + p], b0, b1, c70, c71);
      b += b_stride;
    }
  } else {
    for (int64_t p = 0; p < depth; ++p) {
      const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
      fma_row(a[0], b0, b1, c00, c01);
      fma_row(a[1], b0, b1, c10, c11);
      fma_row(a[2], b0, b1, c20, c21);
      fma_row(a[3], b0, b1, c30, c31);
      fma_row(a[4], b0, b1, c40, c41);
      fma_row(a[5], b0, b1, c50, c51);
      fma_row(a[6], b0, b1, c60, c61);
      fma_row(a[7], b0, b1, c70, c71);
      a += a_stride;
      b += b_stride;
    }
  }
  const __m512 accumulators[mr][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31},
                                      {c40, c41}, {c50, c51}, {c60, c61}, {c70, c71}};
  const float alpha = alpha_beta[0], beta = alpha_beta[1];
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  if (!transposed_c) {
    const auto lanes = [](int64_t n) {
      return static_cast<__mmask16>(n >= 16 ? 0xFFFF : n <= 0 ? 0 : (1u << n) - 1);
    };
    const __mmask16 low = lanes(cols), high = lanes(cols - 16);
    for (int64_t r = 0; r < rows; ++r) {
      float* out = c + r * ldc;
      __m512 v0 = _mm512_mul_ps(va, accumulators[r][0]), v1 = _mm512_mul_ps(va, accumulators[r][1]);
      if (beta != 0.0f) {
        v0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(low, out), v0);
        v1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(high, out + 16), v1);
      }
      _mm512_mask_storeu_ps(out, low, v0);
      _mm512_mask_storeu_ps(out + 16, high, v1);
    }
    return;
  }
  alignas(64) float tile[mr][nr];
  for (int64_t r = 0; r < mr; ++r) {
    _mm512_store_ps(tile[r], accumulators[r][0]);
    _mm512_store_ps(tile[r] + 16, accumulators[r][1]);
  }
  store_tile(&tile[0][0], nr, rows, cols, c, ldc, alpha, beta, /*transposed_c=*/true);
}

// The two packed kernels: their micro-tile and micro-kernel.
struct Avx2Kernel {
  static constexpr int64_t mr = 6, nr = 16;
  static constexpr auto micro_kernel = micro_kernel_avx2;
  static constexpr bool reads_rows_in_place = false;  // no micro_kernel_rows
};
constexpr auto micro_kernel_avx512 = micro_kernel_avx512_t<false>;
struct Avx512Kernel {
  static constexpr int64_t mr = 8, nr = 32;
  static constexpr auto micro_kernel = micro_kernel_avx512;
  // A non-transposed A's strip read in place (rows a_stride apart).
  static constexpr bool reads_rows_in_place = true;
  static constexpr auto micro_kernel_rows = micro_kernel_avx512_t<true>;
};
static_assert(kMC % Avx2Kernel::mr == 0 && kMC % Avx512Kernel::mr == 0);
static_assert(kNC % Avx2Kernel::nr == 0 && kNC % Avx512Kernel::nr == 0);

// Whether a non-transposed B with rows `ldb` floats apart can be read in
// place. Its micro-strip is KC rows of NR / 16 64-byte lines each; when ldb
// is a multiple of a large power of two those rows fall into a few of L1's 64
// sets and evict each other (1024-float rows ran several times slower; see
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md), so such B
// is packed.
bool b_readable_in_place(Transpose tb, int64_t ldb) {
  if (tb != Transpose::no) return false;
  return ldb % 16 != 0 || std::gcd<int64_t>(ldb / 16, 64) <= 2;
}

// Whether A's full strips are read in place, unpacked, for a product of n
// columns: a transposed A (stored k x m, each depth step's MR rows
// contiguous), or a non-transposed A's rows under a kernel that reads them in
// place (`reads_rows`). Packing A pays for itself over many column strips of
// B; with few, each packed element would be used for few multiply-adds (conv2d
// on ResNet-50's small planes: with 32 columns faster in place, with 128 no
// gain for the input gradient and a loss for the forward; measured in
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md).
bool a_readable_in_place(Transpose ta, int64_t n, bool reads_rows) {
  if (ta == Transpose::yes) return n <= kInPlaceAColumns;
  return reads_rows && n <= kInPlaceARowsColumns;
}

}  // namespace

int64_t gemm_b_stride(int64_t columns) {
  return b_readable_in_place(Transpose::no, columns) ? columns : columns + 16;
}

namespace {

// A packed for the whole problem (PackedA): KC slice pc holds its MR-tall
// strips at data + pc * m_padded, those of rows from row0 on at
// + row0 * kc, so that threads splitting the rows read their own.
struct SharedA {
  const float* data;
  int64_t m_padded, row0;
};

// With `transposed_c`, C is stored transposed: the caller computes Cᵀ.
// A non-transposed B is read in place, NR columns at a time, rows ldb apart
// (the micro-kernel's NR x KC strip of it stays in L1 across A's strips as a
// packed one would); only a ragged last strip is packed, with zeros.
// With `shared_b`, B was packed beforehand for the whole problem (see
// gemm_packed) and is read from there: threads that split A's rows share one
// packing of B instead of each packing all of it. With `shared_a`, A was
// packed beforehand (PackedA) and `a` is not read.
template <class Kernel>
void gemm_packed_f32(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                     int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, bool transposed_c,
                     const float* shared_b = nullptr, const SharedA* shared_a = nullptr) {
  constexpr int64_t mr = Kernel::mr, nr = Kernel::nr;
  thread_local std::vector<float> packed_a, packed_b;
  packed_a.resize(static_cast<size_t>(kMC * kKC + 8));  // + the overhang of pack_a_strip_rows
  const bool direct_b = shared_b == nullptr && b_readable_in_place(tb, ldb);
  const bool direct_a = shared_a == nullptr && a_readable_in_place(ta, n, Kernel::reads_rows_in_place);
  const int64_t n_padded = (n + nr - 1) / nr * nr;
  for (int64_t jc = 0; jc < n; jc += kNC) {
    const int64_t nc = std::min(kNC, n - jc);
    const int64_t nc_padded = (nc + nr - 1) / nr * nr;
    const int64_t full_strips_end = direct_b ? nc / nr * nr : 0;  // columns read in place
    if (shared_b == nullptr) packed_b.resize(static_cast<size_t>((nc_padded - full_strips_end) * kKC));
    for (int64_t pc = 0; pc < k; pc += kKC) {
      const int64_t kc = std::min(kKC, k - pc);
      const float alpha_beta[2] = {alpha, pc == 0 ? beta : 1.0f};
      // This (jc, pc) block's strips: in the shared packing, or packed here.
      const float* block_b = shared_b != nullptr ? shared_b + pc * n_padded + jc * kc : packed_b.data();
      if (shared_b == nullptr && full_strips_end < nc) {
        pack_b<nr>(tb, b, ldb, pc, kc, jc + full_strips_end, nc - full_strips_end, packed_b.data());
      }
      for (int64_t ic = 0; ic < m; ic += kMC) {
        const int64_t mc = std::min(kMC, m - ic);
        const int64_t full_strips_rows = direct_a ? mc / mr * mr : 0;  // rows read in place
        const float* block_a = packed_a.data();
        if (shared_a != nullptr) {
          block_a = shared_a->data + pc * shared_a->m_padded + (shared_a->row0 + ic) * kc;
        } else if (full_strips_rows < mc) {
          pack_a<mr>(ta, a, lda, ic + full_strips_rows, mc - full_strips_rows, pc, kc, packed_a.data());
        }
        for (int64_t jr = 0; jr < nc; jr += nr) {
          const bool in_place = jr < full_strips_end;
          const float* b_strip = in_place ? b + pc * ldb + jc + jr
                                          : block_b + ((jr - full_strips_end) / nr) * kc * nr;
          const int64_t b_stride = in_place ? ldb : nr;
          for (int64_t ir = 0; ir < mc; ir += mr) {
            float* tile = transposed_c ? c + (jc + jr) * ldc + ic + ir : c + (ic + ir) * ldc + jc + jr;
            const bool a_in_place = ir < full_strips_rows;
            if constexpr (Kernel::reads_rows_in_place) {
              if (a_in_place && ta == Transpose::no) {
                Kernel::micro_kernel_rows(kc, a + (ic + ir) * lda + pc, lda, b_strip, b_stride, tile, ldc,
                                          alpha_beta, mr, std::min(nr, nc - jr), transposed_c);
                continue;
              }
            }
            const float* a_strip =
                a_in_place ? a + pc * lda + ic + ir : block_a + ((ir - full_strips_rows) / mr) * kc * mr;
            Kernel::micro_kernel(kc, a_strip, a_in_place ? lda : mr, b_strip, b_stride, tile, ldc, alpha_beta,
                                 std::min(mr, mc - ir), std::min(nr, nc - jr), transposed_c);
          }
        }
      }
    }
  }
}

// gemm's f32 path on a packed kernel: the orientation, the thread split and
// the shared packing of B. With `packed_a` (PackedA's packing), C is
// computed as it is, never flipped.
template <class Kernel>
void gemm_packed(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                 const float* packed_a = nullptr) {
  constexpr int64_t mr = Kernel::mr, nr = Kernel::nr;
  // The micro-tiles fit some shapes badly (m = 32 in 6 x 16 tiles: the sixth
  // strip is a third full). Cᵀ = op(B)ᵀ op(A)ᵀ swaps the roles of m and n;
  // take the orientation that wastes fewer tile slots. Packing a transposed B
  // costs a pass over it that an in-place B does not: an orientation whose B
  // is read in place wins unless it wastes a quarter more tile slots.
  auto slots = [](int64_t rows, int64_t cols) { return ((rows + mr - 1) / mr * mr) * ((cols + nr - 1) / nr * nr); };
  const Transpose flip_a = ta == Transpose::no ? Transpose::yes : Transpose::no;
  const Transpose flip_b = tb == Transpose::no ? Transpose::yes : Transpose::no;
  const double cost_as_is = slots(m, n) * (b_readable_in_place(tb, ldb) ? 1.0 : 1.25);
  const double cost_flipped = slots(n, m) * (b_readable_in_place(flip_a, lda) ? 1.0 : 1.25);
  const bool flipped = packed_a == nullptr && cost_flipped < cost_as_is;
  const int64_t m_padded = (m + mr - 1) / mr * mr;
  // The problem as computed: C' (m' x n') = op(A') op(B'), C' = C or Cᵀ.
  const Transpose ta2 = flipped ? flip_b : ta, tb2 = flipped ? flip_a : tb;
  const int64_t m2 = flipped ? n : m, n2 = flipped ? m : n;
  const float* a2 = flipped ? b : a;
  const float* b2 = flipped ? a : b;
  const int64_t lda2 = flipped ? ldb : lda, ldb2 = flipped ? lda : ldb;
  const int64_t threads = in_parallel_region() ? 1 : get_num_threads();
  if (threads == 1 || m * n * k < (int64_t{1} << 21) || m2 < 2 * mr) {
    const SharedA whole_a{packed_a, m_padded, 0};
    gemm_packed_f32<Kernel>(ta2, tb2, m2, n2, k, alpha, a2, lda2, b2, ldb2, beta, c, ldc, flipped, nullptr,
                            packed_a != nullptr ? &whole_a : nullptr);
    return;
  }
  // Rows of C' split over the threads in whole MR-row strips. A B that must
  // be packed is packed once, by all threads together, for all of them.
  const float* shared_b = nullptr;
  if (!b_readable_in_place(tb2, ldb2)) {
    const int64_t n_padded = (n2 + nr - 1) / nr * nr;
    thread_local std::vector<float> whole_b;
    whole_b.resize(static_cast<size_t>(n_padded * k));
    float* whole = whole_b.data();  // the lambda runs on other threads, whose whole_b is another vector
    // Slice pc (depth kc) holds its strips at whole_b + pc * n_padded, each
    // strip kc x NR: the layout gemm_packed_f32 reads with `shared_b`.
    const int64_t slices = (k + kKC - 1) / kKC, strips = n_padded / nr;
    parallel_for(0, slices * strips, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t pc = (task / strips) * kKC, strip = task % strips;
        const int64_t kc = std::min(kKC, k - pc), col0 = strip * nr;
        pack_b<nr>(tb2, b2, ldb2, pc, kc, col0, std::min(nr, n2 - col0), whole + pc * n_padded + col0 * kc);
      }
    });
    shared_b = whole;
  }
  const int64_t strips_of_rows = (m2 + mr - 1) / mr;
  parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t row0 = std::min(m2, strips_of_rows * t / threads * mr);
      const int64_t row1 = std::min(m2, strips_of_rows * (t + 1) / threads * mr);
      if (row0 >= row1) continue;
      const float* a_rows = ta2 == Transpose::no ? a2 + row0 * lda2 : a2 + row0;
      float* c_rows = flipped ? c + row0 : c + row0 * ldc;
      const SharedA rows_a{packed_a, m_padded, row0};
      gemm_packed_f32<Kernel>(ta2, tb2, row1 - row0, n2, k, alpha, a_rows, lda2, b2, ldb2, beta, c_rows, ldc,
                              flipped, shared_b, packed_a != nullptr ? &rows_a : nullptr);
    }
  });
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
  if (in_parallel_region() || get_num_threads() == 1 || work < (int64_t{1} << 21) || m < 12) {
    fn(m, a, c);
    return;
  }
  const int64_t rows_per_grain = std::max<int64_t>(6, (int64_t{1} << 20) / std::max<int64_t>(n * k, 1));
  parallel_for(0, m, rows_per_grain, [&](int64_t begin, int64_t end) {
    const T* a_rows = ta == Transpose::no ? a + begin * lda : a + begin;
    fn(end - begin, a_rows, c + begin * ldc);
  });
}

}  // namespace

const char* gemm_kernel_name(GemmKernel kernel) {
  switch (kernel) {
    case GemmKernel::avx512: return "avx512";
    case GemmKernel::avx2_fma: return "avx2-fma";
    case GemmKernel::eigen: return "eigen";
  }
  return "unknown";
}

const char* gemm_kernel_name() { return gemm_kernel_name(gemm_kernel()); }

GemmKernel gemm_kernel() {
  const int forced = kernel_override.load(std::memory_order_relaxed);
  if (forced != kNoOverride) return static_cast<GemmKernel>(forced);
  const EnvironmentKernel& environment = environment_kernel();
  if (!environment.error.empty()) throw Error(environment.error);
  return environment.kernel;
}

bool gemm_kernel_supported(GemmKernel kernel) { return cpu_has(kernel); }

void set_gemm_kernel(GemmKernel kernel) {
  if (!cpu_has(kernel)) LOOM_FAIL("set_gemm_kernel: this CPU does not have the ", gemm_kernel_name(kernel), " kernel");
  kernel_override.store(static_cast<int>(kernel), std::memory_order_relaxed);
}

void gemm(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  const GemmKernel kernel = gemm_kernel();
  if (kernel == GemmKernel::eigen || k == 0) {
    split_rows(m, n, k, ta, a, lda, c, ldc, [&](int64_t rows, const float* a_rows, float* c_rows) {
      gemm_eigen<float>(ta, tb, rows, n, k, alpha, a_rows, lda, b, ldb, beta, c_rows, ldc);
    });
  } else if (kernel == GemmKernel::avx512) {
    gemm_packed<Avx512Kernel>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    gemm_packed<Avx2Kernel>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

template <class T>
int64_t PackedA<T>::storage_size(int64_t m, int64_t k) {
  constexpr int64_t mr = Avx512Kernel::mr;
  return std::is_same_v<T, float> ? (m + mr - 1) / mr * mr * k : 0;
}

template <class T>
PackedA<T>::PackedA(Transpose transpose, int64_t m, int64_t k, const T* a, int64_t lda, T* storage)
    : transpose(transpose), m(m), k(k), a(a), lda(lda) {
  // Only the AVX-512 kernel: its strips (MR = 8) are packed with no store
  // past their end, so threads can pack neighbouring strips.
  if constexpr (std::is_same_v<T, float>) {
    if (m <= 0 || k <= 0 || storage == nullptr || gemm_kernel() != GemmKernel::avx512) return;
    constexpr int64_t mr = Avx512Kernel::mr;
    const int64_t m_padded = (m + mr - 1) / mr * mr, strips = m_padded / mr, slices = (k + kKC - 1) / kKC;
    // Slice pc's strips at storage + pc * m_padded, strip by strip (SharedA's layout).
    parallel_for(0, slices * strips, 16, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t pc = (task / strips) * kKC, row0 = (task % strips) * mr, kc = std::min(kKC, k - pc);
        pack_a<mr>(transpose, a, lda, row0, std::min(mr, m - row0), pc, kc, storage + pc * m_padded + row0 * kc);
      }
    });
    packed = storage;
  }
}

template <class T>
bool PackedA<T>::packs() {
  return std::is_same_v<T, float> && gemm_kernel() == GemmKernel::avx512;
}

template <class T>
PackedA<T> PackedA<T>::adopt(Transpose transpose, int64_t m, int64_t k, const T* packed) {
  static_assert(kSliceDepth == kKC && kStripRows == Avx512Kernel::mr);
  LOOM_CHECK(packs() && m % kStripRows == 0, "PackedA::adopt: a packing of ", m, " rows under the ",
             gemm_kernel_name(), " kernel");
  PackedA out(transpose, m, k, nullptr, 0, nullptr);
  out.packed = packed;
  return out;
}

template struct PackedA<float>;
template struct PackedA<double>;

void gemm(const PackedA<float>& a, Transpose tb, int64_t n, float alpha, const float* b, int64_t ldb, float beta,
          float* c, int64_t ldc) {
  // The kernel is read again: a PackedA made under another one is not used.
  if (a.packed == nullptr || a.m <= 0 || n <= 0 || gemm_kernel() != GemmKernel::avx512) {
    LOOM_CHECK(a.a != nullptr || a.m <= 0 || n <= 0, "gemm: a PackedA adopted (no A kept) is used under the ",
               gemm_kernel_name(), " kernel");
    return gemm(a.transpose, tb, a.m, n, a.k, alpha, a.a, a.lda, b, ldb, beta, c, ldc);
  }
  gemm_packed<Avx512Kernel>(a.transpose, tb, a.m, n, a.k, alpha, a.a, a.lda, b, ldb, beta, c, ldc, a.packed);
}

void gemm(const PackedA<double>& a, Transpose tb, int64_t n, double alpha, const double* b, int64_t ldb, double beta,
          double* c, int64_t ldc) {
  gemm(a.transpose, tb, a.m, n, a.k, alpha, a.a, a.lda, b, ldb, beta, c, ldc);
}

void gemm(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  split_rows(m, n, k, ta, a, lda, c, ldc, [&](int64_t rows, const double* a_rows, double* c_rows) {
    gemm_eigen<double>(ta, tb, rows, n, k, alpha, a_rows, lda, b, ldb, beta, c_rows, ldc);
  });
}

}  // namespace loom::ops::cpu
