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

// An owned cuBLAS handle created on `device`. Destroying it never throws.
class CublasHandle {
 public:
  explicit CublasHandle(int device);
  ~CublasHandle();
  CublasHandle(CublasHandle&& other) noexcept;
  CublasHandle& operator=(CublasHandle&& other) noexcept;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  CublasHandleType get() const { return handle_; }

 private:
  int device_ = -1;
  CublasHandleType handle_ = nullptr;
};

// An owned cuDNN handle created on `device`. Destroying it never throws.
class CudnnHandle {
 public:
  explicit CudnnHandle(int device);
  ~CudnnHandle();
  CudnnHandle(CudnnHandle&& other) noexcept;
  CudnnHandle& operator=(CudnnHandle&& other) noexcept;
  CudnnHandle(const CudnnHandle&) = delete;
  CudnnHandle& operator=(const CudnnHandle&) = delete;
  CudnnHandleType get() const { return handle_; }

 private:
  int device_ = -1;
  CudnnHandleType handle_ = nullptr;
};

// The calling thread's handle for stream.device(), bound to `stream`. Handles
// are created on first use, lent to one thread at a time, returned to a
// per-device pool when the thread exits, and never destroyed (destroying them
// during process exit, after the driver has shut down, can crash).
CublasHandleType cublas_handle(StreamView stream);
CudnnHandleType cudnn_handle(StreamView stream);

}  // namespace loom::cuda
