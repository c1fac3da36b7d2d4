// ProcessGroupNCCL: collectives on CUDA tensors with NCCL (one device per
// rank). Built when the CUDA backend found NCCL (process_group_nccl.cpp);
// otherwise process_group_nccl_none.cpp says why "nccl" cannot be used.
//
// How a collective runs: the group's own high-priority NCCL stream waits on
// an event recorded on the caller's current stream of the device, the NCCL
// call runs on the NCCL stream, and the tensors are marked as used there
// (cuda::record_stream) so the caching allocator does not hand their memory
// out early. Work::wait() makes the caller's current stream wait on the
// completion event without blocking the host; Work::synchronize() blocks.
// The communicator is non-blocking (ncclCommInitRankConfig with blocking =
// 0): its initialisation and every group call return at once and complete
// under the timeout. The watchdog (nccl_watchdog.h, no lock held across a
// call that can block) completes Work objects, and when one runs past the
// timeout (in its enqueue, in NCCL's group completion or on the device) or
// NCCL reports an asynchronous error it fails every pending Work with an
// error naming the collective, its number and the ranks that did not reach
// it (each rank records its progress in the store), and aborts the
// communicator (ncclCommAbort): the group is unusable after that, and every
// later call throws that error.
#pragma once

#include <memory>
#include <string>

#include <loom/dist/process_group.h>

namespace loom::dist {

class NcclOptions {
  // Timeout per collective.
  LOOM_OPTION(Milliseconds, timeout) = kDefaultCollectiveTimeout;
  // The CUDA device this rank drives; -1: cuda::local_rank_device() (its local rank).
  LOOM_OPTION(int, device_index) = -1;
};

// Whether this build contains the NCCL process group.
bool nccl_available();
// Returns when this process can create an NCCL process group; otherwise
// throws a loom::Error saying why (no CUDA or no NCCL in this build, no
// visible CUDA device).
void require_nccl();

// Exchanges the NCCL unique id through `store` (rank 0 creates it) and creates
// the communicator on the rank's device; blocks until every rank has joined,
// at most the timeout (then throws, naming the ranks that did not join).
std::shared_ptr<ProcessGroup> make_process_group_nccl(std::shared_ptr<Store> store, int rank, int size,
                                                      const NcclOptions& options);

// The dtypes NCCL collectives accept in loom: f32, f64, f16, bf16, i64, i32.
bool nccl_supports(DType dtype);
// Throws the loom::Error an nccl `collective` gives for `tensor` (`role`:
// "the input", "output 2", ...) unless it is defined, a CUDA tensor on
// cuda:`device` and of a supported dtype.
void check_nccl_tensor(const char* collective, const Tensor& tensor, const std::string& role, int device);

}  // namespace loom::dist
