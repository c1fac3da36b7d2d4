// The CPU GEMM against a plain triple loop in double, on every f32 kernel this
// CPU has, over every transpose combination, ragged sizes around the kernels'
// 6 x 16 and 8 x 32 tiles and 256-deep slices, leading dimensions larger than
// the row, alpha / beta, and A packed beforehand (PackedA).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/core/generator.h>
#include <loom/core/parallel.h>
#include <loom/ops/cpu/gemm.h>

using loom::ops::cpu::gemm;
using loom::ops::cpu::GemmKernel;
using loom::ops::cpu::Transpose;

namespace {
// With `prepacked`, A goes through PackedA first (packed under the AVX-512
// kernel, remembered otherwise). `ldb`, when given, is B's leading dimension.
template <class T>
void check_case(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, T alpha, T beta, double tolerance,
                bool prepacked = false, int64_t ldb_given = 0) {
  loom::Generator gen(static_cast<uint64_t>(m * 1000003 + n * 1009 + k));
  const int64_t pad = 3;
  const int64_t a_rows = ta == Transpose::no ? m : k, a_cols = ta == Transpose::no ? k : m;
  const int64_t b_rows = tb == Transpose::no ? k : n, b_cols = tb == Transpose::no ? n : k;
  const int64_t lda = a_cols + pad, ldb = ldb_given > 0 ? ldb_given : b_cols + pad, ldc = n + pad;
  std::vector<T> a(a_rows * lda), b(b_rows * ldb), c(m * ldc);
  for (auto& v : a) v = static_cast<T>(gen.uniform(-1, 1));
  for (auto& v : b) v = static_cast<T>(gen.uniform(-1, 1));
  for (auto& v : c) v = static_cast<T>(gen.uniform(-1, 1));
  std::vector<T> original = c;
  const std::vector<T> a_values = a;
  if (prepacked) {
    std::vector<T> storage(static_cast<size_t>(loom::ops::cpu::PackedA<T>::storage_size(m, k)));
    const loom::ops::cpu::PackedA<T> packed(ta, m, k, a.data(), lda, storage.data());
    const bool expect_packed = std::is_same_v<T, float> && loom::ops::cpu::gemm_kernel() == GemmKernel::avx512;
    CHECK((packed.packed != nullptr) == expect_packed);
    if (expect_packed) std::fill(a.begin(), a.end(), T(1e6));  // the product must read the packing, not A
    gemm(packed, tb, n, alpha, b.data(), ldb, beta, c.data(), ldc);
  } else {
    gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
  }
  double worst = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double expected = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = ta == Transpose::no ? a_values[i * lda + p] : a_values[p * lda + i];
        const double bv = tb == Transpose::no ? b[p * ldb + j] : b[j * ldb + p];
        expected += av * bv;
      }
      expected = alpha * expected + (beta != 0 ? beta * static_cast<double>(original[i * ldc + j]) : 0.0);
      worst = std::max(worst, std::abs(expected - static_cast<double>(c[i * ldc + j])) / (1.0 + std::sqrt(static_cast<double>(k))));
    }
    // Padding columns of C are never written.
    for (int64_t j = n; j < ldc; ++j) REQUIRE(c[i * ldc + j] == original[i * ldc + j]);
  }
  INFO("m ", m, " n ", n, " k ", k, " ta ", static_cast<int>(ta), " tb ", static_cast<int>(tb), ": error ", worst);
  CHECK(worst < tolerance);
}
// Runs `body` once on each f32 kernel this CPU has, then restores the default.
template <class Body>
void on_every_kernel(Body&& body) {
  const GemmKernel saved = loom::ops::cpu::gemm_kernel();
  for (GemmKernel kernel : {GemmKernel::avx512, GemmKernel::avx2_fma, GemmKernel::eigen}) {
    if (!loom::ops::cpu::gemm_kernel_supported(kernel)) {
      MESSAGE("skipped: this CPU has no ", std::string(loom::ops::cpu::gemm_kernel_name(kernel)), " kernel");
      continue;
    }
    loom::ops::cpu::set_gemm_kernel(kernel);
    INFO("kernel ", std::string(loom::ops::cpu::gemm_kernel_name(kernel)));
    body();
  }
  loom::ops::cpu::set_gemm_kernel(saved);
}
}  // namespace

