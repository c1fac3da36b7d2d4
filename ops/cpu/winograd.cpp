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
// kernel, the chunk runs channels-last instead (winograd_channels_last.cpp).
// This file plans the chunks and drives the passes; the transforms are in
// winograd_transforms.cpp, the tiles' gather and scatter in winograd_tiles.cpp.
#include <loom/ops/cpu/winograd_internal.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include <loom/core/error.h>
#include <loom/core/parallel.h>
#include <loom/ops/cpu/gemm.h>

namespace loom::ops::cpu::winograd {

using namespace detail;

// About 64 tiles per chunk, fewer (down to 16) when the channels would make
// a chunk buffer (α² x channels x tiles floats) larger than 8 MiB: with 128
// (the ConvNet's conv2: buffers of 0.5 to 1 MiB each, several per chunk) its
// forward and backward took longer. (Measured:
// benchmarks/results/2026-12-06-cpu-kernel-timings-from-comments.md.)
constexpr int64_t kTargetTiles = 64, kMinTiles = 16, kChunkBufferFloats = int64_t{1} << 21;

Plan detail::plan(const Problem& p, int m) {
  const int64_t batch = std::max<int64_t>(1, p.batch), per_image = tiling(p, m).per_image;
  const int64_t alpha = m + p.kernel - 1, widest = std::max<int64_t>(1, std::max(p.channels, p.out_channels));
  const int64_t target = std::clamp<int64_t>(kChunkBufferFloats / (alpha * alpha * widest), kMinTiles, kTargetTiles);
  const int64_t threads = in_parallel_region() ? 1 : get_num_threads();
  return {std::clamp<int64_t>(target / per_image, 1, batch), std::min(threads, batch)};
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

