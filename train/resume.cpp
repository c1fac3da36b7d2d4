// Elastic resume: the newest checkpoint of any world size, an epoch's start
// after the samples it had consumed, and the resume line.
#include <loom/train/resume.h>

#include <algorithm>
#include <cctype>

#include <loom/core/error.h>
#include <loom/train/checkpoints.h>

namespace loom::train {

namespace fs = std::filesystem;

namespace {

std::optional<int64_t> metadata_int(const nn::Metadata& metadata, const char* field) {
  auto it = metadata.find(std::string(nn::kTrainingPrefix) + field);
  if (it == metadata.end()) return std::nullopt;
  return std::stoll(it->second);
}

bool all_digits(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); });
}

}  // namespace

std::optional<CheckpointProgress> recorded_progress(const fs::path& path, std::string& problem) {
  nn::Metadata metadata;
  try {
    metadata = nn::read_safetensors_metadata(path);
  } catch (const std::exception& e) {
    problem = e.what();
    return std::nullopt;
  }
  nn::check_checkpoint_version(metadata, path);  // a newer loom's checkpoint stops the run: never silently older
  try {
    const std::optional<int64_t> step = metadata_int(metadata, "step");
    if (!step) {
      problem = "it holds no training state";
      return std::nullopt;
    }
    if (*step < 0) {
      problem = str("it records step ", *step, ", a negative step");
      return std::nullopt;
    }
    return CheckpointProgress{metadata_int(metadata, "epoch").value_or(0),
                              metadata_int(metadata, "epoch_samples").value_or(-1), *step};
  } catch (const std::exception& e) {
    problem = str("a training-state number is malformed (", e.what(), ")");
    return std::nullopt;
  }
}

bool is_checkpoint_name(const std::string& name) {
  const size_t gpu = name.find("GPU_");
  const std::string suffix = ".checkpoint";
  if (gpu == std::string::npos || !all_digits(name.substr(0, gpu)) || !name.ends_with(suffix)) return false;
  const std::string rest = name.substr(gpu + 4, name.size() - gpu - 4 - suffix.size());  // "step{S}" or "{E}epoch"
  if (rest.starts_with("step")) return all_digits(rest.substr(4));
  return rest.ends_with("epoch") && all_digits(rest.substr(0, rest.size() - 5));
}

std::string resume_line(const fs::path& path, const nn::TrainingState& state, int world) {
  const std::string position = str("batch ", state.epoch_step, " (step ", state.step, ")");
  if (!state.world_size || !state.epoch_samples)
    return str("Resuming from ", path.string(), " at epoch ", state.epoch + 1, ", ", position);
  return str("Resuming from ", path.string(), " (written by ", *state.world_size,
             *state.world_size == 1 ? " process" : " processes", ") at epoch ", state.epoch + 1, ", sample ",
             *state.epoch_samples, ", on ", world, world == 1 ? " process" : " processes", ", ", position);
}

std::string global_batch_note(const nn::TrainingState& state, int world, int64_t global_batch_size) {
  if (!state.global_batch_size || *state.global_batch_size == global_batch_size) return "";
  return str("note: the global batch is now ", global_batch_size, " (", world, " x ", global_batch_size / world,
             " per process); the checkpoint's run had ", *state.global_batch_size, " over ",
             state.world_size.value_or(0), "; the learning rate is kept as given");
}

EpochStart::EpochStart(data::DataLoader& loader, int64_t epoch, const TrainingPosition* resumed, int world,
                       int64_t max_steps_per_epoch)
    : loader_(loader), sampler_(dynamic_cast<data::DistributedSampler*>(&loader.sampler())), world_(world) {
  const bool continue_list = resumed && sampler_ && resumed->epoch_samples;
  if (sampler_) {
    sampler_->set_epoch(epoch);
    sampler_->set_start(continue_list ? *resumed->epoch_samples : 0);
  }
  int64_t first_batch = 0;
  if (continue_list) {
    first_step_ = sampler_first_step_ = resumed->epoch_step;
    steps_ = first_step_ + loader.num_batches();
  } else {
    if (resumed) {
      LOOM_CHECK(!resumed->world_size || *resumed->world_size == world, "the checkpoint was written by ",
                 *resumed->world_size, " processes and this run has ", world,
                 ": only a DistributedSampler's epoch can be split among another number of processes");
      first_step_ = first_batch = resumed->epoch_step;
    }
    steps_ = loader.num_batches();
  }
  if (max_steps_per_epoch > 0) steps_ = std::min(steps_, max_steps_per_epoch);
  first_step_ = std::min(first_step_, steps_);
  loader.start_epoch(epoch, std::min(first_batch, steps_));
}

int64_t EpochStart::samples_after(int64_t epoch_step) const {
  const int64_t taken = (epoch_step - sampler_first_step_) * loader_.options().batch_size();
  if (sampler_) return sampler_->consumed_after(taken);
  return std::min(taken, loader_.sampler().size()) * world_;
}

}  // namespace loom::train
