#include <loom/train/captured_step.h>

#include <loom/core/error.h>
#include <loom/core/memory_format.h>

namespace loom::train {

std::optional<std::string> CapturedStep::refusal(const Device& device, const dist::ProcessGroup* group, bool join,
                                                 int64_t accumulate_steps, double clip_grad_norm) {
  if (!device.is_cuda()) return "the model is on " + device.str() + ", not a GPU";
  if (group != nullptr) {
    if (std::optional<std::string> why = group->capture_refusal())
      return "DistributedDataParallel's all-reduces cannot be captured: " + *why;
  }
  if (join) return std::string("uneven inputs (Join) agree on every rank's progress on the host at each step");
  if (accumulate_steps > 1) return std::string("gradient accumulation (--accumulate-steps) is not captured yet");
  if (clip_grad_norm > 0) return std::string("gradient clipping reads the norm on the host (--clip-grad-norm)");
  return std::nullopt;
}

CapturedStep::CapturedStep(nn::Module& model, amp::MixedPrecisionOptimizer& optimizer,
                           CapturedStepFunction step_function, Device device, bool report,
                           std::shared_ptr<dist::ProcessGroup> group)
    : model_(model),
      optimizer_(optimizer),
      step_function_(std::move(step_function)),
      device_(device),
      report_(report),
      group_(std::move(group)) {
  LOOM_CHECK(device.is_cuda(), "CapturedStep: CUDA graphs need a GPU, not ", device.str());
  if (group_) {
    const std::optional<std::string> why = group_->capture_refusal();
    LOOM_CHECK(!why, "CapturedStep: ", *why);
  }
  optimizer_.optimizer().keep_lr_on_device(device);
  optimizer_.place_loss_scale(device);
}

Tensor CapturedStep::step(const data::Batch& batch) {
  optimizer_.zero_grad();
  Tensor loss;
  {
    auto autocast = optimizer_.autocast();
    loss = step_function_(model_, batch);
  }
  optimizer_.scale_loss(loss).backward();
  optimizer_.step();
  return loss.detach();
}

bool CapturedStep::fits(const data::Batch& batch) const {
  const Tensor &images = input_.images, &labels = input_.labels;
  return batch.images.sizes() == images.sizes() && batch.images.dtype() == images.dtype() &&
         same_dense_layout(batch.images, images) && batch.labels.sizes() == labels.sizes() &&
         batch.labels.dtype() == labels.dtype();
}

Tensor CapturedStep::eager(const data::Batch& batch) {
  ++eager_steps_;
  return step(batch);
}

std::optional<std::string> CapturedStep::capture(const data::Batch& batch) {
  std::optional<std::string> why = optimizer_.optimizer().capture_refusal();
  if (!why) {
    input_.images = empty_with_format(batch.images.sizes(), batch.images.dtype(), device_,
                                      memory_format_of(batch.images)).copy_(batch.images);
    input_.labels = batch.labels.clone();
    input_.index = batch.index;
    input_.samples = batch.samples;
    graph_.emplace(device_.index);
    try {
      graph_->capture([&] { loss_ = step(input_); });
    } catch (const Error& e) {
      why = e.what();
    }
  }
  if (group_) why = detail::agree_on_capture(*group_, std::move(why));  // eager, outside the capture
  if (why) graph_.reset();
  return why;
}

Tensor CapturedStep::run(const data::Batch& batch) {
  if (failure_ || eager_steps_ == 0) return eager(batch);
  if (graph_ && !fits(batch)) return eager(batch);
  if (!graph_) {
    if (std::optional<std::string> why = capture(batch)) {
      failure_ = why;
      if (report_) std::fprintf(stderr, "--cuda-graph: the training steps run eagerly: %s\n", why->c_str());
      return eager(batch);
    }
  } else {
    Tensor(input_.images).copy_(batch.images);
    Tensor(input_.labels).copy_(batch.labels);
  }
  graph_->replay();
  ++replays_;
  if (group_) group_->watch_replay(str("step ", replays_, " (", group_->size(), " ranks)"));
  return loss_.clone();
}

namespace detail {
std::optional<std::string> agree_on_capture(dist::ProcessGroup& group, std::optional<std::string> why) {
  if (group.size() == 1) return why;
  const int64_t captured = why ? 0 : 1;
  if (dist::all_reduce_values(group, {captured}, dist::ReduceOp::min)[0] == 0 && !why)
    why = std::string("another rank's capture of the step failed, so every rank runs eagerly");
  return why;
}
}  // namespace detail

}  // namespace loom::train
