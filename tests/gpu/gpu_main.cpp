// Entry point of the GPU suites: without a visible CUDA device the binary says
// why and exits 77, which CTest reports as skipped. Listing the suites (what
// ctest does to find them) needs no device.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string_view>

#include <loom/core/cuda/runtime.h>
#include "tests/gpu/no_gpu.h"

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing = listing || std::string_view(argv[i]).starts_with("--list-");
  if (!listing) {
    if (loom::gpu_testing::skip_without_gpu()) return 77;
    std::printf("CUDA device 0: %s\n", loom::cuda::device_name(0).c_str());
  }
  doctest::Context context(argc, argv);
  return context.run();
}
