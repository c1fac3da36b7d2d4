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

class TrainerOptions {
 public:
  // Epochs in all; a resumed run counts the checkpoint's.
  TrainerOptions& epochs(int64_t value) { epochs_ = value; return *this; }
  // Optimizer steps in all after which the run ends, mid-epoch too; 0: no limit.
  TrainerOptions& max_steps(int64_t value) { max_steps_ = value; return *this; }
  // Steps per epoch at most (an epoch ends there, as at the loader's end); 0: the loader's whole epoch.
  TrainerOptions& max_steps_per_epoch(int64_t value) { max_steps_per_epoch_ = value; return *this; }
  // Steps of an epoch between loss lines, progress lines and metrics records.
  TrainerOptions& log_interval(int64_t value) { log_interval_ = value; return *this; }
  // The first `value` steps of the run raise the learning rate linearly, step
  // (s + 1) / value of the scheduled rate at step s (Goyal et al.); 0: none.
  TrainerOptions& warmup_steps(int64_t value) { warmup_steps_ = value; return *this; }
  // Where checkpoints go and what is resumed.
  TrainerOptions& checkpoints(CheckpointOptions value) { checkpoints_ = std::move(value); return *this; }
  // A signal that stops the run with a checkpoint, besides SIGTERM and SIGINT
  // (SIGUSR1 by default: sbatch --signal=USR1@90); 0: none.
  TrainerOptions& stop_signal(int value) { stop_signal_ = value; return *this; }
  // The process group the model trains over, wrapped in DistributedDataParallel; null: one process.
  TrainerOptions& process_group(std::shared_ptr<dist::ProcessGroup> value) { process_group_ = std::move(value); return *this; }
  // DistributedDataParallel's bucket sizes and options, with a process group.
  TrainerOptions& ddp(dist::DistributedDataParallelOptions value) { ddp_ = value; return *this; }
  // Rank 0's progress on stderr: "bar", "lines", "none", or "auto" (a bar on a terminal, else lines).
  TrainerOptions& progress(std::string value) { progress_ = std::move(value); return *this; }
  // JSON Lines file rank 0 appends records to (docs/metrics.md); '': none.
  TrainerOptions& metrics_path(std::string value) { metrics_path_ = std::move(value); return *this; }
  // Directory rank 0 writes TensorBoard scalars into; '': none.
  TrainerOptions& tensorboard_dir(std::string value) { tensorboard_dir_ = std::move(value); return *this; }
  // Chrome trace file (one per rank, FILE.rank<k>.json, when several run); '': none.
  TrainerOptions& trace_path(std::string value) { trace_path_ = std::move(value); return *this; }
  // The run's settings, written into checkpoints; a resume notes each one that changed.
  TrainerOptions& settings(nn::Metadata value) { settings_ = std::move(value); return *this; }
  // The program and its command line, for the metrics file's header.
  TrainerOptions& program(std::string value) { program_ = std::move(value); return *this; }
  TrainerOptions& command_line(std::vector<std::string> value) { command_line_ = std::move(value); return *this; }

  int64_t epochs() const { return epochs_; }
  int64_t max_steps() const { return max_steps_; }
  int64_t max_steps_per_epoch() const { return max_steps_per_epoch_; }
  int64_t log_interval() const { return log_interval_; }
  int64_t warmup_steps() const { return warmup_steps_; }
  const CheckpointOptions& checkpoints() const { return checkpoints_; }
  int stop_signal() const { return stop_signal_; }
  const std::shared_ptr<dist::ProcessGroup>& process_group() const { return process_group_; }
  const dist::DistributedDataParallelOptions& ddp() const { return ddp_; }
  const std::string& progress() const { return progress_; }
  const std::string& metrics_path() const { return metrics_path_; }
  const std::string& tensorboard_dir() const { return tensorboard_dir_; }
  const std::string& trace_path() const { return trace_path_; }
  const nn::Metadata& settings() const { return settings_; }
  const std::string& program() const { return program_; }
  const std::vector<std::string>& command_line() const { return command_line_; }

