// CUDA graphs (PyTorch's torch.cuda.CUDAGraph): the work a function queues on
// one device, captured once and replayed with one launch from the host.
//
//   cuda::Graph graph(device);
//   graph.capture([&] { loss = train_step(static_images, static_labels); });
//   for (...) { static_images.copy_(batch); graph.replay(); }
//
// What a capture records is device work only: the host code in `work` runs
// once, during capture. A replay rewrites the same memory: the tensors the
// captured work read (static inputs, parameters, optimizer state) and the
// ones it allocated, which live in the graph's private memory pool until the
// graph is destroyed. Hence the rules of a captured step: inputs copied into
// the same tensors before each replay; no host syncs (a capture cannot hold
// one: capture() names the first); values the host would pass as kernel
// arguments and that change between steps (the learning rate, the loss
// scale) read by the kernels from device memory instead; cuDNN's and
// cuBLAS's algorithm searches done before the capture (an eager step).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace loom::cuda {

class Graph {
 public:
  // A graph of `device`'s work, not captured yet.
  explicit Graph(int device);
  // Waits for the replays still running (a host sync), destroys the graph
  // and hands its memory pool back to the allocator.
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Runs `work` once on the host while capturing what it queues on the
  // device: on a side stream made current for the call (ordered after the
  // current stream's queued work), its allocations served from this graph's
  // private pool. Nothing runs on the device. Work that a capture cannot
  // hold (a host sync, a CUDA call capture forbids) throws loom::Error
  // saying why; the graph then stays empty. cuBLAS works in a 32 MiB
  // workspace the graph owns. Capturing again waits for the replays and
  // replaces the graph (its pool is kept).
  void capture(const std::function<void()>& work);
  // Launches the captured work on the device's current stream.
  void replay();
  bool captured() const;
  int device() const { return device_; }

 private:
  struct Captured;  // the CUDA graph and its executable
  int device_;
  uint64_t pool_;
  std::unique_ptr<Captured> captured_;
};

}  // namespace loom::cuda
