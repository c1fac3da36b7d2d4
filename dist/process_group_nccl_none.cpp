// Stand-in for the NCCL process group until the CUDA backend provides one:
// says clearly why "nccl" cannot be used in this build.
#include "core/error.h"
#include "dist/process_group_nccl.h"

namespace loom::dist {

bool nccl_available() { return false; }

std::shared_ptr<ProcessGroup> make_process_group_nccl(std::shared_ptr<Store>, int, int, const NcclOptions&) {
#if defined(LOOM_HAVE_CUDA)
  LOOM_FAIL("the NCCL backend is not implemented yet in loom; use backend \"gloo\" with CPU tensors");
#else
  LOOM_FAIL("loom was built without CUDA: the NCCL backend needs the CUDA backend (configure with "
            "-DLOOM_CUDA=ON on a machine with the CUDA toolkit and NCCL), or use backend \"gloo\" with CPU tensors");
#endif
}

}  // namespace loom::dist
