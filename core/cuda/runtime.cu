// The CUDA runtime as loom sees it: device discovery, memory and copies.
// Works on a machine without a GPU: device_count() is 0 there.
#include <cuda_runtime.h>

#include "core/cuda/runtime.h"
#include "core/error.h"

#define LOOM_CHECK_CUDA(call)                                                                       \
  do {                                                                                              \
    cudaError_t status_ = (call);                                                                   \
    if (status_ != cudaSuccess) {                                                                   \
      int device_ = -1;                                                                             \
      cudaGetDevice(&device_);                                                                      \
      LOOM_FAIL(#call, " failed at ", __FILE__, ":", __LINE__, " on cuda:", device_, ": ",       \
                cudaGetErrorString(status_));                                                       \
    }                                                                                               \
  } while (0)

namespace loom::cuda {

bool built_with_cuda() { return true; }

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

void require_device(int index) {
  int count = device_count();
  if (count == 0) LOOM_FAIL("no CUDA device is visible (no GPU, no driver, or CUDA_VISIBLE_DEVICES is empty); use --device cpu");
  if (index < 0 || index >= count) LOOM_FAIL("CUDA device ", index, " does not exist; ", count, " visible");
}

void* allocate(size_t nbytes, int device) {
  require_device(device);
  LOOM_CHECK_CUDA(cudaSetDevice(device));
  void* p = nullptr;
  if (nbytes > 0) LOOM_CHECK_CUDA(cudaMalloc(&p, nbytes));
  return p;
}

void deallocate(void* ptr, int device) {
  if (ptr == nullptr) return;
  cudaSetDevice(device);
  cudaFree(ptr);  // never throws from a destructor path
}

void copy_bytes(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t nbytes, int device) {
  if (nbytes == 0) return;
  LOOM_CHECK_CUDA(cudaSetDevice(device));
  cudaMemcpyKind kind = dst_on_device ? (src_on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                      : (src_on_device ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  LOOM_CHECK_CUDA(cudaMemcpy(dst, src, nbytes, kind));
}

}  // namespace loom::cuda
