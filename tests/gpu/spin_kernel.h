// A kernel that keeps one stream busy for a set time, so tests can show that
// work on other streams (the data loader's copies) proceeds meanwhile.
#pragma once

#include <cstdint>

#include <loom/core/cuda/stream.h>

namespace loom::gpu_testing {

// Enqueues on `stream` one single-thread kernel that spins for `nanoseconds`
// of the GPU's global timer, and returns at once.
void spin_on_stream(cuda::StreamView stream, uint64_t nanoseconds);

}  // namespace loom::gpu_testing
