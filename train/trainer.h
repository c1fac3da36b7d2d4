// loom::train::Trainer: the training loop that train_mnist,
// train_resnet50_cifar and users' own programs share. It owns the epochs,
// resume (--resume auto semantics), step and epoch checkpoints, the agreed
// stop on SIGTERM / SIGINT / SIGUSR1 (every rank after the same step, with a
// checkpoint), distributed evaluation, the metrics file, TensorBoard, the
// progress display, loss lines, the trace and the throughput figures. The
// user gives the model, the optimizer, the data and, optionally, a step
// function, a learning-rate schedule with warm-up, and hooks.
//
//   auto options = dist::InitOptions().backend(dist::Backend::automatic);
//   auto group = world > 1 ? dist::init_process_group(options) : nullptr;
//   train::Trainer trainer(model, amp::initialize(*model, make_sgd, amp::OptLevel::O0),
//                          train::TrainerOptions().epochs(10).process_group(group));
//   train::FitResult result = trainer.fit(train_loader, &test_loader);
//   return result.exit_code();  // 128 + signal when a signal stopped the run
#pragma once

#include <chrono>
#include <csignal>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <loom/core/options.h>
#include <loom/core/tensor.h>
#include <loom/data/loader.h>
#include <loom/dist/ddp.h>
#include <loom/dist/metrics.h>
#include <loom/dist/process_group.h>
#include <loom/nn/checkpoint.h>
#include <loom/nn/module.h>
#include <loom/optim/amp.h>
#include <loom/optim/lr_scheduler.h>
#include <loom/train/checkpoints.h>

