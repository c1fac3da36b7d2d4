// The nccl backend of a build without NCCL (or without CUDA): says why it
// cannot be used.
#include <loom/core/error.h>
#include <loom/dist/process_group_nccl.h>

namespace loom::dist {

bool nccl_available() { return false; }

std::shared_ptr<ProcessGroup> make_process_group_nccl(std::shared_ptr<Store>, int, int, const NcclOptions&) {
  require_nccl();  // throws the reason
  LOOM_FAIL("backend \"nccl\" is not available in this build");
}

}  // namespace loom::dist
