// DistributedDataParallel: wraps a module so that, during backward, gradients
// are averaged across the ranks of a process group in buckets that overlap
// the rest of backward (PyTorch's reducer; its contract is in docs/ARCHITECTURE.md).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <loom/core/tensor.h>
#include <loom/dist/join.h>
#include <loom/dist/process_group.h>
#include <loom/nn/module.h>

namespace loom::dist {

// Splits parameters into gradient buckets: parameters in reverse registration
// order (backward produces the last layers' gradients first), grouped by
// (dtype, device); each group's first bucket holds at most
// `first_bucket_bytes_cap` bytes, later ones at most `bucket_bytes_cap` (a
// single larger parameter gets a bucket of its own). Buckets are ordered by
// their first parameter in reverse registration order. Returns indices into
// `parameters`.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<Tensor>& parameters,
                                                size_t first_bucket_bytes_cap, size_t bucket_bytes_cap);

// A communication hook reduces one gradient bucket across the group
// (PyTorch's register_comm_hook). It receives the bucket's flat buffer, which
// holds this rank's gradients, launches the collective and returns it; the
// reducer waits for `work`, then runs `finish` (on the backward thread), after
// which the buffer must hold the average over ranks.
struct BucketReduction {
  WorkHandle work;                // null when nothing was launched
  std::function<void()> finish{};  // may be empty
  size_t wire_bytes = 0;          // bytes each rank contributes to the collective
};
using CommunicationHook = std::function<BucketReduction(ProcessGroup& group, const Tensor& bucket)>;

// The default hook: all-reduces the bucket with avg (gloo divides the inputs
// before summing, as PyTorch's DDP does; shm and nccl divide inside the
// reduction).
CommunicationHook allreduce_hook();
// Compression (PyTorch's fp16_compress_hook / bf16_compress_hook): divides
// the bucket by the world size in its own dtype, casts it to `wire_dtype`
// (f16 or bf16), all-reduces that, and casts the sum back into the bucket.
// Dividing before the cast keeps the sum of world values within the range of
// the largest one, so it overflows f16 only where a single gradient would.
CommunicationHook compress_hook(DType wire_dtype);

// How DistributedDataParallel buckets and reduces, e.g.
// DistributedDataParallelOptions().bucket_bytes_cap(size_t{50} << 20).find_unused_parameters(true).
class DistributedDataParallelOptions {
  // Bytes of the first bucket of each (dtype, device) group at most; 1 MiB by
  // default, so that communication starts early in backward.
  LOOM_OPTION(size_t, first_bucket_bytes_cap) = size_t{1} << 20;
  // Bytes of every later bucket at most; 25 MiB by default (PyTorch's bucket_cap_mb).
  LOOM_OPTION(size_t, bucket_bytes_cap) = size_t{25} << 20;
  // Parameters the forward pass did not use get no gradient; with this option
  // they are found after each forward and reduced as they are (no error).
  LOOM_OPTION(bool, find_unused_parameters) = false;
  // Copy rank 0's buffers (batch-norm statistics) to every rank before each forward; on by default.
  LOOM_OPTION(bool, broadcast_buffers) = true;
};

// When one bucket became ready (its last gradient arrived), was handed to the
// process group, started on the wire, and finished; from the most recent
// synchronized backward. Time points stay {} for what did not happen (no
// collective runs in a world of one, so `started` stays {} there). With the
// nccl backend, backward returns before the device finished the collectives:
// `started` / `done` are when the host saw the NCCL stream reach them, {}
// until then.
struct BucketTiming {
  size_t bucket = 0;
  size_t bytes = 0;       // the bucket's gradient buffer
  size_t wire_bytes = 0;  // what this rank sent into the collective (less with compression)
  size_t parameters = 0;
  std::chrono::steady_clock::time_point ready, launched, started, done;
};

