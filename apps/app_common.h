// What the apps and the benchmarks share on their command lines: flag errors
// as one line, the training device of a rank, --version, the checkpoint and
// --trace flags. The training loop itself is loom::train (train/trainer.h).
#pragma once

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <loom/core/device.h>
#include <loom/dist/process_group.h>
#include <loom/train/checkpoints.h>

namespace loom::apps {

// The device a process trains on, from --device: "cpu" and "cuda:N" as given;
// "cuda", and "auto" when a GPU is visible, this process's own GPU,
// cuda:(local_rank mod device_count): the one an NCCL group drives by default
// (cuda::local_rank_device), so the ranks of a node spread over its GPUs, and
// a rank shown only its own GPU (CUDA_VISIBLE_DEVICES per task) takes cuda:0.
// "auto" without a GPU is the CPU. `device_count`: the visible CUDA devices.
Device training_device(const std::string& name, int local_rank, int device_count);

// training_device() with this machine's devices; throws one line when the
// CUDA device is not there (a build without CUDA, no visible GPU, cuda:N
// beyond the visible ones).
Device resolve_training_device(const std::string& name, int local_rank);

// What `PROGRAM --version` prints: "PROGRAM 0.6.0", loom::build_summary()
// (commit, CUDA, cuDNN, NCCL, CPU libraries), then what this machine runs:
// the f32 GEMM kernel chosen at run time and the visible CUDA devices.
std::string version_text(const std::string& program);

}  // namespace loom::apps

#include <functional>
#include <string>

#include <CLI/CLI.hpp>

namespace loom::apps {

// Flag validators whose messages a user can act on, e.g.
// "--epochs: must be a number >= 0, got '-1'".
// A number that `accepts` takes; else "must be <requirement>, got '<text>'".
// `description` is what --help shows.
CLI::Validator number_where(std::function<bool(double)> accepts, const std::string& requirement,
                            const std::string& description);
CLI::Validator at_least(double minimum);
// The same for whole numbers.
CLI::Validator whole_at_least(long long minimum);

// An option taking one of `choices`, which --help lists with the default.
CLI::Option* add_choice(CLI::App& app, const std::string& name, std::string& value, const std::string& help,
                        const std::vector<std::string>& choices);

// A whole-number option of at least `minimum` (whole_at_least), its default shown in --help.
template <class Integer>
CLI::Option* add_count(CLI::App& app, const std::string& name, Integer& value, const std::string& help,
                       long long minimum) {
  return app.add_option(name, value, help)->capture_default_str()->check(whole_at_least(minimum));
}

// A number option of at least `minimum` (at_least), its default shown in --help.
inline CLI::Option* add_number(CLI::App& app, const std::string& name, double& value, const std::string& help,
                               double minimum) {
  return app.add_option(name, value, help)->capture_default_str()->check(at_least(minimum));
}

// Adds --version (version_text); CLI11 reports it as CLI::CallForVersion, a
// CLI::Success, which app.exit() prints to stdout with exit status 0.
void add_version_flag(CLI::App& app, const std::string& program);

// Options as Python's argparse takes them: a repeated option keeps its last
// value (so a wrapper script can pass defaults that its user overrides).
// Call before adding options.
void argparse_option_rules(CLI::App& app);

// The command line with argparse-style one-dash long options (the
// tutorial's "-nr K", "-nr=K") written as CLI11 takes them ("--nr K"), up to "--".
std::vector<std::string> one_dash_long_options(int argc, char** argv, const std::vector<std::string>& names);

// Reports a fatal error the way every app does: "PROGRAM: rank N: MESSAGE" on
// stderr (the rank when several run) and, under torchrun, in the error file
// its summary shows (TORCHELASTIC_ERROR_FILE). Returns the exit code, 1.
int report_fatal_error(const char* program, const std::exception& error);

// A bad command line: "PROGRAM: MESSAGE" on stderr and in torchrun's error
// file. Returns the exit code, 2.
int report_usage_error(const char* program, const std::exception& error);

}  // namespace loom::apps

namespace loom::apps {

// The checkpoint and resume flags both apps take.
struct CheckpointFlags {
  std::string dir = "./checkpoint";  // '' = write no checkpoints
  int64_t every = 0;                 // steps between step checkpoints; 0 = epoch ends only
  int64_t keep = 3;                  // step checkpoints kept (older ones removed); 0 = all
  std::string resume;                // auto, none or a file; '' = auto after a restart, else none
  std::string on_error = "stop";     // a failed write: stop the run, or continue without it
  std::string signal = "USR1";       // stops with a checkpoint, besides SIGTERM and SIGINT; "none"
};

// Adds --checkpoint-dir, --checkpoint-every, --keep-checkpoints, --resume,
// -c/--checkpoint (= --resume PATH), --on-checkpoint-error and --checkpoint-signal.
void add_checkpoint_flags(CLI::App& app, CheckpointFlags& flags);

// The checkpoint options the flags give (train/checkpoints.h).
train::CheckpointOptions checkpoint_options(const CheckpointFlags& flags);

// --trace FILE: a Chrome trace of the run (ops, DDP buckets, data waits),
// for Perfetto (ui.perfetto.dev) or chrome://tracing.
void add_trace_flag(CLI::App& app, std::string& path);

}  // namespace loom::apps
