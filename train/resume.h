// Elastic resume: a checkpoint written by N processes continues on M (any
// M >= 1). Which checkpoint is the newest among every world size's, how an
// epoch starts again from the samples it had consumed, and the line a resume
// prints.
//
// What carries over at N != M: the model, the optimizer state, the masters and
// loss scale of mixed precision, the schedule and warm-up (they count steps
// and epochs), the default generator (rank 0's state; every rank of the new
// world takes it, as every rank does at N == M), and the data order: the
// checkpoint records the epoch's samples consumed by all ranks together, a
// prefix of DistributedSampler's global list, and the new world splits the
// rest of that list (DistributedSampler::set_start). Augmentation depends on
// (seed, epoch, dataset index) only, so it does not change with M either.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include <loom/data/loader.h>
#include <loom/nn/checkpoint.h>

namespace loom::train {

struct TrainingPosition;

// How far a checkpoint got, for --resume auto's choice among checkpoints of
// every world size: epochs done, then the epoch's samples consumed, then steps.
struct CheckpointProgress {
  int64_t epoch = 0;
  int64_t epoch_samples = -1;  // -1: a version-1 checkpoint, which does not record it
  int64_t step = 0;
  auto operator<=>(const CheckpointProgress&) const = default;
};

// The progress a checkpoint's header records (read without its data), or
// nullopt with the reason in `problem` when it holds no training state or its
// header is unreadable. A format version newer than this loom's throws.
std::optional<CheckpointProgress> recorded_progress(const std::filesystem::path& path, std::string& problem);

// Whether `name` is a checkpoint file name the Trainer writes, of any world
// size: "{world}GPU_step{S}.checkpoint" or "{world}GPU_{E}epoch.checkpoint".
bool is_checkpoint_name(const std::string& name);

// "Resuming from PATH (written by N processes) at epoch E, sample S, on M
// processes, batch B (step T)"; a version-1 checkpoint, which records neither
// the world nor the samples, gives "Resuming from PATH at epoch E, batch B (step T)".
std::string resume_line(const std::filesystem::path& path, const nn::TrainingState& state, int world);

// A note when the global batch changed with the world size (train_mnist's
// batch is per process), else ''.
std::string global_batch_note(const nn::TrainingState& state, int world, int64_t global_batch_size);

// One epoch's start: sets the loader's sampler where the epoch continues and
// starts the loader. `resumed` is the checkpoint's position when the run
// resumes inside this epoch, else null. With a DistributedSampler and a
// checkpoint that records the epoch's samples consumed, the rest of the epoch
// is split among this world's ranks; otherwise (another sampler, a version-1
// checkpoint) the loader skips the batches done, which needs the checkpoint's
// world size, and any other is an error saying so.
class EpochStart {
 public:
  EpochStart(data::DataLoader& loader, int64_t epoch, const TrainingPosition* resumed, int world,
             int64_t max_steps_per_epoch);
  // Steps of this epoch done before the run started (the checkpoint's).
  int64_t first_step() const { return first_step_; }
  // Steps of this epoch in all, first_step() included.
  int64_t steps() const { return steps_; }
  // The epoch's samples consumed by all ranks after `epoch_step` of its steps.
  int64_t samples_after(int64_t epoch_step) const;

 private:
  data::DataLoader& loader_;
  data::DistributedSampler* sampler_;  // null for another sampler
  int world_;
  int64_t first_step_ = 0, steps_ = 0;
  int64_t sampler_first_step_ = 0;  // the epoch step at which the sampler's list starts
};

}  // namespace loom::train
