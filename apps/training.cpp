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
#include <loom/train/stop.h>
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

train::TrainerOptions trainer_options(const char* program, int argc, char** argv, const CommonFlags& flags,
                                      const CheckpointFlags& checkpoints, std::shared_ptr<dist::ProcessGroup> group) {
  return train::TrainerOptions()
      .program(program)
      .command_line({argv, argv + argc})
      .log_interval(flags.log_interval)
      .progress(flags.progress)
      .metrics_path(flags.metrics)
      .tensorboard_dir(flags.tensorboard)
      .trace_path(flags.trace)
      .checkpoints(checkpoint_options(checkpoints))
      .stop_signal(train::parse_signal_name(checkpoints.signal))
      .process_group(std::move(group));
}

void print_loss_scaling(const amp::MixedPrecisionOptimizer& optimizer, const std::string& amp) {
  if (!optimizer.scaler().enabled()) return;
  std::printf("Mixed precision --amp %s: loss scale %g, %lld steps skipped for inf / NaN gradients\n", amp.c_str(),
              optimizer.scaler().get_scale(), static_cast<long long>(optimizer.scaler().skipped_steps()));
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