TEST_CASE("gemm matches a triple loop for every transpose, ragged sizes, alpha and beta") {
  MESSAGE("default f32 gemm kernel: ", std::string(loom::ops::cpu::gemm_kernel_name()));
  const std::vector<std::array<int64_t, 3>> sizes = {{1, 1, 1},   {5, 15, 3},  {6, 16, 256}, {7, 17, 257},
                                                     {8, 32, 256}, {9, 31, 255}, {15, 47, 9}, {16, 64, 40},
                                                     {13, 33, 1}, {32, 196, 400}, {100, 10, 1568}, {97, 130, 300},
                                                     // B read in place over several 2048-column blocks and 256-deep
                                                     // slices, with a ragged last strip; 8 x 8 transposed packs
                                                     {9, 2085, 300}, {64, 48, 520}, {3, 4100, 17},
                                                     // a transposed B of 25 columns: 8 x 8 groups and one column
                                                     {16, 25, 784},
                                                     // A read in place (few columns), transposed or not: three
                                                     // row blocks, a ragged last strip packed, three slices
                                                     {203, 128, 600}, {203, 64, 600}};
  on_every_kernel([&] {
    for (auto [m, n, k] : sizes) {
      for (Transpose ta : {Transpose::no, Transpose::yes}) {
        for (Transpose tb : {Transpose::no, Transpose::yes}) {
          check_case<float>(ta, tb, m, n, k, 1.0f, 0.0f, 1e-5);
          check_case<float>(ta, tb, m, n, k, -0.5f, 1.0f, 1e-5);
        }
      }
    }
  });
  for (auto [m, n, k] : sizes) {
    for (Transpose ta : {Transpose::no, Transpose::yes}) {
      for (Transpose tb : {Transpose::no, Transpose::yes}) check_case<double>(ta, tb, m, n, k, 2.0, 0.25, 1e-13);
    }
  }
}

TEST_CASE("gemm packs B whose rows are a large power of two apart, whole strips a band of rows at a time") {
  // Rows 1024 floats apart (NCHW planes of 32 x 32) crowd L1's sets, so B is
  // packed, not read in place: several whole 32-column strips read across a
  // band of rows, a ragged last strip, several 256-deep slices and a depth
  // that is not a multiple of the band; transposed, 8 x 8 groups and a tail.
  loom::set_num_threads(1);
  on_every_kernel([] {
    for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{{20, 100, 300}, {9, 64, 517}, {8, 1000, 45}}) {
      for (Transpose ta : {Transpose::no, Transpose::yes}) {
        for (Transpose tb : {Transpose::no, Transpose::yes}) {
          check_case<float>(ta, tb, m, n, k, 1.0f, 0.0f, 1e-5, false, 1024);
          check_case<float>(ta, tb, m, n, k, -0.5f, 1.0f, 1e-5, true, 1024);
        }
      }
    }
  });
}

TEST_CASE("gemm splits large problems across threads with the same result") {
  loom::set_num_threads(2);
  on_every_kernel([] {
    check_case<float>(Transpose::no, Transpose::no, 300, 300, 300, 1.0f, 0.0f, 1e-5);
    check_case<float>(Transpose::yes, Transpose::no, 301, 257, 129, 1.0f, 0.5f, 1e-5);
    // Every transpose, in both orientations, with B read in place, packed per
    // thread or packed once for all threads (strides that crowd L1 sets: 128).
    for (Transpose ta : {Transpose::no, Transpose::yes}) {
      for (Transpose tb : {Transpose::no, Transpose::yes}) {
        check_case<float>(ta, tb, 150, 290, 300, 1.0f, 0.0f, 1e-5);
        check_case<float>(ta, tb, 37, 1000, 70, -0.5f, 1.0f, 1e-5);
        check_case<float>(ta, tb, 1000, 37, 70, 1.0f, 0.25f, 1e-5);
        check_case<float>(ta, tb, 128, 125, 300, 1.0f, 0.0f, 1e-5);
      }
    }
  });
  loom::set_num_threads(1);
}

TEST_CASE("gemm with A packed beforehand matches a triple loop, on 1 and 2 threads") {
  // Ragged rows (strips of 8 with zeros), several 256-deep slices, B read in
  // place or packed, and rows split over threads (m * n * k >= 2^21).
  const std::vector<std::array<int64_t, 3>> sizes = {{1, 1, 1},    {7, 17, 257}, {64, 48, 520},
                                                     {97, 130, 300}, {300, 300, 300}, {1000, 37, 70}};
  for (int threads : {1, 2}) {
    loom::set_num_threads(threads);
    INFO(threads, " threads");
    on_every_kernel([&] {
      for (auto [m, n, k] : sizes) {
        for (Transpose ta : {Transpose::no, Transpose::yes}) {
          for (Transpose tb : {Transpose::no, Transpose::yes}) {
            check_case<float>(ta, tb, m, n, k, 1.0f, 0.0f, 1e-5, true);
            check_case<float>(ta, tb, m, n, k, -0.5f, 1.0f, 1e-5, true);
          }
        }
      }
    });
    check_case<double>(Transpose::yes, Transpose::no, 97, 130, 300, 2.0, 0.25, 1e-13, true);
  }
  loom::set_num_threads(1);
}