namespace loom::train {

// When the Trainer advances its LR schedule (Trainer::scheduler).
enum class SchedulerInterval {
  epoch,  // after every epoch (StepLR, CosineAnnealingLR as PyTorch's examples step them)
  step,   // after every optimizer step (OneCycleLR; a LinearLR / SequentialLR counted in steps)
};

class TrainerOptions {
  // Epochs in all; a resumed run counts the checkpoint's.
  LOOM_OPTION(int64_t, epochs) = 1;
  // Optimizer steps in all after which the run ends, mid-epoch too; 0: no limit.
  LOOM_OPTION(int64_t, max_steps) = 0;
  // Steps per epoch at most (an epoch ends there, as at the loader's end); 0: the loader's whole epoch.
  LOOM_OPTION(int64_t, max_steps_per_epoch) = 0;
  // Batches per optimizer step (gradient accumulation): their losses are
  // divided by K and their gradients summed, DDP all-reduces only on the last
  // (no_sync), so a step equals one on a K times larger batch. An epoch whose
  // batch count is not a multiple of K ends with a step on the rest, each
  // loss divided by that group's size. Steps, max_steps, warm-up, schedules,
  // log_interval and checkpoints count optimizer steps; checkpoints and stops
  // happen between steps, never inside an accumulation, so resume is exact.
  LOOM_OPTION(int64_t, accumulate_steps) = 1;
  // When scheduler() advances. With `step`, warm-up scales the schedule's rate of each step.
  LOOM_OPTION(SchedulerInterval, scheduler_interval) = SchedulerInterval::epoch;
  // Clip the gradients' total 2-norm to this before each step
  // (MixedPrecisionOptimizer::clip_grad_norm: after DDP's all-reduce and the
  // loss scale's unscale; an overflowed step is still skipped); 0: off.
  LOOM_OPTION(double, clip_grad_norm) = 0;
  // Steps of an epoch between loss lines, progress lines and metrics records.
  LOOM_OPTION(int64_t, log_interval) = 100;
  // The first `value` steps of the run raise the learning rate linearly, step
  // (s + 1) / value of the scheduled rate at step s (Goyal et al.); 0: none.
  LOOM_OPTION(int64_t, warmup_steps) = 0;
  // Where checkpoints go and what is resumed (default: none written, none resumed).
  LOOM_OPTION(CheckpointOptions, checkpoints) = CheckpointOptions().directory("");
  // A signal that stops the run with a checkpoint, besides SIGTERM and SIGINT
  // (SIGUSR1 by default: sbatch --signal=USR1@90); 0: none.
  LOOM_OPTION(int, stop_signal) = SIGUSR1;
  // The process group the model trains over, wrapped in DistributedDataParallel; null: one process.
  LOOM_OPTION(std::shared_ptr<dist::ProcessGroup>, process_group);
  // DistributedDataParallel's bucket sizes and options, with a process group.
  LOOM_OPTION(dist::DistributedDataParallelOptions, ddp);
  // Uneven inputs: ranks may run different numbers of batches in an epoch
  // (DistributedSampler with data::Remainder::uneven, or any sampler), and
  // each epoch runs inside a dist::Join with these options. Optimizer steps
  // group the batches by their index in the epoch, the same on every rank,
  // up to the largest rank's count, so all ranks synchronize the same
  // iterations; a joined rank shadows the others' all-reduces and takes the
  // same optimizer step with their averaged gradients (dist::ShadowStep), so
  // model, optimizer state, schedule and step count stay equal everywhere.
  // From the step in which a rank's data ran out to the epoch's end (the
  // uneven tail) no step checkpoint is written and a stop request waits for
  // the epoch's end, which then writes its epoch checkpoint and stops. Costs
  // one small all-reduce per forward, four per epoch, and a broadcast of the
  // model at each epoch's end. Refused with SyncBatchNorm. nullopt (default),
  // one process, or enable(false): off.
  LOOM_OPTION(std::optional<dist::JoinOptions>, join);
  // Evaluate on the test data at every epoch's end (the run's last epoch: the
  // final evaluation), not only when metrics or TensorBoard records are kept.
  LOOM_OPTION(bool, evaluate_each_epoch) = false;
  // Rank 0's progress on stderr: "bar", "lines", "none" (default), or "auto" (a bar on a terminal, else lines).
  LOOM_OPTION(std::string, progress) = "none";
  // JSON Lines file rank 0 appends records to (docs/metrics.md); '': none.
  LOOM_OPTION(std::string, metrics_path);
  // Directory rank 0 writes TensorBoard scalars into; '': none.
  LOOM_OPTION(std::string, tensorboard_dir);
  // Each optimizer step as the replay of one CUDA graph (train/captured_step.h):
  // the first step eager, the second captured, the epoch's smaller last
  // batch eager; the learning rates and the loss scale kept on the GPU; with
  // a process group (DDP) over nccl its all-reduces in the graph too. Needs
  // the model on a GPU (else refused); with a gloo or shm group, uneven
  // inputs (join), gradient accumulation or clipping the steps run eagerly,
  // as they do after a failed capture, and rank 0 says why on stderr. Not yet
  // run on a GPU.
  LOOM_OPTION(bool, cuda_graph) = false;
  // Chrome trace file (one per rank, FILE.rank<k>.json, when several run); '': none.
  LOOM_OPTION(std::string, trace_path);
  // The run's settings, written into checkpoints; a resume notes each one that changed.
  LOOM_OPTION(nn::Metadata, settings);
  // The program and its command line, for the metrics file's header.
  LOOM_OPTION(std::string, program) = "loom";
  LOOM_OPTION(std::vector<std::string>, command_line);
};

// What the hooks see of a step.
struct StepInfo {
  int64_t epoch = 0;            // 0-based
  int64_t epochs = 0;           // in all
  int64_t epoch_step = 0;       // optimizer steps done in this epoch, this one included
  int64_t steps_per_epoch = 0;  // optimizer steps

