#include "apps/app_common.h"

#include <cstdlib>
#include <sstream>

#include <loom/core/cuda/runtime.h>
#include <loom/core/error.h>
#include <loom/core/version.h>
#include <loom/dist/environment.h>
#include <loom/dist/launcher.h>
#include <loom/ops/cpu/gemm.h>
#include <loom/train/stop.h>

namespace loom::apps {

Device training_device(const std::string& name, int local_rank, int device_count) {
  if (name == "auto" && device_count == 0) return Device::cpu();
  Device device = name == "auto" ? Device::cuda(0) : parse_device(name);
  if (device.is_cuda() && name.find(':') == std::string::npos)
    device.index = device_count > 0 ? local_rank % device_count : local_rank;
  return device;
}

Device resolve_training_device(const std::string& name, int local_rank) {
  const Device device = training_device(name, local_rank, name == "cpu" ? 0 : cuda::device_count());
  // The current device for the whole process (torch.cuda.set_device(local_rank)): ops launch on it.
  if (device.is_cuda()) cuda::set_device(device.index);
  return device;
}

std::string version_text(const std::string& program) {
  const int devices = cuda::device_count();
  return program + " " + version() + "\n" + build_summary() + "this machine: f32 GEMM kernel " +
         ops::cpu::gemm_kernel_name() + ", " + std::to_string(devices) + " CUDA device" + (devices == 1 ? "" : "s") +
         " visible\n";
}

}  // namespace loom::apps

namespace loom::apps {

CLI::Validator number_where(std::function<bool(double)> accepts, const std::string& requirement,
                            const std::string& description) {
  return CLI::Validator(
      [accepts = std::move(accepts), requirement](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        if (text.empty() || end == nullptr || *end != '\0') return "'" + text + "' is not a number";
        if (!accepts(value)) return "must be " + requirement + ", got '" + text + "'";
        return "";
      },
      description);
}

CLI::Validator at_least(double minimum) {
  std::ostringstream requirement;
  requirement << "a number >= " << minimum;
  // NaN fails the comparison, so it is refused too.
  return number_where([minimum](double value) { return value >= minimum; }, requirement.str(),
                      ">= " + std::to_string(minimum));
}

CLI::Validator whole_at_least(long long minimum) {
  return CLI::Validator(
      [minimum](std::string& text) -> std::string {
        char* end = nullptr;
        const long long value = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || end == nullptr || *end != '\0') return "'" + text + "' is not a whole number";
        if (value < minimum) return "must be a whole number >= " + std::to_string(minimum) + ", got '" + text + "'";
        return "";
      },
      ">= " + std::to_string(minimum));
}

CLI::Option* add_choice(CLI::App& app, const std::string& name, std::string& value, const std::string& help,
                        const std::vector<std::string>& choices) {
  return app.add_option(name, value, help)->capture_default_str()->check(CLI::IsMember(choices));
}

void add_version_flag(CLI::App& app, const std::string& program) {
  // app.exit() ends the text with a newline of its own.
  auto text = [program] {
    std::string text = version_text(program);
    if (!text.empty() && text.back() == '\n') text.pop_back();
    return text;
  };
  app.set_version_flag("--version", text, "print the version and what this build holds, then exit");
}

}  // namespace loom::apps

// ---- checkpoints, resume, preemption ----

namespace loom::apps {

namespace fs = std::filesystem;

void add_checkpoint_flags(CLI::App& app, CheckpointFlags& flags) {
  app.add_option("--checkpoint-dir", flags.dir,
                 "where rank 0 saves {world}GPU_{epoch}epoch.checkpoint after each epoch and "
                 "{world}GPU_step{N}.checkpoint every --checkpoint-every steps ('' = save nothing)")
      ->capture_default_str();
  add_count(app, "--checkpoint-every", flags.every, "steps between step checkpoints (0 = only at epoch ends)", 0);
  add_count(app, "--keep-checkpoints", flags.keep,
            "step checkpoints kept, the newest (older ones are removed; epoch checkpoints are all kept; 0 = all)", 0);
  app.add_option("--resume", flags.resume,
                 "auto (the newest valid checkpoint in --checkpoint-dir), none, or a checkpoint file "
                 "[default: auto when a launcher restarted the job, else none]");
  app.add_option("-c,--checkpoint", flags.resume, "checkpoint file to resume from (the same as --resume FILE)");
  add_choice(app, "--on-checkpoint-error", flags.on_error,
             "when writing a checkpoint fails (full disk, I/O error, read-only directory): stop, or continue "
             "training without it",
             {"stop", "continue"});
  app.add_option("--checkpoint-signal", flags.signal,
                 "signal that, like SIGTERM and SIGINT, stops every rank at the same step with a checkpoint "
                 "(USR1 pairs with sbatch --signal=USR1@90; none = only SIGTERM and SIGINT)")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            try {
              train::parse_signal_name(text);
            } catch (const std::exception& e) {
              return e.what();
            }
            return "";
          },
          "SIGNAL"));
}

train::CheckpointOptions checkpoint_options(const CheckpointFlags& flags) {
  return train::CheckpointOptions()
      .directory(flags.dir)
      .every_steps(flags.every)
      .keep(flags.keep)
      .resume(flags.resume)
      .on_error(train::parse_checkpoint_error_policy(flags.on_error));
}

// ---- command lines and fatal errors ----

void argparse_option_rules(CLI::App& app) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

std::vector<std::string> one_dash_long_options(int argc, char** argv, const std::vector<std::string>& names) {
  std::vector<std::string> arguments(argv, argv + argc);
  for (size_t i = 1; i < arguments.size() && arguments[i] != "--"; ++i) {
    for (const std::string& name : names) {
      if (arguments[i] == name || arguments[i].starts_with(name + "=")) arguments[i] = "-" + arguments[i];
    }
  }
  return arguments;
}

int report_fatal_error(const char* program, const std::exception& error) {
  const std::string line = std::string(program) + ": " + dist::rank_prefix() + error.what();
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  if (!dist::write_torchelastic_error_file(line))
    std::fprintf(stderr, "%s: could not write TORCHELASTIC_ERROR_FILE\n", program);
  return 1;
}

int report_usage_error(const char* program, const std::exception& error) {
  const std::string line = std::string(program) + ": " + error.what();
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  dist::write_torchelastic_error_file(line);
  return 2;
}

void add_trace_flag(CLI::App& app, std::string& path) {
  app.add_option("--trace", path,
                 "write a Chrome trace of the run (ops, DDP buckets, data waits) to this file, one per rank "
                 "(FILE.rank<k>.json) when several run; open it at ui.perfetto.dev");
}

}  // namespace loom::apps
