#include <loom/train/trainer.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include <loom/core/autograd.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/error.h>
#include <loom/dist/join.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/loss.h>
#include <loom/train/captured_step.h>
#include <loom/train/monitor.h>
#include <loom/train/resume.h>
#include <loom/train/stop.h>
#include <loom/train/trace.h>

namespace loom::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double FitResult::images_per_second() const {
  const double seconds = std::chrono::duration<double>(elapsed).count();
  return seconds > 0 ? static_cast<double>(images) / seconds : 0.0;
}

namespace {

// This rank's shard of the test set, then (correct, total) summed over ranks.
dist::AccuracyCounts evaluate(nn::Module& model, data::DataLoader& loader, dist::ProcessGroup* group) {
  NoGradGuard no_grad;
  model.eval();
  dist::AccuracyCounts counts;
  loader.start_epoch(0);
  while (auto batch = loader.next()) {
    counts.correct += count_correct(model(batch->images), batch->labels);
    counts.total += batch->size();
  }
  model.train();
  return dist::all_reduce_accuracy(counts, group);
}

// The device the model's parameters are on (the CPU for a model without any).
Device model_device(nn::Module& model) {
  const std::vector<Tensor> parameters = model.parameters();
  return parameters.empty() ? Device::cpu() : parameters.front().device();
}

// The first `warmup_steps` steps run at (step + 1) / warmup_steps of the
// scheduled rate, so the rate rises linearly to it; 1 afterwards.
double warmup_factor(int64_t step, int64_t warmup_steps) {
  return step < warmup_steps ? static_cast<double>(step + 1) / static_cast<double>(warmup_steps) : 1.0;
}

// The batches of one optimizer step, run forward and backward.
struct MicroBatches {
  int64_t batches = 0;  // run; fewer than asked when the loader ended
  int64_t images = 0;
  data::Batch last;     // the last one run
  Tensor loss;          // their mean loss (the loss itself for one batch)
  double data_wait_seconds = 0;
  Clock::time_point start = Clock::now();
  // Forward and backward as the host saw them, the waits for data left out.
  double compute_seconds() const {
    return std::chrono::duration<double>(Clock::now() - start).count() - data_wait_seconds;
  }
};

// Gradient accumulation: zeroes the gradients, then runs up to `count`
// batches forward and backward, each loss divided by `count` so that the
// gradients add up to the mean over the batches; with DDP the batches before
// the last run under no_sync(), so the last backward all-reduces the sum.
MicroBatches run_micro_batches(nn::Module& trained, data::DataLoader& data, int64_t count,
                               amp::MixedPrecisionOptimizer& optimizer, dist::DistributedDataParallel* ddp,
                               const StepFunction& step_function) {
  MicroBatches micro;
  optimizer.zero_grad();
  for (; micro.batches < count; ++micro.batches) {
    std::optional<data::Batch> batch = data.next();
    if (!batch) break;
    micro.data_wait_seconds += data.last_wait_seconds();
    std::optional<dist::DistributedDataParallel::NoSyncGuard> no_sync;
    if (ddp && micro.batches + 1 < count) no_sync.emplace(ddp->no_sync());
    Tensor loss;
    {
      auto autocast = optimizer.autocast();  // the loss in f32; O1: f16 convolutions
      loss = step_function ? step_function(trained, *batch) : cross_entropy(trained(batch->images), batch->labels);
    }
    const Tensor part = count > 1 ? scale(loss, 1.0 / static_cast<double>(count)) : loss;
    // With DDP and no no_sync, the gradients are averaged when backward returns.
    optimizer.scale_loss(part).backward();
    NoGradGuard no_grad;
    micro.loss = micro.loss.defined() ? add(micro.loss, part.detach()) : part.detach();
    micro.images += batch->size();
    micro.last = std::move(*batch);
  }
  return micro;
}

// One optimizer step of one batch through `captured` (TrainerOptions::cuda_graph):
// the batch's forward, backward and optimizer step, replayed or eager.
MicroBatches run_captured_step(data::DataLoader& data, CapturedStep& captured) {
  MicroBatches micro;
  std::optional<data::Batch> batch = data.next();
  if (!batch) return micro;
  micro.data_wait_seconds = data.last_wait_seconds();
  micro.loss = captured.run(*batch);
  micro.batches = 1;
  micro.images = batch->size();
  micro.last = std::move(*batch);
  return micro;
}

// What every rank agrees on at the end of an epoch run inside a Join: the
// images all ranks trained on, whether any rank left the epoch before its
// data ended (max_steps, an agreed stop), and the stop signal any rank has
// received by now (one sum and one max all-reduce).
struct EpochEnd {
  int64_t images = 0;
  bool left_early = false;
  int stop_signal = 0;
};
EpochEnd agree_epoch_end(dist::ProcessGroup& group, int64_t images, bool left_early, int stop_signal) {
  const int64_t all_images = dist::all_reduce_values(group, {images}, dist::ReduceOp::sum)[0];
  const std::vector<int64_t> agreed =
      dist::all_reduce_values(group, {left_early ? 1 : 0, stop_signal}, dist::ReduceOp::max);
  return {all_images, agreed[0] != 0, static_cast<int>(agreed[1])};
}

}  // namespace

