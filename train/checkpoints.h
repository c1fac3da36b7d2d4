// Checkpoints of a training run: where they go and how many are kept
// (CheckpointOptions), rank 0's writer, choosing the checkpoint to resume
// from (--resume auto semantics), and the training checkpoint itself: the
// model with everything an uninterrupted run would have after its step.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include <loom/core/options.h>
#include <loom/core/device.h>
#include <loom/data/loader.h>
#include <loom/dist/process_group.h>
#include <loom/nn/checkpoint.h>
#include <loom/nn/module.h>
#include <loom/optim/amp.h>
#include <loom/optim/lr_scheduler.h>

namespace loom::train {

// What a failed checkpoint write does to the run.
enum class CheckpointErrorPolicy {
  stop,      // the write's error ends the run (the previous checkpoint is intact)
  continue_  // a warning, and training goes on without that checkpoint
};
// "stop" or "continue"; anything else throws naming the value.
CheckpointErrorPolicy parse_checkpoint_error_policy(const std::string& text);

class CheckpointOptions {
  // Directory rank 0 writes checkpoints into, created when missing; '' writes none.
  LOOM_OPTION(std::string, directory) = "./checkpoint";
  // Steps between step checkpoints; 0 writes checkpoints at epoch ends only.
  LOOM_OPTION(int64_t, every_steps) = 0;
  // Step checkpoints kept, the newest (epoch checkpoints are all kept); 0 keeps all.
  LOOM_OPTION(int64_t, keep) = 3;
  // "auto" (the newest valid checkpoint in directory()), "none", or a
  // checkpoint file; '' is auto after a launcher's restart (of any rank's), else none.
  LOOM_OPTION(std::string, resume);
  // What a failed write does.
  LOOM_OPTION(CheckpointErrorPolicy, on_error) = CheckpointErrorPolicy::stop;
};

// How many times a launcher has restarted this job: TORCHELASTIC_RESTART_COUNT
// (torchrun, loomrun) or SLURM_RESTART_COUNT (a requeued SLURM job); 0 when
// neither is set. A value that is not a whole number is an error naming it.
int launcher_restart_count();

// resume() as given, or '' resolved: "auto" after a launcher's restart, else "none".
std::string effective_resume(const CheckpointOptions& options);

// Whether the launcher restarted any rank's job (launcher_restart_count() > 0
// on some rank; collective over `group`, which may be null). A node that
// joins a torchrun elastic job gets TORCHELASTIC_RESTART_COUNT 0 from its own
// agent while the running nodes' count their restarts.
bool any_rank_restarted(dist::ProcessGroup* group);

// "{world}GPU_{epoch}epoch.checkpoint" (the tutorial's) and "{world}GPU_step{step}.checkpoint".
std::string epoch_checkpoint_name(int world, int64_t epoch);
std::string step_checkpoint_name(int world, int64_t step);

struct ResumePoint {
  std::filesystem::path path;
  nn::Checkpoint checkpoint;
};

// The checkpoint to resume from: none for resume "none" (or auto with no
// checkpoint in the directory), the file resume() names (an error if it
// cannot be read), or for auto the valid checkpoint that got furthest (epoch,
// then the epoch's samples consumed, then steps: CheckpointProgress) among
// directory/{N}GPU_*.checkpoint of every world size N. A further one that is
// truncated or corrupt is reported on `log` with the reason and skipped; one
// of a newer format version is an error. `log` is null on ranks that print nothing.
std::optional<ResumePoint> find_resume_point(const CheckpointOptions& options, Device device, std::FILE* log);

// Every rank must resume from the same step: an all-reduce of the step each
// loaded (-1 for none); throws when they differ. Without a group, nothing.
void check_same_resume_step(dist::ProcessGroup* group, int64_t step);

// Tells a launcher that restarted this job where it resumed: writes `line` to
// the file LOOM_RESUME_REPORT names (loomrun sets it); nothing when unset.
void report_resume_to_launcher(const std::string& line);

enum class CheckpointKind { step, epoch };

// Whether checkpoints are written at all (a directory is set), and whether a
// step checkpoint is due after `step` steps in all: what every rank decides
// alike (rank 0's CheckpointWriter asks the same).
bool checkpoints_enabled(const CheckpointOptions& options);
bool step_checkpoint_due(const CheckpointOptions& options, int64_t step);

// Rank 0's checkpoint writer: directory/{world}GPU_step{N}.checkpoint every
// every_steps() steps (keeping the newest keep() of them) and
// directory/{world}GPU_{E}epoch.checkpoint at epoch ends (all kept). Creates
// the directory and removes temporary files a killed writer left there.
class CheckpointWriter {
 public:
  CheckpointWriter(const CheckpointOptions& options, int world);
  bool enabled() const { return checkpoints_enabled(options_); }
  // Whether a step checkpoint is due after `step` steps in all.
  bool step_due(int64_t step) const { return step_checkpoint_due(options_, step); }
  // The file a checkpoint of `kind` numbered `number` goes to.
  std::filesystem::path path(CheckpointKind kind, int64_t number) const;
  // Writes the checkpoint and prints "Saved PATH". On a failed write: with
  // CheckpointErrorPolicy::stop, throws (the message names the file and the
  // cause; the previous checkpoint is intact); with continue_, prints the
  // error and returns nullopt.
  std::optional<std::filesystem::path> write(CheckpointKind kind, int64_t number, const nn::Checkpoint& checkpoint);

 private:
  void rotate();
  CheckpointOptions options_;
  int world_;
};

// Where a run stands: `step` optimizer steps in all, and `epoch_step` batches
// of epoch `epoch` (0-based) done (as many as its steps unless gradients
// accumulate: TrainerOptions::accumulate_steps).
struct TrainingPosition {
  int64_t epoch = 0;
  int64_t epoch_step = 0;
  int64_t step = 0;
  // The epoch's samples consumed by all ranks (train/resume.h); a version-1
  // checkpoint's position has none.
  std::optional<int64_t> epoch_samples;
  std::optional<int64_t> world_size;  // the processes that got there; none in a version-1 checkpoint
};

// Rank 0's checkpoint at `position` of a run of `world` processes: the model,
// the optimizer (and the masters and loss scale of mixed precision), the
// schedule (null for none), the sampler's epoch, the global batch, the default
// generator and the run's `settings`.
nn::Checkpoint training_checkpoint(nn::Module& model, amp::MixedPrecisionOptimizer& optimizer,
                                   const optim::LRScheduler* scheduler, data::DataLoader& loader, int world,
                                   TrainingPosition position, nn::Metadata settings);

// Resumes as options.resume() says (find_resume_point): loads the model and
// everything an uninterrupted run would have had after the checkpoint's step
// (optimizer, mixed-precision state, schedule, generator) and returns where to
// go on from; nullopt to start from the beginning. Rank 0 (`leader`) prints
// "note: the checkpoint was written with KEY OLD; this run uses NEW" for each
// of `settings` that differs, then resume_line() (train/resume.h), a note
// when the global batch changed (`global_batch_size` is this run's), and
// tells the launcher. Then checks, collectively over `group` (may be null),
// that every rank resumed from the same step.
std::optional<TrainingPosition> resume_training(const CheckpointOptions& options, int world,
                                                int64_t global_batch_size, Device device,
                                                bool leader, dist::ProcessGroup* group, nn::Module& model,
                                                amp::MixedPrecisionOptimizer& optimizer,
                                                optim::LRScheduler* scheduler, const nn::Metadata& settings);

}  // namespace loom::train
