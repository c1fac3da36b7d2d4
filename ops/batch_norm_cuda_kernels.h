// Which of the two sets of CUDA batch-norm kernels runs (ops/cuda/batch_norm.cu,
// ops/cuda/batch_norm_v2.cu), chosen by LOOM_CUDA_BATCH_NORM. v1, the default,
// accumulates in f64 and has run on GPUs; v2 (issue 46) reads 16-byte vectors,
// accumulates in f32 with a fixed-order combine and makes one pass per
// reduction and one per element-wise step. Host code, so that the choice is
// parsed and tested on machines without CUDA.
#pragma once

namespace loom::ops {

enum class CudaBatchNormKernels { v1, v2 };

// LOOM_CUDA_BATCH_NORM: unset, empty or "v1" is v1, "v2" is v2; anything else
// is a loom::Error naming the variable and its values. Reads the environment
// on every call.
CudaBatchNormKernels cuda_batch_norm_kernels_from_environment();

// The kernels batch norm's CUDA entry points run: the environment's choice,
// read once per process, unless a ScopedCudaBatchNormKernels overrides it.
CudaBatchNormKernels cuda_batch_norm_kernels();

// Runs the CUDA batch-norm kernels given for its lifetime, then restores the
// previous choice: the seam through which tests and benchmarks compare v1 and
// v2 in one process. Process-wide, so not for use while other threads run
// batch norm.
class ScopedCudaBatchNormKernels {
 public:
  explicit ScopedCudaBatchNormKernels(CudaBatchNormKernels kernels);
  // Not copyable: a copy would restore the previous choice twice.
  ScopedCudaBatchNormKernels(const ScopedCudaBatchNormKernels&) = delete;
  ScopedCudaBatchNormKernels& operator=(const ScopedCudaBatchNormKernels&) = delete;
  ~ScopedCudaBatchNormKernels();

 private:
  int previous_;
};

}  // namespace loom::ops
