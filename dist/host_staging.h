// CUDA tensors over a CPU backend (gloo, shm), staged through host memory as
// PyTorch's gloo backend does: `--device cuda --backend gloo|shm`.
//
// Each collective copies the caller's tensors to host tensors (a device to
// host copy waits for the caller's current stream: the inputs are final),
// runs on the CPU group, and wait() / synchronize() copy the results back
// into the caller's tensors on the caller's current stream, so kernels queued
// afterwards see them. The staging code does not depend on the device: with
// the CPU as the device (the CPU tests) the copies are plain host copies.
// Not done yet: pinned staging buffers and copies on a side stream ordered by
// events (each device to host copy blocks the host until the caller's stream
// reaches it).
#pragma once

#include <memory>

#include <loom/dist/process_group.h>

namespace loom::dist {

// A group whose collectives take tensors on `device`, staged through host
// memory for `inner`, a group on CPU tensors (gloo, shm); the backend name,
// barrier and timeout are inner's.
std::shared_ptr<ProcessGroup> make_host_staged_process_group(std::shared_ptr<ProcessGroup> inner, Device device);

// `group` itself when it works on `device` (gloo on the CPU, nccl on its
// GPU), else make_host_staged_process_group(group, device).
std::shared_ptr<ProcessGroup> stage_through_host(std::shared_ptr<ProcessGroup> group, Device device);

}  // namespace loom::dist
