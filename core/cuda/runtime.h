// The CUDA runtime as the rest of loom sees it. A build without CUDA has the
// same functions: device_count() is 0 and everything else throws
// "loom was built without CUDA".
#pragma once

#include <cstddef>
#include <string>

namespace loom::cuda {

// True when this binary contains the CUDA backend.
bool built_with_cuda();
// Number of visible CUDA devices; 0 without a GPU, a driver, or CUDA support.
int device_count();
// Throws a one-line loom::Error unless device `index` can be used, saying why
// ("loom was built without CUDA", "no CUDA device is visible", ...).
void require_device(int index);

void* allocate(size_t nbytes, int device);
void deallocate(void* ptr, int device);
// Copies between host and device memory (either side may be CUDA).
void copy_bytes(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t nbytes, int device);

}  // namespace loom::cuda
