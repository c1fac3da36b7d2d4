// DistributedDataParallel: wraps a module so that, during backward, gradients
// are averaged across the ranks of a process group in buckets that overlap
// the rest of backward (PyTorch's reducer, see ARCHITECTURE.md).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "dist/process_group.h"
#include "nn/module.h"

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

struct DistributedDataParallelOptions {
  size_t first_bucket_bytes_cap = size_t{1} << 20;  // 1 MiB: starts communication early in backward
  size_t bucket_bytes_cap = size_t{25} << 20;       // 25 MiB (PyTorch's bucket_cap_mb)
  // Parameters the forward pass did not use get no gradient; with this option
  // they are found after each forward and reduced as they are (no error).
  bool find_unused_parameters = false;
  // Copy rank 0's buffers (batch-norm statistics) to every rank before each forward.
  bool broadcast_buffers = true;
};

// When one bucket became ready (its last gradient arrived), was handed to the
// process group, and finished; from the most recent synchronized backward.
struct BucketTiming {
  size_t bucket = 0;
  size_t bytes = 0;
  size_t parameters = 0;
  std::chrono::steady_clock::time_point ready, launched, done;
};

class DistributedDataParallel final : public nn::Module {
 public:
  // Checks that every rank holds the same parameters (names, shapes, dtypes),
  // copies rank 0's parameters and buffers to every rank, makes each
  // parameter's .grad a view into its bucket, and registers the gradient
  // hooks. Collective: every rank must construct it. Move the module to its
  // device and dtype before wrapping it.
  explicit DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                   std::shared_ptr<ProcessGroup> group = default_process_group(),
                                   DistributedDataParallelOptions options = {});
  ~DistributedDataParallel() override;

  // Runs the wrapped module; prepares the reducer for the coming backward.
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "DistributedDataParallel"; }

  // Blocks until every bucket of the last backward has been reduced, so that
  // each .grad holds the average over ranks. Call it after backward and before
  // the optimizer step (it returns at once when the last gradient's hook
  // already finished the reduction, and after a no_sync() backward). Throws
  // when the reduction failed or parameters received no gradient (naming
  // them) without find_unused_parameters.
  void wait_for_gradients();

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
  // Parameter names (of the wrapped module) in each bucket, in bucket order.
  std::vector<std::vector<std::string>> bucket_parameter_names() const;
  std::vector<BucketTiming> bucket_timings() const;

 private:
  struct Reducer;
  void check_same_parameters_on_every_rank();
  void broadcast_from_rank_zero(const std::vector<Tensor>& tensors);

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DistributedDataParallelOptions options_;
  bool synchronize_gradients_ = true;
  // Shared with the gradient hooks, which hold it weakly: a hook that outlives
  // this object does nothing.
  std::shared_ptr<Reducer> reducer_;
};

}  // namespace loom::dist
