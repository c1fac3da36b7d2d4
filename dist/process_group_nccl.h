// Entry point of the NCCL process group (CUDA tensors). A CPU-only build links
// process_group_nccl_none.cpp, which reports that NCCL needs the CUDA backend.
#pragma once

#include <memory>

#include "dist/process_group.h"

namespace loom::dist {

struct NcclOptions {
  Milliseconds timeout = kDefaultCollectiveTimeout;
  int device_index = 0;  // the CUDA device this rank drives (usually its local rank)
};

// Whether this build can create an NCCL process group.
bool nccl_available();

// Exchanges the NCCL unique id through `store` and creates the communicator.
std::shared_ptr<ProcessGroup> make_process_group_nccl(std::shared_ptr<Store> store, int rank, int size,
                                                      const NcclOptions& options);

}  // namespace loom::dist
