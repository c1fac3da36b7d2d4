#include <loom/train/captured_step.h>

#include <loom/core/error.h>
#include <loom/core/memory_format.h>

namespace loom::train {

std::optional<std::string> CapturedStep::refusal(const Device& device, bool distributed, int64_t accumulate_steps,
                                                 double clip_grad_norm) {
  if (!device.is_cuda()) return "the model is on " + device.str() + ", not a GPU";
  if (distributed) {
    return std::string("DistributedDataParallel's all-reduces are not captured yet (one process without a process "
                       "group only)");
  }
  if (accumulate_steps > 1) return std::string("gradient accumulation (--accumulate-steps) is not captured yet");
  if (clip_grad_norm > 0) return std::string("gradient clipping reads the norm on the host (--clip-grad-norm)");
  return std::nullopt;
}

CapturedStep::CapturedStep(nn::Module& model, amp::MixedPrecisionOptimizer& optimizer,
                           CapturedStepFunction step_function, Device device, bool report)
    : model_(model), optimizer_(optimizer), step_function_(std::move(step_function)), device_(device), report_(report) {
  LOOM_CHECK(device.is_cuda(), "CapturedStep: CUDA graphs need a GPU, not ", device.str());
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

Tensor CapturedStep::run(const data::Batch& batch) {
  if (failure_ || eager_steps_ == 0) return eager(batch);
  if (graph_ && !fits(batch)) return eager(batch);
  if (!graph_) {
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
        graph_.reset();
      }
    }
    if (why) {
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
  return loss_.clone();
}

}  // namespace loom::train
