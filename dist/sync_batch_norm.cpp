// SyncBatchNorm: the ops/batch_norm.h steps with all-reduces between them
// (stats -> all-reduce -> gather_stats -> apply; backward_reduce -> all-reduce
// -> backward_apply), and the BatchNorm2d -> SyncBatchNorm conversion.
#include <loom/dist/sync_batch_norm.h>

#include <cmath>
#include <tuple>

#include <loom/core/autograd.h>
#include <loom/core/error.h>
#include <loom/core/profiler.h>
#include <loom/ops/batch_norm.h>
#include <loom/ops/dispatch.h>
#include <loom/ops/elementwise.h>

namespace loom::dist {

namespace {

// Row `i` of a (2, C) tensor of per-channel pairs, as a (C) view.
Tensor row(const Tensor& pairs, int64_t i) { return pairs.slice(0, i, i + 1).reshape({pairs.size(1)}); }

}  // namespace

Tensor sync_batch_norm(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                       const Tensor& running_var, double momentum, double eps, std::shared_ptr<ProcessGroup> group) {
  profiler::Scope profile("sync_batch_norm", input);
  LOOM_CHECK(group != nullptr, "sync_batch_norm: the process group is null");
  check_batch_norm_arguments("sync_batch_norm", input, weight, bias, running_mean, running_var);
  LOOM_CHECK(input.size(1) > 0, "sync_batch_norm: the input has no channels: ", shape_str(input.sizes()));
  const int64_t local_count = input.numel() / input.size(1);

  Tensor out, mean, var;
  int64_t count = 0;  // elements per channel on all ranks together
  {
    NoGradGuard no_grad;
    // (2, C) f64 sums and the element count, summed over ranks in one collective.
    Tensor stats = LOOM_DISPATCH(input, batch_norm_stats, input);
    Tensor counts = Tensor::full({1}, static_cast<double>(local_count), DType::f64, input.device());
    group->all_reduce({stats, counts}, ReduceOp::sum)->wait();
    count = std::llround(counts.item());
    LOOM_CHECK(count > 1, "sync_batch_norm: training needs more than one value per channel over all ranks, got ",
               count, " (this rank's input is ", shape_str(input.sizes()), ")");
    const Tensor mean_var =
        LOOM_DISPATCH(input, batch_norm_gather_stats, stats, count, running_mean, running_var, momentum);
    mean = row(mean_var, 0);
    var = row(mean_var, 1);
    out = LOOM_DISPATCH(input, batch_norm_apply, input, mean, var, weight, bias, eps);
  }

  record("sync_batch_norm", {input, weight, bias}, {&out},
         [x = input.detach(), w = weight.defined() ? weight.detach() : Tensor(), mean, var, count, eps, group,
          weight_dtype = weight.defined() ? weight.dtype() : DType::f32,
          bias_dtype = bias.defined() ? bias.dtype() : DType::f32](const TensorList& g, const Node& node) {
           const Tensor dy = g[0].to(x.dtype());
           // (2, C) f64: this rank's (sum dy, sum dy * xhat).
           const Tensor sums = LOOM_DISPATCH(x, batch_norm_backward_reduce, dy, x, mean, var, eps);
           Tensor grad_weight = node.needs_input_grad(1) ? row(sums, 1).to(weight_dtype).clone() : Tensor();
           Tensor grad_bias = node.needs_input_grad(2) ? row(sums, 0).to(bias_dtype).clone() : Tensor();
           Tensor dx;
           if (node.needs_input_grad(0)) {
             // Every rank's input gradient depends on every rank's output gradient.
             const Tensor global_sums = sums.clone();
             group->all_reduce(global_sums, ReduceOp::sum)->wait();
             dx = LOOM_DISPATCH(x, batch_norm_backward_apply, dy, x, mean, var, w, global_sums, count, eps);
           }
           return TensorList{dx, grad_weight, grad_bias};
         });
  return out;
}

SyncBatchNorm::SyncBatchNorm(const nn::BatchNormOptions& options, std::shared_ptr<ProcessGroup> group)
    : nn::BatchNorm2d(options), group_(std::move(group)) {}

Tensor SyncBatchNorm::forward(const Tensor& input) { return normalize_over_ranks(input, Activation::none); }

Tensor SyncBatchNorm::forward_relu(const Tensor& input) { return normalize_over_ranks(input, Activation::relu); }

Tensor SyncBatchNorm::normalize_over_ranks(const Tensor& input, Activation activation) {
  const int64_t channels = options_.num_features_;
  LOOM_CHECK(input.defined() && input.dim() >= 2 && input.size(1) == channels, "SyncBatchNorm(", channels,
             "): expected (N, ", channels, ", ...) input, got ", input.defined() ? input.str() : "an undefined tensor");
  const bool use_batch_stats = is_training() || !running_mean.defined();
  count_batch();
  std::shared_ptr<ProcessGroup> group = group_;
  if (!group && is_initialized()) group = default_process_group();
  // PyTorch synchronizes only in training mode.
  if (!is_training() || group == nullptr || group->size() == 1) {
    return batch_norm(input, weight, bias, running_mean, running_var, use_batch_stats, options_.momentum_,
                      options_.eps_, activation);
  }
  // sync_batch_norm has no fused activation: relu on its (global) result.
  Tensor out = sync_batch_norm(input, weight, bias, running_mean, running_var, options_.momentum_, options_.eps_, group);
  return activation == Activation::relu ? relu(out) : out;
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

bool is_plain_batch_norm(nn::Module* module) {
  return dynamic_cast<nn::BatchNorm2d*>(module) != nullptr && dynamic_cast<SyncBatchNorm*>(module) == nullptr;
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
    if (!is_plain_batch_norm(child)) {
      convert_children(*child, prefix + name + ".", group, done);
      continue;
    }
    std::shared_ptr<nn::Module> previous =
        parent.replace_module(name, sync_version_of(*dynamic_cast<nn::BatchNorm2d*>(child), group));
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
  if (is_plain_batch_norm(module.get())) return sync_version_of(*dynamic_cast<nn::BatchNorm2d*>(module.get()), group);
  std::vector<Replacement> done;
  convert_children(*module, "", group, done);
  return module;
}

}  // namespace loom::dist
