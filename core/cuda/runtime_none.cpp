// The CUDA runtime of a build without CUDA: no devices, clear errors.
#include "core/cuda/runtime.h"
#include "core/error.h"

namespace loom::cuda {
namespace {
[[noreturn]] void no_cuda() {
  LOOM_FAIL("loom was built without CUDA; rebuild with -DLOOM_CUDA=ON on a machine with the CUDA toolkit, or use --device cpu");
}
}  // namespace

bool built_with_cuda() { return false; }
int device_count() { return 0; }
void require_device(int) { no_cuda(); }
void* allocate(size_t, int) { no_cuda(); }
void deallocate(void*, int) {}
void copy_bytes(void*, bool, const void*, bool, size_t, int) { no_cuda(); }

}  // namespace loom::cuda
