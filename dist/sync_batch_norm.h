// SyncBatchNorm: batch normalisation whose batch statistics cover every rank
// of a process group (PyTorch's torch.nn.SyncBatchNorm), and
// convert_sync_batchnorm(), which puts it in place of every BatchNorm2d.
#pragma once

#include <memory>

#include <loom/dist/process_group.h>
#include <loom/ops/batch_norm.h>
#include <loom/nn/layers.h>

namespace loom::dist {

// The statistics reduction of SyncBatchNorm (see loom::batch_norm): blocking
// sum all-reduces over `group`, one in forward and one in backward.
BatchStatisticsReduction all_reduce_statistics(std::shared_ptr<ProcessGroup> group);

// Training-mode batch norm over the union of every rank's batch: batch_norm
// with all_reduce_statistics(group). Forward
// all-reduces each channel's (sum, sum of squares) and the element count, so
// mean and biased variance are global; running stats are updated from them
// with the unbiased variance over the global count (as PyTorch does).
// Backward all-reduces (sum dy, sum dy * xhat) for the input gradient; the
// weight and bias gradients stay this rank's, for DDP to average as it does
// every other parameter's. Every rank must make the same calls in the same
// order: forward and backward each run one blocking collective.
//   input: (N, C, ...) on any rank-local batch size; weight, bias,
//   running_mean, running_var: (C) or undefined (see loom::batch_norm).
Tensor sync_batch_norm(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                       const Tensor& running_var, double momentum, double eps, std::shared_ptr<ProcessGroup> group);

class SyncBatchNorm : public nn::BatchNorm2d {
 public:
  // A null group means the default process group if one exists at forward
  // time. Without a group, in a world of one, and in eval mode it computes
  // exactly what BatchNorm2d does.
  explicit SyncBatchNorm(const nn::BatchNormOptions& options, std::shared_ptr<ProcessGroup> group = nullptr);
  explicit SyncBatchNorm(int64_t num_features, std::shared_ptr<ProcessGroup> group = nullptr)
      : SyncBatchNorm(nn::BatchNormOptions(num_features), std::move(group)) {}

  Tensor forward(const Tensor& input) override;  // (N, C, ...) -> same shape
  // relu(forward(input)) with the same (synchronized) statistics, fused into
  // the batch norm.
  Tensor forward_relu(const Tensor& input) override;
  // Declares no fused tail: containers run forward() (the synchronized
  // statistics), then the ReLU, add or pool apart, as they always have.
  bool fuses(nn::FusedTail) const override { return false; }
  // Already synchronized: convert_sync_batchnorm leaves it as it is.
  nn::BatchNorm2d* batch_norm_to_synchronize() override { return nullptr; }
  bool runs_collectives_in_forward() const override { return true; }
  std::string type_name() const override { return "SyncBatchNorm"; }
  const std::shared_ptr<ProcessGroup>& process_group() const { return group_; }

 private:
  Tensor normalize_over_ranks(const Tensor& input, Activation activation);

  std::shared_ptr<ProcessGroup> group_;
};

// Replaces every BatchNorm2d in `module`'s tree by a SyncBatchNorm over
// `group` that shares its parameters and buffers (same tensors, same names,
// same train/eval mode), like torch.nn.SyncBatchNorm.convert_sync_batchnorm.
// Returns the module, or the new SyncBatchNorm when `module` itself is a
// BatchNorm2d. Works for models whose forward reaches batch norms through
// the module tree (Sequential, ConvNet) or through members registered with
// Module::register_module(name, member, module), which replace_module keeps
// in step (ResNet and its blocks). When a BatchNorm2d is also held elsewhere
// (a member registered without itself, or a pointer kept outside), nothing
// is changed and the error names the module, since replacing only the tree
// entry would leave forward() using the old one.
std::shared_ptr<nn::Module> convert_sync_batchnorm(std::shared_ptr<nn::Module> module,
                                                   std::shared_ptr<ProcessGroup> group = nullptr);

}  // namespace loom::dist