  int64_t step = 0;             // optimizer steps done in the run
  const data::Batch* batch = nullptr;  // the step's (last) batch
  const Tensor* loss = nullptr;   // the step's loss (accumulating: the mean of its batches') (reading it waits for a GPU's queued work)
  double data_wait_seconds = 0;   // the loader's wait for this batch
  double step_seconds = 0;        // forward, backward and optimizer step, as the host saw them
  double grad_norm = 0;           // the gradients' total norm before clipping, with clip_grad_norm; else 0
};
// (With TrainerOptions::join a rank whose data ran out takes its remaining
// steps inside dist::Join, without batches: no hook runs for those.)

// How fit() ended.
struct FitResult {
  int stop_signal = 0;  // 0, or the signal every rank stopped for (a checkpoint was written)
  int exit_code() const { return stop_signal != 0 ? 128 + stop_signal : 0; }
  std::chrono::steady_clock::duration elapsed{};  // the training, up to the slowest rank's last step
  int64_t images = 0;                // trained in this run, on all ranks (counted per rank with join())
  int64_t steps = 0;                 // optimizer steps in all, a resumed checkpoint's included
  double data_wait_seconds = 0;      // this rank's waits for batches
  std::optional<dist::AccuracyCounts> accuracy;  // the final evaluation, when fit() had test data
  double images_per_second() const;
};

// The loss of one batch, the forward half of a step; `model` is the trained
// module (DistributedDataParallel with a process group). It runs under the
// optimizer's autocast; the Trainer does backward, the gradient all-reduce
// and the optimizer step. The default: cross_entropy(model(images), labels).
using StepFunction = std::function<Tensor(nn::Module& model, const data::Batch& batch)>;
using StepHook = std::function<void(const StepInfo& step)>;
// A loss line: the step and its loss, read once for the line.
using LogHook = std::function<void(const StepInfo& step, double loss)>;
using ResultHook = std::function<void(const FitResult& result)>;
// An epoch's end: its (0-based) number and its test accuracy when it was
// evaluated (evaluate_each_epoch, or metrics kept; the run's last epoch's is
// FitResult::accuracy).
using EpochHook = std::function<void(int64_t epoch, const std::optional<dist::AccuracyCounts>& accuracy)>;

class Trainer {
 public:
  // `optimizer` steps `model` (amp::initialize builds both, at any opt level;
  // it may wrap a dist::ZeroRedundancyOptimizer, whose state every rank
  // gathers on rank 0 for each checkpoint). Installs the stop signals' handlers.
  Trainer(std::shared_ptr<nn::Module> model, std::shared_ptr<amp::MixedPrecisionOptimizer> optimizer,
          TrainerOptions options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Resumes as options().checkpoints() say, then trains for the remaining
  // epochs on `train_data` (a sampler per rank: DistributedSampler), writing
  // checkpoints and records; with `test_data` (a ShardSampler per rank), the
  // accuracy at the end, and at each epoch's end when records are kept.
  // Collective with a process group: every rank calls it.
  FitResult fit(data::DataLoader& train_data, data::DataLoader* test_data = nullptr);

  nn::Module& model() { return *model_; }
  amp::MixedPrecisionOptimizer& optimizer() { return *optimizer_; }
  // The DistributedDataParallel wrapper during and after fit(); null for one process.
  dist::DistributedDataParallel* ddp() { return ddp_.get(); }
  const TrainerOptions& options() const { return options_; }
  int rank() const { return rank_; }
  int world_size() const { return world_; }

  // What the user adds, each a chainable setter and a getter:
  // An LR schedule, stepped at each epoch's end (or after each optimizer
  // step: TrainerOptions::scheduler_interval) and saved in checkpoints.
  LOOM_OPTION(std::shared_ptr<optim::LRScheduler>, scheduler);
  // The forward half of a step; null: cross_entropy(model(images), labels).
  LOOM_OPTION(StepFunction, step_function);
  // After every step, on every rank.
  LOOM_OPTION(StepHook, on_step);
  // Rank 0, every log_interval() steps; null: "Epoch [e/E], Step [i/N], Loss: x".
  LOOM_OPTION(LogHook, on_log);
  // Rank 0, at each completed epoch's end, after its checkpoint.
  LOOM_OPTION(EpochHook, after_epoch);
  // Rank 0, when training ended (not stopped), before the final evaluation.
  LOOM_OPTION(ResultHook, after_training);
  // Rank 0, after the final evaluation (result.accuracy set with test data).
  LOOM_OPTION(ResultHook, after_evaluation);

 private:
  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<amp::MixedPrecisionOptimizer> optimizer_;
  TrainerOptions options_;
  int rank_ = 0, world_ = 1;
  std::vector<double> base_lrs_;  // the optimizer's rates before any warm-up or resume
  std::shared_ptr<dist::DistributedDataParallel> ddp_;
  std::unique_ptr<class TraceRecording> trace_;
};

// Every rank tests its shard of the test set (a ShardSampler) with rank 0's
// batch-norm statistics (broadcast first) and in the dtypes it trained in
// (the optimizer's autocast); (correct, total) are summed over the ranks.
// Collective when `group` is not null.
dist::AccuracyCounts test_accuracy(nn::Module& model, data::DataLoader& loader, dist::ProcessGroup* group,
                                   amp::MixedPrecisionOptimizer& optimizer);

}  // namespace loom::train
