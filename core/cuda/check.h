// Checks of CUDA, cuBLAS, cuDNN and NCCL calls: on failure each throws
// loom::Error naming the call, file:line, the current device and the
// library's own message, e.g.
//   cudaMalloc(&ptr, bytes) failed at core/cuda/runtime.cpp:88 on cuda:0: out of memory (CUDA error 2)
// This header includes no library header: a macro works where the library's
// header (cuda_runtime.h, cublas_v2.h, cudnn.h, nccl.h) is included.
#pragma once

namespace loom::cuda::detail {
// Throws the loom::Error described above. `code` is the library's status value.
[[noreturn]] void throw_library_error(const char* library, const char* call, const char* file, int line, long long code,
                                      const char* message);
// cuDNN's status name and, from cuDNN 9, its own account of the calling
// thread's last error (cudnnGetLastErrorString); valid until the thread's next call.
const char* cudnn_error_text(int status);
}  // namespace loom::cuda::detail

// cudaGetLastError() clears the error the call left, so that it is not
// reported again by a later, unrelated check (sticky errors stay regardless).
#define LOOM_CHECK_CUDA(call)                                                                                 \
  do {                                                                                                        \
    const cudaError_t loom_status_ = (call);                                                                  \
    if (loom_status_ != cudaSuccess) {                                                                        \
      cudaGetLastError();                                                                                     \
      ::loom::cuda::detail::throw_library_error("CUDA", #call, __FILE__, __LINE__,                            \
                                                static_cast<long long>(loom_status_),                         \
                                                cudaGetErrorString(loom_status_));                            \
    }                                                                                                         \
  } while (0)

// After a kernel launch: reports a bad launch configuration at once.
#define LOOM_CHECK_LAUNCH() LOOM_CHECK_CUDA(cudaGetLastError())

#define LOOM_CHECK_CUBLAS(call)                                                                               \
  do {                                                                                                        \
    const cublasStatus_t loom_status_ = (call);                                                               \
    if (loom_status_ != CUBLAS_STATUS_SUCCESS) {                                                              \
      ::loom::cuda::detail::throw_library_error("cuBLAS", #call, __FILE__, __LINE__,                          \
                                                static_cast<long long>(loom_status_),                         \
                                                cublasGetStatusString(loom_status_));                         \
    }                                                                                                         \
  } while (0)

#define LOOM_CHECK_CUDNN(call)                                                                                \
  do {                                                                                                        \
    const cudnnStatus_t loom_status_ = (call);                                                                \
    if (loom_status_ != CUDNN_STATUS_SUCCESS) {                                                               \
      ::loom::cuda::detail::throw_library_error("cuDNN", #call, __FILE__, __LINE__,                           \
                                                static_cast<long long>(loom_status_),                         \
                                                ::loom::cuda::detail::cudnn_error_text(loom_status_));        \
    }                                                                                                         \
  } while (0)

// ncclInProgress counts as success (non-blocking communicators); the last
// error string carries NCCL's detail on what went wrong.
#define LOOM_CHECK_NCCL(call)                                                                                 \
  do {                                                                                                        \
    const ncclResult_t loom_status_ = (call);                                                                 \
    if (loom_status_ != ncclSuccess && loom_status_ != ncclInProgress) {                                      \
      const char* loom_detail_ = ncclGetLastError(nullptr);                                                   \
      ::loom::cuda::detail::throw_library_error(                                                              \
          "NCCL", #call, __FILE__, __LINE__, static_cast<long long>(loom_status_),                            \
          (loom_detail_ != nullptr && loom_detail_[0] != '\0') ? loom_detail_ : ncclGetErrorString(loom_status_)); \
    }                                                                                                         \
  } while (0)
