// Checks of CUDA, cuBLAS, cuDNN and NCCL calls: on failure each throws
// loom::Error naming the call, file:line, the current device and the
// library's own message, e.g.
//   cudaMalloc(&ptr, bytes) failed at core/cuda/runtime.cpp:88 on cuda:0: out of memory (CUDA error 2)
// This header includes no library header: a macro works where the library's
// header (cuda_runtime.h, cublas_v2.h, cudnn.h, nccl.h) is included.
#pragma once

#include <loom/core/cuda/counters.h>

namespace loom::cuda::detail {
// Throws the loom::Error described above. `code` is the library's status value.
[[noreturn]] void throw_library_error(const char* library, const char* call, const char* file, int line, long long code,
                                      const char* message);
// cuDNN's status name and, from cuDNN 9, its own account of the calling
// thread's last error (cudnnGetLastErrorString); valid until the thread's next call.
const char* cudnn_error_text(int status);
// LOOM_CUDA_FINISHED's test; `status` is the query's cudaError_t.
bool work_finished(int status, const char* call, const char* file, int line);
}  // namespace loom::cuda::detail

// Evaluates `call` (written `call_text` in the source) once into loom_status_,
// of type `Status`; unless it equals `success`, throws naming `library` with
// the text `message` (an expression that may read loom_status_).
#define LOOM_CHECK_LIBRARY_STATUS(library, Status, success, call, call_text, message)                         \
  do {                                                                                                        \
    const Status loom_status_ = (call);                                                                       \
    if (loom_status_ != (success)) {                                                                          \
      ::loom::cuda::detail::throw_library_error(library, call_text, __FILE__, __LINE__,                       \
                                                static_cast<long long>(loom_status_), (message));             \
    }                                                                                                         \
  } while (0)

// cudaGetLastError() clears the error the call left, so that it is not
// reported again by a later, unrelated check (sticky errors stay regardless).
#define LOOM_CHECK_CUDA(call)                                      \
  LOOM_CHECK_LIBRARY_STATUS("CUDA", cudaError_t, cudaSuccess, call, #call, \
                            (cudaGetLastError(), cudaGetErrorString(loom_status_)))

// For a query (cudaStreamQuery, cudaEventQuery): true when the work has
// finished, false while it runs (cudaErrorNotReady, cleared); any other error
// throws as LOOM_CHECK_CUDA does.
#define LOOM_CUDA_FINISHED(call) \
  (::loom::cuda::detail::work_finished(static_cast<int>(call), #call, __FILE__, __LINE__))

// After a kernel launch, once per launch: counts it (cuda::counters(),
// core/cuda/counters.h) and reports a bad launch configuration at once.
#define LOOM_CHECK_LAUNCH()                      \
  do {                                           \
    ::loom::cuda::detail::count_kernel_launch(); \
    LOOM_CHECK_CUDA(cudaGetLastError());         \
  } while (0)

#define LOOM_CHECK_CUBLAS(call)                                                              \
  LOOM_CHECK_LIBRARY_STATUS("cuBLAS", cublasStatus_t, CUBLAS_STATUS_SUCCESS, call, #call, \
                            cublasGetStatusString(loom_status_))

#define LOOM_CHECK_CUDNN(call)                                                             \
  LOOM_CHECK_LIBRARY_STATUS("cuDNN", cudnnStatus_t, CUDNN_STATUS_SUCCESS, call, #call, \
                            ::loom::cuda::detail::cudnn_error_text(loom_status_))

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
