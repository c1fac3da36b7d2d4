// The weight's columns of a subset of the kernel's taps (gather_taps) and a
// weight gradient over tap subsets spread into the full one (spread_taps).
#include <loom/ops/cpu/conv2d_internal.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <loom/ops/cpu/gemm.h>

namespace loom::ops::cpu::conv2d_detail {
namespace {

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

}  // namespace

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

namespace {

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
}  // namespace
#endif

template <class T>
void gather_taps(const T* weight, int64_t rows, int64_t kernel, const int64_t* index, int64_t n, T* compact,
                 int64_t group, int64_t ld) {
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

namespace {

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

}  // namespace

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

template void gather_taps<float>(const float*, int64_t, int64_t, const int64_t*, int64_t, float*, int64_t, int64_t);
template void gather_taps<double>(const double*, int64_t, int64_t, const int64_t*, int64_t, double*, int64_t, int64_t);
template void spread_taps<float>(const std::vector<CompactGrad<float>>&, int64_t, int64_t, float*);
template void spread_taps<double>(const std::vector<CompactGrad<double>>&, int64_t, int64_t, double*);

}  // namespace loom::ops::cpu::conv2d_detail
