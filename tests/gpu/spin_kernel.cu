// The spinning kernel of spin_kernel.h: reads %globaltimer (nanoseconds) until
// the requested time has passed.
#include "tests/gpu/spin_kernel.h"

#include <cuda_runtime.h>

#include <loom/core/cuda/check.h>

namespace loom::gpu_testing {

static __device__ uint64_t global_timer_ns() {
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

static __global__ void spin_kernel(uint64_t nanoseconds) {
  const uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < nanoseconds) {
  }
}

void spin_on_stream(cuda::StreamView stream, uint64_t nanoseconds) {
  spin_kernel<<<1, 1, 0, stream.handle()>>>(nanoseconds);
  LOOM_CHECK_LAUNCH();
}

}  // namespace loom::gpu_testing
