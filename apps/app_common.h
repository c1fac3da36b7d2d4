// What the apps share: flag errors as one line, durations printed like
// Python's timedelta, thread setup, the training device of a rank, --version,
// and the checkpoint, resume and preemption machinery (checkpoint flags, choosing the
// checkpoint to resume from, writing and rotating checkpoints, stopping every
// rank at the same step on SIGTERM / SIGUSR1 / SIGINT).
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
#include <loom/nn/checkpoint.h>

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

// "0:00:12.345678", as the tutorials print datetime.now() - start.
std::string format_duration(std::chrono::steady_clock::duration elapsed);

// Peak resident set size of this process in bytes (VmHWM), 0 if unknown.
long peak_rss_bytes();

// What `PROGRAM --version` prints: "PROGRAM 0.6.0", loom::build_summary()
// (commit, CUDA, cuDNN, NCCL, CPU libraries), then what this machine runs:
// the f32 GEMM kernel chosen at run time and the visible CUDA devices.
std::string version_text(const std::string& program);

}  // namespace loom::apps

#include <CLI/CLI.hpp>

namespace loom::apps {

// Flag validators whose messages a user can act on, e.g.
// "--epochs: must be a number >= 0, got '-1'".
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

// Adds --version (version_text); CLI11 reports it as CLI::CallForVersion, a
// CLI::Success, which app.exit() prints to stdout with exit status 0.
void add_version_flag(CLI::App& app, const std::string& program);

// Options as Python's argparse takes them: a repeated option keeps its last
// value (so a wrapper script can pass defaults that its user overrides).
// Call before adding options.
void argparse_option_rules(CLI::App& app);

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

// How many times a launcher has restarted this job: TORCHELASTIC_RESTART_COUNT
// (torchrun, loomrun) or SLURM_RESTART_COUNT (a requeued SLURM job); 0 when
// neither is set. A value that is not a whole number is an error naming it.
int launcher_restart_count();

// --resume as given, or '' resolved: "auto" after a launcher's restart, else "none".
std::string effective_resume(const CheckpointFlags& flags);

// "{world}GPU_{epoch}epoch.checkpoint" (the tutorial's) and "{world}GPU_step{step}.checkpoint".
std::string epoch_checkpoint_name(int world, int64_t epoch);
std::string step_checkpoint_name(int world, int64_t step);

struct ResumePoint {
  std::filesystem::path path;
  nn::Checkpoint checkpoint;
};

// The checkpoint to resume from: none for --resume none (or auto with no
// checkpoint of this world size in the directory), the file --resume PATH
// names (an error if it cannot be read), or for auto the valid checkpoint with
// the most steps among dir/{world}GPU_*.checkpoint. A newer one that is
// truncated or corrupt is reported on `log` with the reason and skipped.
// `log` is null on ranks that print nothing.
std::optional<ResumePoint> find_resume_point(const CheckpointFlags& flags, int world, Device device, std::FILE* log);

// Every rank must resume from the same step: an all-reduce of the step each
// loaded (-1 for none); throws when they differ. Without a group, nothing.
void check_same_resume_step(dist::ProcessGroup* group, int64_t step);

// Tells a launcher that restarted this job where it resumed: writes `line` to
// the file LOOM_RESUME_REPORT names (loomrun sets it); nothing when unset.
void report_resume_to_launcher(const std::string& line);

enum class CheckpointKind { step, epoch };

// Rank 0's checkpoint writer: dir/{world}GPU_step{N}.checkpoint every
// --checkpoint-every steps (keeping the newest --keep-checkpoints of them) and
// dir/{world}GPU_{E}epoch.checkpoint at epoch ends (all kept). Creates the
// directory and removes temporary files a killed writer left there.
class CheckpointWriter {
 public:
  CheckpointWriter(const CheckpointFlags& flags, int world);
  bool enabled() const { return !flags_.dir.empty(); }
  // Whether a step checkpoint is due after `step` steps in all.
  bool step_due(int64_t step) const { return enabled() && flags_.every > 0 && step % flags_.every == 0; }
  // Writes the checkpoint and prints "Saved PATH". On a failed write: with
  // --on-checkpoint-error stop, throws (the message names the file and the
  // cause; the previous checkpoint is intact); with continue, prints the error
  // and returns nullopt.
  std::optional<std::filesystem::path> write(CheckpointKind kind, int64_t number, const nn::Checkpoint& checkpoint);

 private:
  void rotate();
  CheckpointFlags flags_;
  int world_;
};

// Stop requests by signal. install() makes SIGTERM, SIGINT and `extra` (e.g.
// SIGUSR1; 0 for none) set a flag instead of ending the process; SIGINT does
// so once (a second Ctrl-C ends the process at once). SIGXFSZ is ignored, so
// a file size limit turns into a write error instead of a kill.
class StopSignals {
 public:
  static void install(int extra);
  // The first stop signal received, 0 for none.
  static int received();
};

// The line when every rank stopped for `signal` after `step` steps. Rank 0,
// on stdout and stderr: "Preempted by SIGTERM after step 137: checkpoint
// ./checkpoint/2GPU_step137.checkpoint written; resume with --resume auto
// (exit code 143)"; the others on stderr: "rank 1: stopped by SIGTERM after step 137".
void print_preempted(int rank, int signal, int64_t step, const std::optional<std::filesystem::path>& checkpoint);

// Parses --checkpoint-signal: USR1, SIGUSR1, USR2, TERM, HUP, ... -> number; none -> 0.
int parse_signal_name(const std::string& name);

// Makes every rank stop after the same step: poll() after each step shares
// each rank's flag through an all-reduce (max) issued at that step and read at
// the next one, so its latency hides behind a step. Every rank must call
// poll() equally often.
class StopAgreement {
 public:
  explicit StopAgreement(std::shared_ptr<dist::ProcessGroup> group);
  // The signal every rank agrees to stop for now, or 0 to continue.
  int poll();
  // Waits for the outstanding all-reduce (before other collectives).
  void finish();

 private:
  std::shared_ptr<dist::ProcessGroup> group_;
  Tensor flag_;
  std::shared_ptr<dist::Work> pending_;
};

// --trace FILE: a Chrome trace of the run (ops, DDP buckets, data waits),
// for Perfetto (ui.perfetto.dev) or chrome://tracing.
void add_trace_flag(CLI::App& app, std::string& path);

// The file rank `rank` of `world` writes for --trace PATH: PATH itself in a
// world of one, else PATH with ".rank<k>" before its extension.
std::string trace_path_for_rank(const std::string& path, int rank, int world);

// Keeps a trace while it lives (when `path` is not empty); finish() writes it.
class TraceRecording {
 public:
  TraceRecording(const std::string& path, int rank, int world);
  ~TraceRecording();
  TraceRecording(const TraceRecording&) = delete;
  TraceRecording& operator=(const TraceRecording&) = delete;
  // Writes the file and names it on `log` (may be null); throws loom::Error
  // naming the file when it cannot be written.
  void finish(std::FILE* log);

 private:
  std::string path_;  // this rank's file; empty: no trace
};

}  // namespace loom::apps
