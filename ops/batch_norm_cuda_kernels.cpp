// LOOM_CUDA_BATCH_NORM and the override tests use (ops/batch_norm_cuda_kernels.h).
#include <loom/ops/batch_norm_cuda_kernels.h>

#include <atomic>

#include <loom/core/environment.h>

namespace loom::ops {

namespace {
constexpr int kNoOverride = -1;
std::atomic<int> override_kernels{kNoOverride};  // a CudaBatchNormKernels, or kNoOverride
}  // namespace

CudaBatchNormKernels cuda_batch_norm_kernels_from_environment() {
  return environment_choice("LOOM_CUDA_BATCH_NORM", {{"v1", "the default: f64 accumulation"},
                                                     {"v2", "16-byte loads, f32 accumulation, fewer passes"}}) == 1
             ? CudaBatchNormKernels::v2
             : CudaBatchNormKernels::v1;
}

CudaBatchNormKernels cuda_batch_norm_kernels() {
  const int forced = override_kernels.load(std::memory_order_relaxed);
  if (forced != kNoOverride) return static_cast<CudaBatchNormKernels>(forced);
  static const CudaBatchNormKernels from_environment = cuda_batch_norm_kernels_from_environment();
  return from_environment;
}

ScopedCudaBatchNormKernels::ScopedCudaBatchNormKernels(CudaBatchNormKernels kernels)
    : previous_(override_kernels.exchange(static_cast<int>(kernels))) {}

ScopedCudaBatchNormKernels::~ScopedCudaBatchNormKernels() { override_kernels.store(previous_); }

}  // namespace loom::ops
