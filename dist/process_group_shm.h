// ProcessGroupShm: collectives on CPU tensors for ranks on one host, through
// one POSIX shared-memory segment, run on the caller's thread.
//
// Why it exists: with Gloo, every collective crosses TCP loopback and two
// helper threads per rank (the group's worker and Gloo's event loop). With
// one compute thread per core those helpers wait for a core, and a 116 KB
// all-reduce that takes 0.3 ms at the median takes 5-10 ms in a third of the
// steps (measured, benchmarks/results/2026-11-29-cpu-speed-session3.md). Here
// a collective is a few memcpys and a reduction in shared memory by the
// calling thread, with barriers on shared counters: no sockets, no threads,
// no wake-ups while the ranks are in step.
//
// How a collective runs: data moves in rounds of up to `chunk_bytes` per
// rank. In a round every rank copies its part into its own slot, the ranks
// meet at a barrier, then read each other's slots (all_reduce: rank p reduces
// the p-th share of the round across all slots into its own slot, a second
// barrier, then every rank copies all shares out, so every rank gets the same
// bits). Slots are double-buffered, so one barrier per round orders the reuse.
// A barrier spins briefly, then yields, then sleeps on a futex in the segment.
//
// Collectives complete before the call returns (the Work is already
// finished); errors (a peer that exited, the timeout, ranks calling different
// collectives) are stored in the Work and raised by wait(), as with Gloo.
// After a failure the group is broken: later collectives fail at once, and
// the other ranks stop waiting with an error naming the rank that failed.
#pragma once

#include <memory>
#include <string>

#include <loom/dist/process_group.h>

namespace loom::dist {

class ShmOptions {
  // Timeout per collective, and for attaching to the segment.
  LOOM_OPTION(Milliseconds, timeout) = kDefaultCollectiveTimeout;
  // Bytes each rank moves per round (a multiple of 64); 0: 1 MiB, less for
  // worlds over 8 so the segment stays at most 32 MiB. The segment holds
  // 2 x size x chunk_bytes plus a small header.
  LOOM_OPTION(size_t, chunk_bytes) = 0;
};

// Supports every dtype on the CPU (f16 / bf16 are reduced through float,
// accumulating all ranks' values before rounding once).
class ProcessGroupShm final : public ProcessGroup {
 public:
  // Rank 0 creates a segment in /dev/shm and publishes its name through
  // `store`; every rank maps it and reports back. Throws when a rank cannot
  // map it (ranks on different hosts or in different IPC namespaces, no
  // space in /dev/shm), naming the rank and why, or when not every rank
  // reported within options.timeout.
  ProcessGroupShm(std::shared_ptr<Store> store, int rank, int size, ShmOptions options = {});
  ~ProcessGroupShm() override;

  // Like the constructor, but returns null when some rank could not map the
  // segment (every rank returns null then), with the reason in `why_not`.
  // Still throws when a rank does not report within options.timeout.
  static std::shared_ptr<ProcessGroupShm> try_create(std::shared_ptr<Store> store, int rank, int size,
                                                     ShmOptions options, std::string* why_not);

  const char* backend_name() const override { return "shm"; }

  using ProcessGroup::all_reduce;
  WorkHandle all_reduce(const std::vector<Tensor>& tensors, ReduceOp op = ReduceOp::sum) override;
  WorkHandle broadcast(const Tensor& tensor, int root = 0) override;
  WorkHandle all_gather(const std::vector<Tensor>& outputs, const Tensor& input) override;
  WorkHandle all_gather_into(const Tensor& output, const Tensor& input) override;
  WorkHandle reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                            ReduceOp op = ReduceOp::sum) override;
  WorkHandle reduce_scatter_from(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::sum) override;
  WorkHandle barrier() override;
  // CPU memory in a segment of this rank's that every rank maps (a
  // collective); an all_reduce of one contiguous tensor inside it, at the same
  // place on every rank, reads the ranks' buffers directly: rank p reduces the
  // p-th share and writes it into every rank's buffer, two barriers and no
  // copies (about 2 bytes of memory traffic per byte reduced instead of 5.5).
  // Other devices, and a world of one, get Tensor::zeros.
  Tensor new_buffer(int64_t numel, DType dtype, Device device) override;

  void set_timeout(Milliseconds timeout) override;
  Milliseconds timeout() const override;

  // Bytes each rank moves per round.
  size_t chunk_bytes() const;

  struct Impl;

 private:
  explicit ProcessGroupShm(std::unique_ptr<Impl> impl, int rank, int size);
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::dist
