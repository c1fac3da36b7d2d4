#include "apps/training.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <loom/core/autograd.h>
#include <loom/core/error.h>
#include <loom/core/generator.h>
#include <loom/core/log.h>
#include <loom/core/parallel.h>
#include <loom/dist/environment.h>
#include <loom/dist/process_group_nccl.h>
#include <loom/ops/cpu/gemm.h>
#include <loom/ops/loss.h>

namespace loom::apps {

void add_common_flags(CLI::App& app, CommonFlags& flags) {
  app.add_option("--device", flags.device, "cpu, cuda, cuda:N or auto")->capture_default_str();
  add_choice(app, "--backend", flags.backend,
             "nccl, gloo, shm or auto (nccl for CUDA devices; for the CPU shm when every rank is on this host, "
             "else gloo)",
             {"auto", "nccl", "gloo", "shm"});
  add_choice(app, "--amp", flags.amp,
             "mixed precision, apex's opt levels: O0 (f32), O1 (f16 convolutions, f32 weights), O2 (f16 weights "
             "but batch norm, f32 masters, loss scaling), O3 (pure f16), bf16 (bf16 weights, f32 masters)",
             {"O0", "O1", "O2", "O3", "bf16"});
  app.add_flag("--sync-bn", flags.sync_bn, "batch-norm statistics over all ranks (SyncBatchNorm)");
  add_count(app, "--workers", flags.workers, "data loader threads (0 = load in the training thread)", 0);
  add_count(app, "--threads", flags.threads,
            "CPU threads per process (0 = all cores, or 1 when several processes run)", 0);
  app.add_option("--seed", flags.seed, "initialisation, shuffling and augmentation seed")->capture_default_str();
  add_count(app, "--log-interval", flags.log_interval, "steps between loss lines", 1);
  app.add_option("--timeout", flags.timeout_s,
                 "seconds a collective may wait for the other processes before the run fails (0 = "
                 "LOOM_COLLECTIVE_TIMEOUT, else 1800); starting up, they wait at least 300")
      ->capture_default_str()
      ->check(at_least(0));
  add_choice(app, "--progress", flags.progress,
             "rank 0's progress on stderr: bar (step, images/s, loss, data wait, ETA; redrawn in place), lines "
             "(one per --log-interval steps), none, or auto: bar when stderr is a terminal, else lines",
             {"auto", "bar", "lines", "none"});
  app.add_option("--metrics", flags.metrics,
                 "rank 0 appends JSON Lines to FILE: a header, a record every --log-interval steps and one per epoch "
                 "with the test accuracy (schema: docs/metrics.md)");
  app.add_option("--tensorboard", flags.tensorboard,
                 "rank 0 writes the --metrics numbers as TensorBoard scalars into an event file in DIR "
                 "(tensorboard --logdir DIR)");
  add_trace_flag(app, flags.trace);
}

void set_threads(const CommonFlags& flags, int world) {
  if (flags.threads > 0) {
    set_num_threads(flags.threads);
  } else if (world > 1) {
    set_num_threads(1);  // several ranks share this machine's cores
  }
}

std::string choose_backend(const std::string& flag, Device device) {
  const std::string backend = flag != "auto" ? flag : device.is_cuda() ? "nccl" : "auto";
  if (backend == "nccl") {
    dist::require_nccl();
    LOOM_CHECK(device.is_cuda(), "--backend nccl all-reduces CUDA tensors, but this run trains on ", device.str(),
               "; use --backend gloo (or auto) for CPU training, or --device cuda on a machine with a GPU");
  }
  return backend;
}

std::shared_ptr<dist::ProcessGroup> make_process_group(const CommonFlags& flags, const std::string& backend,
                                                       Device device, int world) {
  if (world <= 1) return nullptr;
  const dist::Milliseconds timeout =
      flags.timeout_s > 0 ? dist::Milliseconds(static_cast<int64_t>(flags.timeout_s * 1000))
                          : dist::collective_timeout_from_environment(dist::kDefaultCollectiveTimeout);
  std::shared_ptr<dist::ProcessGroup> group =
      dist::init_process_group({.backend = backend,
                                .init_method = "env://",
                                .timeout = std::max<dist::Milliseconds>(timeout, std::chrono::minutes(5)),
                                .device_index = device.is_cuda() ? device.index : -1});
  group->set_timeout(timeout);
  return group;
}

data::DataLoaderOptions loader_options(const CommonFlags& flags, int64_t batch_size, Device device) {
  return data::DataLoaderOptions()
      .batch_size(batch_size)
      .num_workers(flags.workers)
      .seed(flags.seed)
      .dtype(amp::input_dtype(amp::parse_opt_level(flags.amp)))
      .pin_memory(device.is_cuda())
      .device(device);
}

RunDescription describe_run(const char* program, int argc, char** argv, const CommonFlags& flags, int world,
                            const dist::ProcessGroup* group, Device device, int64_t global_batch_size, int64_t epochs,
                            int64_t steps_per_epoch) {
  RunDescription run;
  run.program = program;
  run.command.assign(argv, argv + argc);
  run.world_size = world;
  run.backend = group ? group->backend_name() : "none";
  run.device = device;
  run.amp = flags.amp;
  run.dtype = dtype_name(amp::input_dtype(amp::parse_opt_level(flags.amp)));
  run.global_batch_size = global_batch_size;
  run.epochs = epochs;
  run.steps_per_epoch = steps_per_epoch;
  run.log_interval = flags.log_interval;
  return run;
}

nn::Checkpoint training_checkpoint(nn::Module& model, amp::MixedPrecisionOptimizer& optimizer,
                                   const optim::LRScheduler* scheduler, data::DataLoader& loader,
                                   TrainingPosition position, nn::Metadata settings) {
  nn::TrainingState state;
  state.epoch = position.epoch;
  state.epoch_step = position.epoch_step;
  state.step = position.step;
  if (scheduler) state.scheduler_last_epoch = scheduler->last_epoch();
  state.sampler_epoch = loader.sampler().epoch();
  state.generators["default"] = {default_generator().seed(), default_generator().counter()};
  state.extra_metadata = std::move(settings);
  optimizer.save_state(state);  // optimizer state, f32 masters, loss scale
  return nn::Checkpoint{model.state_dict(), std::move(state)};
}

std::optional<TrainingPosition> resume_training(const CheckpointFlags& flags, int world, Device device, bool leader,
                                                dist::ProcessGroup* group, nn::Module& model,
                                                amp::MixedPrecisionOptimizer& optimizer,
                                                optim::LRScheduler* scheduler, const nn::Metadata& settings) {
  std::optional<ResumePoint> resume = find_resume_point(flags, world, device, leader ? stdout : nullptr);
  std::optional<TrainingPosition> position;
  if (resume) {
    position.emplace();
    nn::Checkpoint& checkpoint = resume->checkpoint;
    // Its --amp level first: the model's dtypes depend on it.
    if (checkpoint.training) optimizer.check_compatible(*checkpoint.training);
    nn::load_model_state(model, checkpoint.model, "checkpoint " + resume->path.string());
    if (checkpoint.training) {
      const nn::TrainingState& state = *checkpoint.training;
      optimizer.load_state(state);  // the optimizer, and the masters and loss scale of --amp
      if (scheduler && state.scheduler_last_epoch) scheduler->set_last_epoch(*state.scheduler_last_epoch);
      if (auto g = state.generators.find("default"); g != state.generators.end())
        default_generator().set_state(g->second.seed, g->second.counter);
      *position = {state.epoch, state.epoch_step, state.step};
      if (leader) {
        for (auto& [key, value] : settings) {
          auto saved = state.extra_metadata.find(key);
          if (saved != state.extra_metadata.end() && saved->second != value) {
            std::printf("note: the checkpoint was written with %s %s; this run uses %s\n", key.c_str(),
                        saved->second.c_str(), value.c_str());
          }
        }
      }
    }
    if (leader) {
      std::printf("Resuming from %s at epoch %lld, batch %lld (step %lld)\n", resume->path.c_str(),
                  static_cast<long long>(position->epoch + 1), static_cast<long long>(position->epoch_step),
                  static_cast<long long>(position->step));
      report_resume_to_launcher(str("step ", position->step, " (epoch ", position->epoch + 1, ", batch ",
                                    position->epoch_step, ") from ", resume->path.string()));
    }
  }
  check_same_resume_step(group, position ? position->step : -1);
  return position;
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

}  // namespace

dist::AccuracyCounts test_accuracy(nn::Module& model, data::DataLoader& loader, dist::ProcessGroup* group,
                                   amp::MixedPrecisionOptimizer& optimizer) {
  if (group) {
    for (auto& [name, buffer] : model.named_buffers()) group->broadcast(buffer, 0)->wait();
  }
  auto autocast = optimizer.autocast();  // evaluate as trained
  return evaluate(model, loader, group);
}

int end_stopped_run(TrainingMonitor& monitor, dist::ProcessGroup* group, int stop_signal) {
  monitor.end_epoch(std::nullopt);
  monitor.finish();
  if (group) group->barrier()->wait();
  return 128 + stop_signal;
}

void print_loss_scaling(const amp::MixedPrecisionOptimizer& optimizer, const std::string& amp) {
  if (!optimizer.scaler().enabled()) return;
  std::printf("Mixed precision --amp %s: loss scale %g, %lld steps skipped for inf / NaN gradients\n", amp.c_str(),
              optimizer.scaler().get_scale(), static_cast<long long>(optimizer.scaler().skipped_steps()));
}

dist::AccuracyCounts final_test_accuracy(nn::Module& model, data::DataLoader& loader, dist::ProcessGroup* group,
                                         amp::MixedPrecisionOptimizer& optimizer, TrainingMonitor& monitor) {
  // Rank 0's model on every rank: its batch-norm statistics too.
  const dist::AccuracyCounts accuracy = test_accuracy(model, loader, group, optimizer);
  monitor.end_epoch(accuracy);
  monitor.finish();
  return accuracy;
}

int run_app(CLI::App& app, const char* program, std::vector<std::string> arguments, const std::function<int()>& run) {
  try {
    std::vector<char*> pointers;
    for (auto& argument : arguments) pointers.push_back(argument.data());
    app.parse(static_cast<int>(pointers.size()), pointers.data());
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return report_usage_error(program, e);
  }
  try {
    log_level();  // a bad LOOM_LOG_LEVEL fails before any work, in one process as in many
    ops::cpu::gemm_kernel();  // and so does a bad LOOM_CPU_GEMM
    return run();
  } catch (const std::exception& e) {
    return report_fatal_error(program, e);  // names the rank when several run
  }
}

}  // namespace loom::apps