dist::AccuracyCounts test_accuracy(nn::Module& model, data::DataLoader& loader, dist::ProcessGroup* group,
                                   amp::MixedPrecisionOptimizer& optimizer) {
  if (group) {
    for (auto& [name, buffer] : model.named_buffers()) group->broadcast(buffer, 0)->wait();
  }
  auto autocast = optimizer.autocast();  // evaluate as trained
  return evaluate(model, loader, group);
}

Trainer::Trainer(std::shared_ptr<nn::Module> model, std::shared_ptr<amp::MixedPrecisionOptimizer> optimizer,
                 TrainerOptions options)
    : model_(std::move(model)), optimizer_(std::move(optimizer)), options_(std::move(options)) {
  LOOM_CHECK(model_ != nullptr && optimizer_ != nullptr, "Trainer: the model and the optimizer must not be null");
  LOOM_CHECK(options_.epochs() >= 0 && options_.max_steps() >= 0 && options_.max_steps_per_epoch() >= 0 &&
                 options_.warmup_steps() >= 0,
             "TrainerOptions: epochs, max_steps, max_steps_per_epoch and warmup_steps must be >= 0");
  LOOM_CHECK(options_.log_interval() >= 1, "TrainerOptions: log_interval must be >= 1, got ", options_.log_interval());
  LOOM_CHECK(options_.accumulate_steps() >= 1, "TrainerOptions: accumulate_steps must be >= 1, got ",
             options_.accumulate_steps());
  LOOM_CHECK(options_.clip_grad_norm() >= 0, "TrainerOptions: clip_grad_norm must be >= 0 (0: off), got ",
             options_.clip_grad_norm());
  StopSignals::install(options_.stop_signal());
  if (const auto& group = options_.process_group()) {
    rank_ = group->rank();
    world_ = group->size();
  }
  optim::Optimizer& inner = optimizer_->optimizer();
  for (size_t g = 0; g < inner.num_groups(); ++g) base_lrs_.push_back(inner.lr(g));
  // Fails now, before any training, when the trace file cannot be written.
  trace_ = std::make_unique<TraceRecording>(options_.trace_path(), rank_, world_);
}

Trainer::~Trainer() = default;

