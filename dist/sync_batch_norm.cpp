// SyncBatchNorm: batch norm (ops/batch_norm.h) with a statistics reduction
// that all-reduces over a process group, and the BatchNorm2d -> SyncBatchNorm
// conversion.
#include <loom/dist/sync_batch_norm.h>

#include <cmath>

#include <loom/core/error.h>
#include <loom/ops/batch_norm.h>

namespace loom::dist {

BatchStatisticsReduction all_reduce_statistics(std::shared_ptr<ProcessGroup> group) {
  LOOM_CHECK(group != nullptr, "all_reduce_statistics: the process group is null");
  BatchStatisticsReduction reduction;
  // (2, C) f64 sums and the element count, summed over ranks in one collective.
  reduction.forward = [group](const Tensor& sums, int64_t count) -> StatisticsCount {
    Tensor total = Tensor::full({1}, static_cast<double>(count), DType::f64, sums.device());
    group->all_reduce({sums, total}, ReduceOp::sum)->wait();
    // The kernels read the total where they run: the host does not wait for
    // the all-reduce (a GPU would idle once per layer). This rank's count is
    // a lower bound of the total, and when it is more than one batch norm's
    // check holds without the total; a rank with at most one element per
    // channel reads the total for that check.
    if (count > 1) return {count, total};
    return static_cast<int64_t>(std::llround(total.item()));
  };
  // Every rank's input gradient depends on every rank's output gradient.
  reduction.backward = [group](const Tensor& grad_sums) { group->all_reduce(grad_sums, ReduceOp::sum)->wait(); };
  return reduction;
}

Tensor sync_batch_norm(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                       const Tensor& running_var, double momentum, double eps, std::shared_ptr<ProcessGroup> group) {
  LOOM_CHECK(group != nullptr, "sync_batch_norm: the process group is null");
  check_batch_norm_arguments("sync_batch_norm", input, weight, bias, running_mean, running_var);
  LOOM_CHECK(input.size(1) > 0, "sync_batch_norm: the input has no channels: ", shape_str(input.sizes()));
  return batch_norm(input, weight, bias, running_mean, running_var, true, momentum, eps, Activation::none,
                    all_reduce_statistics(std::move(group)));
}

SyncBatchNorm::SyncBatchNorm(const nn::BatchNormOptions& options, std::shared_ptr<ProcessGroup> group)
    : nn::BatchNorm2d(options), group_(std::move(group)) {}

Tensor SyncBatchNorm::forward(const Tensor& input) { return normalize_over_ranks(input, Activation::none); }

Tensor SyncBatchNorm::forward_relu(const Tensor& input) { return normalize_over_ranks(input, Activation::relu); }

Tensor SyncBatchNorm::normalize_over_ranks(const Tensor& input, Activation activation) {
  const int64_t channels = options_.num_features();
  LOOM_CHECK(input.defined() && input.dim() >= 2 && input.size(1) == channels, "SyncBatchNorm(", channels,
             "): expected (N, ", channels, ", ...) input, got ", input.defined() ? input.str() : "an undefined tensor");
  const bool use_batch_stats = is_training() || !running_mean.defined();
  count_batch();
  std::shared_ptr<ProcessGroup> group = group_;
  if (!group && is_initialized()) group = default_process_group();
  // PyTorch synchronizes only in training mode.
  const bool synchronize = is_training() && group != nullptr && group->size() > 1;
  return batch_norm(input, weight, bias, running_mean, running_var, use_batch_stats, options_.momentum(), options_.eps(),
                    activation, synchronize ? all_reduce_statistics(group) : BatchStatisticsReduction{});
}

namespace {

std::shared_ptr<SyncBatchNorm> sync_version_of(const nn::BatchNorm2d& batch_norm, std::shared_ptr<ProcessGroup> group) {
  auto sync = std::make_shared<SyncBatchNorm>(batch_norm.options(), std::move(group));
  // Share the tensors themselves: an optimizer built earlier keeps working.
  sync->weight = batch_norm.weight;
  sync->bias = batch_norm.bias;
  sync->running_mean = batch_norm.running_mean;
  sync->running_var = batch_norm.running_var;
  sync->num_batches_tracked = batch_norm.num_batches_tracked;
  sync->train(batch_norm.is_training());
  return sync;
}

// One replacement made, to undo if a later one is impossible.
struct Replacement {
  nn::Module* parent;
  std::string name;
  std::shared_ptr<nn::Module> previous;
};

void convert_children(nn::Module& parent, const std::string& prefix, const std::shared_ptr<ProcessGroup>& group,
                      std::vector<Replacement>& done) {
  for (auto& [name, child] : parent.named_children()) {
    nn::BatchNorm2d* batch_norm = child->batch_norm_to_synchronize();
    if (batch_norm == nullptr) {
      convert_children(*child, prefix + name + ".", group, done);
      continue;
    }
    std::shared_ptr<nn::Module> previous =
        parent.replace_module(name, sync_version_of(*batch_norm, group));
    done.push_back({&parent, name, previous});
    // `previous` here and in `done`: any further owner is outside the tree.
    if (previous.use_count() > 2) {
      for (auto it = done.rbegin(); it != done.rend(); ++it) it->parent->replace_module(it->name, it->previous);
      LOOM_FAIL("convert_sync_batchnorm: BatchNorm2d '", prefix, name, "' of ", parent.type_name(),
                " is also held outside the module tree (a member that ", parent.type_name(),
                "::forward() calls directly, or a pointer you kept), so replacing it in the tree would not change "
                "what forward() runs; nothing was converted. Models whose forward reaches their batch norms "
                "through the module tree (Sequential, ConvNet) or through members registered with "
                "register_module(name, member, module) (ResNet) can be converted");
    }
  }
}

}  // namespace

std::shared_ptr<nn::Module> convert_sync_batchnorm(std::shared_ptr<nn::Module> module,
                                                   std::shared_ptr<ProcessGroup> group) {
  LOOM_CHECK(module != nullptr, "convert_sync_batchnorm: the module is null");
  if (nn::BatchNorm2d* batch_norm = module->batch_norm_to_synchronize()) return sync_version_of(*batch_norm, group);
  std::vector<Replacement> done;
  convert_children(*module, "", group, done);
  return module;
}

}  // namespace loom::dist
