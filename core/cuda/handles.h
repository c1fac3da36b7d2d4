// cuBLAS and cuDNN handles: move-only owners, and the per-thread handle of a
// device that ops use. No library headers: the handle types are the
// libraries' opaque pointers (cublasHandle_t is cublasContext*,
// cudnnHandle_t is cudnnContext*).
#pragma once

#include <loom/core/cuda/stream.h>

struct cublasContext;
struct cudnnContext;

namespace loom::cuda {

using CublasHandleType = cublasContext*;  // cublasHandle_t
using CudnnHandleType = cudnnContext*;    // cudnnHandle_t

namespace detail {
void release_cublas(CublasHandleType handle) noexcept;
void release_cudnn(CudnnHandleType handle) noexcept;
}  // namespace detail

// An owned cuBLAS handle created on `device`. Destroying it never throws.
class CublasHandle : public DeviceHandleOwner<CublasHandleType, detail::release_cublas> {
 public:
  explicit CublasHandle(int device);
};

// An owned cuDNN handle created on `device`. Destroying it never throws.
class CudnnHandle : public DeviceHandleOwner<CudnnHandleType, detail::release_cudnn> {
 public:
  explicit CudnnHandle(int device);
};

// The calling thread's handle for stream.device(), bound to `stream`. Handles
// are created on first use, lent to one thread at a time, returned to a
// per-device pool when the thread exits, and never destroyed (destroying them
// during process exit, after the driver has shut down, can crash).
CublasHandleType cublas_handle(StreamView stream);
CudnnHandleType cudnn_handle(StreamView stream);

}  // namespace loom::cuda