FitResult Trainer::fit(data::DataLoader& train_data, data::DataLoader* test_data) {
  const bool leader = rank_ == 0;
  dist::ProcessGroup* group = options_.process_group().get();
  const Device device = model_device(*model_);
  amp::MixedPrecisionOptimizer& optimizer = *optimizer_;
  optim::Optimizer& inner = optimizer.optimizer();
  const int64_t epochs = options_.epochs();

  // Resume: the model and everything an uninterrupted run would have had
  // after the checkpoint's step, mid-epoch too (EpochStart continues that
  // epoch after its samples consumed, on any number of processes).
  const TrainingPosition resumed =
      resume_training(options_.checkpoints(), world_, train_data.options().batch_size() * world_, device, leader, group,
                      *model_, optimizer, scheduler_.get(), options_.settings())
          .value_or(TrainingPosition{});
  // DDP checks that every rank holds the same parameters, broadcasts rank 0's,
  // and averages the gradients during backward.
  if (group && !ddp_) ddp_ = std::make_shared<dist::DistributedDataParallel>(model_, options_.process_group(), options_.ddp());
  nn::Module& trained = ddp_ ? static_cast<nn::Module&>(*ddp_) : *model_;
  // --cuda-graph: each step one graph's replay, where the run allows.
  std::optional<CapturedStep> captured;
  if (options_.cuda_graph()) {
    LOOM_CHECK(device.is_cuda(), "TrainerOptions::cuda_graph (--cuda-graph) needs the model on a GPU, not on ",
               device.str());
    const std::optional<std::string> why =
        CapturedStep::refusal(device, ddp_ ? ddp_->process_group().get() : nullptr,
                              ddp_ && options_.join() && options_.join()->enable(), options_.accumulate_steps(),
                              options_.clip_grad_norm());
    if (!why) {
      captured.emplace(trained, optimizer, [this](nn::Module& m, const data::Batch& b) {
        return step_function_ ? step_function_(m, b) : cross_entropy(m(b.images), b.labels);
      }, device, leader, ddp_ ? ddp_->process_group() : nullptr);
    } else if (leader) {
      std::fprintf(stderr, "--cuda-graph: the training steps run eagerly: %s\n", why->c_str());
    }
  }

  // `step` and `steps_per_epoch` count batches (what the loader and the
  // checkpoints count); an optimizer step takes `accumulate` of them, the
  // epoch's last step what is left (the hooks, lines and records count steps).
  const int64_t accumulate = options_.accumulate_steps();
  const int64_t batches = train_data.num_batches();
  const int64_t steps_per_full_epoch =
      options_.max_steps_per_epoch() > 0 ? std::min(batches, options_.max_steps_per_epoch() * accumulate) : batches;
  const int64_t updates_per_epoch = (steps_per_full_epoch + accumulate - 1) / accumulate;
  const bool per_step_schedule = scheduler_ && options_.scheduler_interval() == SchedulerInterval::step;
  if (leader && resumed.epoch >= epochs && epochs > 0) {
    std::printf("The checkpoint has %lld of %lld epochs done: nothing left to train\n",
                static_cast<long long>(resumed.epoch), static_cast<long long>(epochs));
    std::fflush(stdout);
  }
  const CheckpointOptions& checkpoints = options_.checkpoints();
  std::optional<CheckpointWriter> writer;
  if (leader) writer.emplace(checkpoints, world_);
  int64_t steps = resumed.step;
  // Rank 0 writes the checkpoint after `steps` steps, `epoch_step` of them
  // (`epoch_samples` samples) in epoch `epoch` (0-based), and returns where
  // (nullopt elsewhere, or when a write failed under on_error continue). Every
  // rank calls it: a sharded optimizer's parts are gathered on rank 0 first, a
  // collective, which a second call after the same step skips on every rank.
  auto save_checkpoint = [&](CheckpointKind kind, int64_t number, int64_t epoch, int64_t epoch_step,
                             int64_t epoch_samples) -> std::optional<fs::path> {
    inner.gather_state(0);  // a sharded optimizer (ZeRO) holds a part of its state on each rank
    if (!writer) return std::nullopt;
    return writer->write(kind, number,
                         training_checkpoint(*model_, optimizer, scheduler_.get(), train_data, world_,
                                             {epoch, epoch_step, steps, epoch_samples, world_}, options_.settings()));
  };

  // Rank 0's progress display, --metrics and --tensorboard.
  const DType input_dtype = amp::input_dtype(optimizer.level());
  RunDescription description;
  description.program = options_.program();
  description.command = options_.command_line();
  description.world_size = world_;
  description.backend = group ? group->backend_name() : "none";
  description.device = device;
  description.amp = amp::opt_level_name(optimizer.level());
  description.dtype = dtype_name(input_dtype);
  description.global_batch_size = train_data.options().batch_size() * world_ * accumulate;
  description.epochs = epochs;
  description.steps_per_epoch = updates_per_epoch;
  description.log_interval = options_.log_interval();
  TrainingMonitor monitor(leader, options_.progress(), options_.metrics_path(), options_.tensorboard_dir(),
                          std::move(description));
  StopAgreement stop_agreement(options_.process_group());
  auto steps_left = [&] { return options_.max_steps() == 0 || steps < options_.max_steps(); };
  // Uneven inputs (TrainerOptions::join): each epoch inside a dist::Join.
  const bool uneven = ddp_ != nullptr && options_.join() && options_.join()->enable();

  FitResult result;
  int64_t images = 0;            // this rank's
  int64_t images_all_ranks = 0;  // with Join: each epoch's, summed over the ranks at its end
  const auto start = Clock::now();
  for (int64_t epoch = resumed.epoch; epoch < epochs && steps_left() && result.stop_signal == 0; ++epoch) {
    // A resumed epoch continues its global sample order on this world's ranks (train/resume.h).
    const EpochStart epoch_start(train_data, epoch, epoch == resumed.epoch ? &resumed : nullptr, world_,
                                 options_.max_steps_per_epoch() * accumulate);
    const int64_t steps_per_epoch = epoch_start.steps();  // this rank's batches
    // Optimizer steps group the batches by their index in the epoch up to
    // the largest rank's count, so that with Join every rank synchronizes the
    // same iterations (a rank whose data ends inside a group contributes what
    // it accumulated from join()); without Join every rank has this count.
    const int64_t epoch_batches =
        uneven ? dist::all_reduce_values(*group, {steps_per_epoch}, dist::ReduceOp::max)[0] : steps_per_epoch;
    const int64_t epoch_updates = (epoch_batches + accumulate - 1) / accumulate;  // this epoch's, after a resume too
    int64_t step = epoch_start.first_step();
    int64_t epoch_images = 0;  // this rank's
    monitor.start_epoch(epoch, (step + accumulate - 1) / accumulate);
    // This epoch's rates before warm-up: the schedule's (its step() and a
    // resume set them), or the optimizer's first rates without one (the
    // optimizer may hold a warm-up rate, also one loaded from a checkpoint).
    std::vector<double> epoch_lrs = base_lrs_;
    if (scheduler_) {
      for (size_t g = 0; g < inner.num_groups(); ++g) epoch_lrs[g] = inner.lr(g);
    }
    // An optimizer step in two halves: the warm-up rate before its batches
    // (once per step), the update after them. A joined rank runs both from
    // join() for every step the others take (dist::ShadowStep).
    bool step_begun = false;
    auto begin_step = [&] {
      if (std::exchange(step_begun, true)) return;
      const int64_t warmup = options_.warmup_steps();
      if (warmup > 0 && steps <= warmup) {  // the step after the warm-up restores the full rate
        for (size_t g = 0; g < inner.num_groups(); ++g) {
          if (per_step_schedule) epoch_lrs[g] = inner.lr(g);  // this step's rate: the schedule stepped last
          inner.set_lr(g, epoch_lrs[g] * warmup_factor(steps, warmup));
        }
      }
    };
    struct Update {
      double grad_norm = 0, lr = 0;
    };
    auto finish_step = [&] {  // after DDP averaged the gradients
      Update update;
      if (options_.clip_grad_norm() > 0) update.grad_norm = optimizer.clip_grad_norm(options_.clip_grad_norm());
      // Unscales the averaged gradients (unless clipping did); skips the step on
      // inf / NaN. A captured step took it already.
      if (!captured) optimizer.step();
      update.lr = inner.lr(0);
      if (per_step_schedule) scheduler_->step();
      ++steps;
      step_begun = false;
      return update;
    };
    std::optional<dist::ShadowStep> shadow_step;  // outlives the Join that holds it
    std::optional<dist::Join> join;
    if (uneven) {
      shadow_step.emplace(options_.process_group(), [&] {
        begin_step();
        finish_step();
      });
      join.emplace(std::vector<std::reference_wrapper<dist::Joinable>>{*ddp_, *shadow_step}, *options_.join());
    }
    while (step < steps_per_epoch && steps_left()) {
      begin_step();
      // One optimizer step: `group_size` batches, the all-reduce on the last only.
      const int64_t group_size = std::min(accumulate, epoch_batches - step);
      MicroBatches micro = captured ? run_captured_step(train_data, *captured)
                                    : run_micro_batches(trained, train_data, group_size, optimizer, ddp_.get(),
                                                        step_function_);
      images += micro.images;
      epoch_images += micro.images;
      if (micro.batches == 0) break;  // the loader ended early
      if (micro.batches < group_size && uneven && step + micro.batches == steps_per_epoch) {
        step += micro.batches;  // this rank's data ended inside the group: join() takes its step
        break;
      }
      LOOM_CHECK(micro.batches == group_size, "Trainer: the loader ended after ", step + micro.batches, " of the ",
                 steps_per_epoch, " batches it announced, in the middle of an accumulation of ", group_size);
      if (ddp_) ddp_->wait_for_gradients();  // the averaged gradients, before they are clipped
      const Update update_done = finish_step();
      step += group_size;
      // Every rank ran this step (no rank's data had run out): the samples
      // consumed are a prefix of the epoch's list, so a checkpoint resumes
      // exactly, and every rank takes part in the stop agreement.
      const bool every_rank_ran = !join || join->all_ranks_active();
      const data::Batch* batch = &micro.last;
      const Tensor& loss = micro.loss;
      const double data_wait = micro.data_wait_seconds;
      const int64_t update = (step + accumulate - 1) / accumulate;  // optimizer steps done in this epoch
      const StepInfo info{.epoch = epoch,
                          .epochs = epochs,
                          .epoch_step = update,
                          .steps_per_epoch = epoch_updates,
                          .step = steps,
                          .batch = batch,
                          .loss = &loss,
                          .data_wait_seconds = data_wait,
                          .step_seconds = micro.compute_seconds(),
                          .grad_norm = update_done.grad_norm};
      if (leader && update % options_.log_interval() == 0) {
        monitor.before_output();
        const double loss_value = loss.item();
        if (on_log_) {
          on_log_(info, loss_value);
        } else {
          std::printf("Epoch [%lld/%lld], Step [%lld/%lld], Loss: %.4f\n", static_cast<long long>(epoch + 1),
                      static_cast<long long>(epochs), static_cast<long long>(update),
                      static_cast<long long>(epoch_updates), loss_value);
        }
        std::fflush(stdout);
        monitor.set_loss(loss_value);
      }
      monitor.step({.epoch_step = update,
                    .step = steps,
                    .images = micro.images * world_,
                    .data_wait_seconds = data_wait,
                    .loss = &loss,
                    .lr = update_done.lr,
                    .ddp = ddp_.get(),
                    .scaler = &optimizer.scaler()});
      if (on_step_) on_step_(info);
      bool saved_now = false;  // rank 0 wrote this step's checkpoint
      // An epoch checkpoint follows the last step; none in the uneven tail.
      if (every_rank_ran && step < steps_per_epoch && step_checkpoint_due(checkpoints, steps)) {
        monitor.before_output();
        saved_now = save_checkpoint(CheckpointKind::step, steps, epoch, step, epoch_start.samples_after(step)).has_value();
      }
      if (!every_rank_ran) {
        stop_agreement.finish();  // the all-reduce of the last step every rank ran; a stop waits for the epoch's end
        continue;
      }
      // SIGTERM / the stop signal / SIGINT on any rank: every rank stops after the same step.
      if ((result.stop_signal = stop_agreement.poll()) != 0) {
        monitor.before_output();
        std::optional<fs::path> saved;
        if (checkpoints_enabled(checkpoints)) {
          saved = saved_now ? writer->path(CheckpointKind::step, steps)
                            : save_checkpoint(CheckpointKind::step, steps, epoch, step, epoch_start.samples_after(step));
        }
        print_preempted(rank_, result.stop_signal, steps, saved);
        break;
      }
    }
    train_data.stop();
    monitor.end_epoch_steps();
    bool left_early = step < steps_per_epoch;  // stopped, or max_steps reached mid-epoch
    int deferred_stop = 0;                     // a stop signal the uneven tail kept waiting
    if (join) {
      stop_agreement.finish();  // the all-reduce every rank issued at the last step all ran
      join->join();             // shadows the other ranks' steps until every rank's data ran out
      const EpochEnd end = agree_epoch_end(*group, epoch_images, left_early, StopSignals::received());
      images_all_ranks += end.images;
      monitor.set_epoch_images(end.images);
      left_early = end.left_early;
      if (result.stop_signal == 0) deferred_stop = end.stop_signal;
    }
    if (result.stop_signal != 0 || left_early) break;
    if (scheduler_ && !per_step_schedule) scheduler_->step();
    std::optional<fs::path> epoch_checkpoint;
    if (checkpoints_enabled(checkpoints))
      epoch_checkpoint = save_checkpoint(CheckpointKind::epoch, epoch + 1, epoch + 1, 0, 0);
    if (deferred_stop != 0) {  // the epoch is complete and saved: stop here
      result.stop_signal = deferred_stop;
      monitor.before_output();
      print_preempted(rank_, result.stop_signal, steps, epoch_checkpoint);
      break;
    }
    // The test accuracy of every epoch (--metrics / --tensorboard, or
    // evaluate_each_epoch); the last one's is the final evaluation's.
    std::optional<dist::AccuracyCounts> accuracy;
    if (test_data && epoch + 1 < epochs && steps_left() &&
        (monitor.records_epochs() || options_.evaluate_each_epoch())) {
      stop_agreement.finish();  // its all-reduce before the evaluation's collectives
      accuracy = test_accuracy(*model_, *test_data, group, optimizer);
      if (monitor.records_epochs()) monitor.end_epoch(accuracy);
    }
    if (leader && after_epoch_) after_epoch_(epoch, accuracy);
  }
  stop_agreement.finish();
  result.steps = steps;
  result.images = uneven ? images_all_ranks : images * world_;  // without Join every rank trains as many per step
  result.data_wait_seconds = train_data.total_wait_seconds();
  if (result.stop_signal != 0) {
    // The last epoch has no accuracy; the ranks meet so that rank 0's
    // checkpoint is on disk before any rank exits.
    monitor.end_epoch(std::nullopt);
    monitor.finish();
    if (group) group->barrier()->wait();
    return result;
  }
  // The time is the slowest rank's, queued GPU work included (an NCCL
  // barrier only orders the stream: the device synchronisation waits for it).
  if (group) group->barrier()->wait();
  if (device.is_cuda()) cuda::synchronize(device.index);
  result.elapsed = Clock::now() - start;
  if (leader && after_training_) after_training_(result);

  // Rank 0's model on every rank: its batch-norm statistics too.
  if (test_data) result.accuracy = test_accuracy(*model_, *test_data, group, optimizer);
  monitor.end_epoch(result.accuracy);
  monitor.finish();
  if (leader && after_evaluation_) after_evaluation_(result);
  std::fflush(stdout);
  trace_->finish(leader ? stdout : nullptr);
  return result;
}

}  // namespace loom::train
