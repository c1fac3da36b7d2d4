// The Trainer's training step captured as a CUDA graph (TrainerOptions::
// cuda_graph, the apps' --cuda-graph; core/cuda/graph.h): forward, loss,
// backward, the loss scale's unscale and update, and the optimizer step,
// launched from the host as one graph per step. The first step runs eagerly
// (it makes the optimizer's state and cuDNN's plans); the second is captured
// with the batch copied into input tensors of its own, and every later step
// copies its batch there and replays the graph. A batch of another shape
// (the epoch's last, smaller one) runs eagerly. The learning rates and the
// loss scale live on the GPU (Optimizer::keep_lr_on_device,
// MixedPrecisionOptimizer::place_loss_scale), so schedules, warm-up and the
// loss-scale schedule act on replays as on eager steps.
//
// With DistributedDataParallel over a group whose collectives a graph can
// hold (nccl: ProcessGroup::capture_refusal), the bucket all-reduces that
// backward launches are captured too, and every replay runs them. NCCL needs
// every rank to capture the same collectives: the ranks agree after the
// capture (one all-reduce) and run eagerly together when any rank's capture
// failed. Each replay is watched under the group's timeout
// (ProcessGroup::watch_replay), so a peer that died mid-replay fails the
// group as an eager collective would, instead of hanging the device.
#pragma once

#include <cstdio>
#include <optional>
#include <string>

#include <loom/core/cuda/graph.h>
#include <loom/data/loader.h>
#include <loom/dist/process_group.h>
#include <loom/nn/module.h>
#include <loom/optim/amp.h>

namespace loom::train {

// The whole-step work a captured step covers: the model's forward and loss
// (`step_function` under the optimizer's autocast), backward, the step.
using CapturedStepFunction = std::function<Tensor(nn::Module& model, const data::Batch& batch)>;

class CapturedStep {
 public:
  // Why the run's steps cannot be captured, from what is known before the
  // first step; nothing when they can (the optimizer is asked at capture).
  // `group`: DistributedDataParallel's process group when it wraps the model
  // (null without); `join`: uneven inputs (TrainerOptions::join).
  static std::optional<std::string> refusal(const Device& device, const dist::ProcessGroup* group, bool join,
                                            int64_t accumulate_steps, double clip_grad_norm);

  // Keeps the optimizer's learning rates and the loss scale on `device`.
  // `report` (rank 0) says once, on stderr, why a capture failed. `group`:
  // DistributedDataParallel's, when `model` is one (its all-reduces are
  // captured; refusal() said the group allows it).
  CapturedStep(nn::Module& model, amp::MixedPrecisionOptimizer& optimizer, CapturedStepFunction step_function,
               Device device, bool report, std::shared_ptr<dist::ProcessGroup> group = nullptr);

  // One optimizer step on `batch`: zero_grad, forward and loss, scaled
  // backward, optimizer step; eagerly, or as the graph's replay. Returns the
  // step's loss (a tensor of its own, not overwritten by later steps). A
  // capture that fails (a host sync in the step, an optimizer that cannot be
  // captured) is reported once and the steps run eagerly from then on.
  Tensor run(const data::Batch& batch);

  // Steps run as replays, and eagerly (first, failed, other shapes).
  int64_t replays() const { return replays_; }
  int64_t eager_steps() const { return eager_steps_; }
  // Why the steps run eagerly; nothing while capture works.
  const std::optional<std::string>& failure() const { return failure_; }

 private:
  Tensor step(const data::Batch& batch);
  bool fits(const data::Batch& batch) const;
  Tensor eager(const data::Batch& batch);
  // Captures the step on `batch` copied into input tensors of its own; why it failed, or nothing.
  std::optional<std::string> capture(const data::Batch& batch);

  nn::Module& model_;
  amp::MixedPrecisionOptimizer& optimizer_;
  CapturedStepFunction step_function_;
  Device device_;
  bool report_;
  std::shared_ptr<dist::ProcessGroup> group_;  // DDP's: its all-reduces are in the graph
  std::optional<cuda::Graph> graph_;
  data::Batch input_;  // the captured step's batch: its images and labels are copied into
  Tensor loss_;        // the captured step's loss
  std::optional<std::string> failure_;
  int64_t replays_ = 0, eager_steps_ = 0;
};

namespace detail {
// NCCL's rule for captured collectives, kept after a capture attempt: every
// rank captured, or none runs the graph. Returns `why` (this rank's reason
// its capture failed, or nothing) unless another rank's failed, which it
// then says. Collective over `group` (one all-reduce), on every rank.
std::optional<std::string> agree_on_capture(dist::ProcessGroup& group, std::optional<std::string> why);
}  // namespace detail

}  // namespace loom::train
