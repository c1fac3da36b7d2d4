// What every build knows about the nccl backend: whether this process can
// use it, and which tensors its collectives accept (with the errors for those
// they do not), so that a build without a GPU can test the messages.
#include <loom/core/cuda/runtime.h>
#include <loom/core/error.h>
#include <loom/dist/process_group_nccl.h>

namespace loom::dist {

void require_nccl() {
  if (!cuda::built_with_cuda()) {
    LOOM_FAIL("backend \"nccl\": loom was built without CUDA, and the NCCL backend needs the CUDA backend "
              "(configure with -DLOOM_CUDA=ON on a machine with the CUDA toolkit, cuDNN and NCCL), or use backend "
              "\"gloo\" with CPU tensors");
  }
  if (!nccl_available()) {
    LOOM_FAIL("backend \"nccl\": loom was built with CUDA but without NCCL (CMake did not find nccl.h and "
              "libnccl; set NCCL_ROOT to a directory holding include/nccl.h and lib/libnccl.so* and configure "
              "again), or use backend \"gloo\" with CPU tensors");
  }
  if (cuda::device_count() == 0) {
    LOOM_FAIL("backend \"nccl\" needs a CUDA device, but no CUDA device is visible to this process; use backend "
              "\"gloo\" with CPU tensors (--device cpu)");
  }
}

bool nccl_supports(DType dtype) {
  switch (dtype) {
    case DType::f32:
    case DType::f64:
    case DType::f16:
    case DType::bf16:
    case DType::i64:
    case DType::i32: return true;
    case DType::u8: return false;
  }
  return false;
}

void check_nccl_tensor(const char* collective, const Tensor& tensor, const std::string& role, int device) {
  LOOM_CHECK(tensor.defined(), collective, ": ", role, " is an undefined tensor");
  LOOM_CHECK(tensor.device().is_cuda(), collective, ": ", role, " is ", tensor.str(),
             ", a CPU tensor; the nccl backend works on CUDA tensors of this rank's device cuda:", device,
             " (move it there with .to(Device::cuda(", device, ")), or use the gloo backend for CPU tensors)");
  LOOM_CHECK(tensor.device().index == device, collective, ": ", role, " is ", tensor.str(),
             ", but this rank's NCCL communicator drives cuda:", device, "; move the tensor to cuda:", device);
  LOOM_CHECK(nccl_supports(tensor.dtype()), collective, ": ", role, " is ", tensor.str(),
             "; NCCL collectives take f32, f64, f16, bf16, i64 or i32 tensors");
}

}  // namespace loom::dist