// One synchronized iteration as the reducer saw it.
struct IterationTiming {
  std::chrono::steady_clock::time_point forward_end;     // forward returned; the reducer was prepared
  std::chrono::steady_clock::time_point first_gradient;  // the first parameter gradient of backward arrived
  std::chrono::steady_clock::time_point backward_end;    // autograd applied every node (end-of-backward callback)
  std::chrono::steady_clock::time_point reduced;         // every bucket reduced: .grad holds the average
  std::vector<BucketTiming> buckets;
};

// A Joinable (dist/join.h): inside a Join its forward announces this rank
// and takes buffers from the lowest running rank, and once its data ran out
// its join hook shadows the buffer broadcast and, on synchronized
// iterations, every bucket's reduction (with zeros, or with the gradients a
// no_sync accumulation left), then broadcasts the authoritative rank's
// parameters and buffers. SyncBatchNorm layers are refused: their forward
// all-reduces statistics a joined rank cannot shadow.
class DistributedDataParallel final : public nn::Module, public Joinable {
 public:
  // Checks that every rank holds the same parameters (names, shapes, dtypes),
  // copies rank 0's parameters and buffers to every rank, makes each
  // parameter's .grad a view into its bucket (and its AccumulateGrad's
  // gradient buffer, so that backward computes gradients there without a
  // copy; cleared again on destruction), and registers the gradient hooks. Collective: every rank
  // must construct it. Move the module to its device and dtype before
  // wrapping it.
  explicit DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                   std::shared_ptr<ProcessGroup> group = default_process_group(),
                                   DistributedDataParallelOptions options = {});
  ~DistributedDataParallel() override;

  // Runs the wrapped module; prepares the reducer for the coming backward.
  // Inside a Join it first announces this rank (one small all-reduce).
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "DistributedDataParallel"; }

  // Gradients are averaged by the time loss.backward() returns: the first
  // gradient hook of a synchronized backward queues an end-of-backward
  // callback that waits for every bucket. A reduction failure (a dead peer,
  // a timeout) or parameters that received no gradient without
  // find_unused_parameters make backward() throw, naming the cause.

  // Finishes a synchronized backward whose end-of-backward callback did not
  // run (a backward during which no parameter hook fired); otherwise, and
  // after a no_sync() backward, returns at once. Safe to call after every
  // backward, as older loom code did.
  void wait_for_gradients();

  // Replaces how buckets are reduced (allreduce_hook() by default); call it
  // before the first forward.
  void register_comm_hook(CommunicationHook hook);

  // While the returned guard lives, backward passes accumulate gradients
  // locally without communication; the first backward after it reduces the
  // accumulated sum.
  class NoSyncGuard {
   public:
    ~NoSyncGuard();
    NoSyncGuard(NoSyncGuard&& other) noexcept;
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(NoSyncGuard&&) = delete;

   private:
    friend class DistributedDataParallel;
    NoSyncGuard(DistributedDataParallel* owner, bool previous);
    DistributedDataParallel* owner_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync();

  nn::Module& module() { return *module_; }
  const std::shared_ptr<ProcessGroup>& process_group() const { return group_; }

  // Joinable: the hook Join runs on this rank once its data ran out.
  std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) override;
  const std::shared_ptr<ProcessGroup>& join_process_group() const override { return group_; }
  // Parameter names (of the wrapped module) in each bucket, in bucket order.
  std::vector<std::vector<std::string>> bucket_parameter_names() const;
  std::vector<BucketTiming> bucket_timings() const;
  // The last synchronized iteration's timeline, for scaling benchmarks.
  IterationTiming last_iteration_timing() const;

 private:
  struct Reducer;
  class JoinHookImpl;
  void check_same_parameters_on_every_rank();
  std::vector<Tensor> buffers() const;

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DistributedDataParallelOptions options_;
  bool synchronize_gradients_ = true;
  // Shared with the gradient hooks, which hold it weakly: a hook that outlives
  // this object does nothing.
  std::shared_ptr<Reducer> reducer_;
};

}  // namespace loom::dist