 private:
  int64_t epochs_ = 1;
  int64_t max_steps_ = 0;
  int64_t max_steps_per_epoch_ = 0;
  int64_t log_interval_ = 100;
  int64_t warmup_steps_ = 0;
  CheckpointOptions checkpoints_ = CheckpointOptions().directory("");
  int stop_signal_ = SIGUSR1;
  std::shared_ptr<dist::ProcessGroup> process_group_;
  dist::DistributedDataParallelOptions ddp_;
  std::string progress_ = "none";
  std::string metrics_path_;
  std::string tensorboard_dir_;
  std::string trace_path_;
  nn::Metadata settings_;
  std::string program_ = "loom";
  std::vector<std::string> command_line_;
};

// What the hooks see of a step.
struct StepInfo {
  int64_t epoch = 0;            // 0-based
  int64_t epochs = 0;           // in all
  int64_t epoch_step = 0;       // steps done in this epoch, this one included
  int64_t steps_per_epoch = 0;
  int64_t step = 0;             // optimizer steps done in the run
  const data::Batch* batch = nullptr;
  const Tensor* loss = nullptr;   // the batch's loss (reading it waits for a GPU's queued work)
  double data_wait_seconds = 0;   // the loader's wait for this batch
  double step_seconds = 0;        // forward, backward and optimizer step, as the host saw them
};

// How fit() ended.
struct FitResult {
  int stop_signal = 0;  // 0, or the signal every rank stopped for (a checkpoint was written)
  int exit_code() const { return stop_signal != 0 ? 128 + stop_signal : 0; }
  std::chrono::steady_clock::duration elapsed{};  // the training, up to the slowest rank's last step
  int64_t images = 0;                // trained in this run, on all ranks
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

class Trainer {
 public:
  // `optimizer` steps `model` (amp::initialize builds both, at any opt level).
  // Installs the stop signals' handlers.
  Trainer(std::shared_ptr<nn::Module> model, std::shared_ptr<amp::MixedPrecisionOptimizer> optimizer,
          TrainerOptions options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Stepped at each epoch's end and saved in checkpoints.
  Trainer& scheduler(std::shared_ptr<optim::LRScheduler> scheduler);
  Trainer& step_function(StepFunction function);
  // After every step, on every rank.
  Trainer& on_step(StepHook hook);
  // Rank 0, every log_interval() steps; by default "Epoch [e/E], Step [i/N], Loss: x".
  Trainer& on_log(LogHook hook);
  // Rank 0, when training ended (not stopped), before the final evaluation.
  Trainer& after_training(ResultHook hook);
  // Rank 0, after the final evaluation (result.accuracy set with test data).
  Trainer& after_evaluation(ResultHook hook);

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

 private:
  class Run;
  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<amp::MixedPrecisionOptimizer> optimizer_;
  TrainerOptions options_;
  int rank_ = 0, world_ = 1;
  std::vector<double> base_lrs_;  // the optimizer's rates before any warm-up or resume
  std::shared_ptr<optim::LRScheduler> scheduler_;
  std::shared_ptr<dist::DistributedDataParallel> ddp_;
  StepFunction step_function_;
  StepHook on_step_;
  LogHook on_log_;
  ResultHook after_training_, after_evaluation_;
  std::unique_ptr<class TraceRecording> trace_;
};

// Every rank tests its shard of the test set (a ShardSampler) with rank 0's
// batch-norm statistics (broadcast first) and in the dtypes it trained in
// (the optimizer's autocast); (correct, total) are summed over the ranks.
// Collective when `group` is not null.
dist::AccuracyCounts test_accuracy(nn::Module& model, data::DataLoader& loader, dist::ProcessGroup* group,
                                   amp::MixedPrecisionOptimizer& optimizer);

}  // namespace loom::train
