// Entry point of the GPU suites: without a visible CUDA device the binary says
// why and exits 77, which CTest reports as skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "core/cuda/runtime.h"

int main(int argc, char** argv) {
  if (loom::cuda::device_count() == 0) {
    const std::string why = loom::cuda::device_count_error();
    std::printf("skipped: no CUDA device visible%s%s%s\n",
                loom::cuda::built_with_cuda() ? "" : " (this build of loom has no CUDA backend)",
                why.empty() ? "" : "; the CUDA runtime says: ", why.c_str());
    return 77;
  }
  std::printf("CUDA device 0: %s\n", loom::cuda::device_name(0).c_str());
  doctest::Context context(argc, argv);
  return context.run();
}
