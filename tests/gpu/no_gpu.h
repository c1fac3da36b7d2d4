// How both GPU test binaries start: without a visible CUDA device they say
// why (and what the CUDA runtime answered) and exit 77, which CTest reports as
// skipped. scripts/gpu-check.sh looks for the "skipped: no CUDA device visible" line.
#pragma once

#include <cstdio>
#include <string>

#include <loom/core/cuda/runtime.h>

namespace loom::gpu_testing {

// True (after printing the reason) when no CUDA device is visible.
inline bool skip_without_gpu() {
  if (cuda::device_count() > 0) return false;
  const std::string why = cuda::device_count_error();
  std::printf("skipped: no CUDA device visible%s%s%s\n",
              cuda::built_with_cuda() ? "" : " (this build of loom has no CUDA backend)",
              why.empty() ? "" : "; the CUDA runtime says: ", why.c_str());
  return true;
}

}  // namespace loom::gpu_testing
