#include <loom/train/checkpoints.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include <loom/core/error.h>
#include <loom/core/generator.h>
#include <loom/train/resume.h>

namespace loom::train {

namespace fs = std::filesystem;

CheckpointErrorPolicy parse_checkpoint_error_policy(const std::string& text) {
  if (text == "stop") return CheckpointErrorPolicy::stop;
  if (text == "continue") return CheckpointErrorPolicy::continue_;
  LOOM_FAIL("'", text, "' is not a checkpoint error policy: use stop or continue");
}

int launcher_restart_count() {
  int count = 0;
  for (const char* name : {"TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"}) {
    const char* text = std::getenv(name);
    if (text == nullptr || *text == '\0') continue;
    char* end = nullptr;
    const long value = std::strtol(text, &end, 10);
    LOOM_CHECK(*end == '\0' && value >= 0, name, "='", text, "' is not a whole number >= 0");
    count = std::max(count, static_cast<int>(value));
  }
  return count;
}

std::string effective_resume(const CheckpointOptions& options) {
  if (!options.resume().empty()) return options.resume();
  return launcher_restart_count() > 0 ? "auto" : "none";
}

std::string epoch_checkpoint_name(int world, int64_t epoch) { return str(world, "GPU_", epoch, "epoch.checkpoint"); }
std::string step_checkpoint_name(int world, int64_t step) { return str(world, "GPU_step", step, ".checkpoint"); }

namespace {

// A checkpoint whose position lies beyond its own recorded schedule (the
// "epochs" setting the apps store) is corrupt: refused naming the file.
nn::Checkpoint checked_checkpoint(const fs::path& path, Device device) {
  nn::Checkpoint checkpoint = nn::load_checkpoint(path, device);
  if (!checkpoint.training) return checkpoint;
  const nn::TrainingState& state = *checkpoint.training;
  auto epochs = state.extra_metadata.find("epochs");
  if (epochs == state.extra_metadata.end()) return checkpoint;
  int64_t scheduled = -1;
  try {
    scheduled = std::stoll(epochs->second);
  } catch (const std::exception&) {
  }
  LOOM_CHECK(scheduled >= 0, "checkpoint ", path.string(), ": its recorded setting epochs '", epochs->second,
             "' is not a whole number >= 0; the file is corrupt");
  LOOM_CHECK(state.epoch <= scheduled && (state.epoch < scheduled || state.epoch_step == 0), "checkpoint ",
             path.string(), ": it records epoch ", state.epoch, " (batch ", state.epoch_step,
             "), beyond its own schedule of ", scheduled, " epochs; the file is corrupt");
  return checkpoint;
}

}  // namespace

std::optional<ResumePoint> find_resume_point(const CheckpointOptions& options, Device device, std::FILE* log) {
  const std::string resume = effective_resume(options);
  if (resume == "none") return std::nullopt;
  if (resume != "auto") {
    return ResumePoint{resume, checked_checkpoint(resume, device)};
  }
  LOOM_CHECK(!options.directory().empty(), "--resume auto looks in the checkpoint directory (--checkpoint-dir), which is ''");
  struct Candidate {
    fs::path path;
    CheckpointProgress progress;
    fs::file_time_type written;
  };
  std::vector<Candidate> candidates;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(options.directory(), ec)) {
    if (!is_checkpoint_name(entry.path().filename().string()) || !entry.is_regular_file(ec)) continue;
    std::string problem;
    const std::optional<CheckpointProgress> progress = recorded_progress(entry.path(), problem);
    if (!progress) {
      if (log) std::fprintf(log, "Skipping checkpoint %s, it is unusable: %s\n", entry.path().c_str(), problem.c_str());
      continue;
    }
    candidates.push_back({entry.path(), *progress, entry.last_write_time(ec)});
  }
  // Furthest first, whatever world size wrote it; of equal progress the later written.
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.progress != b.progress ? a.progress > b.progress : a.written > b.written;
  });
  for (size_t i = 0; i < candidates.size(); ++i) {
    try {
      nn::Checkpoint checkpoint = checked_checkpoint(candidates[i].path, device);
      if (log) {
        std::fprintf(log, "--resume auto: %s is the newest valid checkpoint in %s\n", candidates[i].path.c_str(),
                     options.directory().c_str());
      }
      return ResumePoint{candidates[i].path, std::move(checkpoint)};
    } catch (const std::exception& e) {
      if (log) {
        std::fprintf(log, "Skipping checkpoint %s, it is truncated or corrupt: %s%s\n", candidates[i].path.c_str(),
                     e.what(), i + 1 < candidates.size() ? "; trying the previous one" : "");
      }
    }
  }
  if (log) {
    std::fprintf(log, "--resume auto: no valid *GPU_*.checkpoint in %s; starting from the beginning\n",
                 options.directory().c_str());
  }
  return std::nullopt;
}

void check_same_resume_step(dist::ProcessGroup* group, int64_t step) {
  if (group == nullptr) return;
  // max(step) and max(-step): equal on every rank exactly when all loaded the same step.
  const std::vector<int64_t> agreed = dist::all_reduce_values(*group, {step, -step}, dist::ReduceOp::max);
  LOOM_CHECK(agreed[0] == -agreed[1], "the ranks resume from different steps (between ", -agreed[1], " and ",
             agreed[0], "; -1 is none): every rank must see the same checkpoint directory");
}

bool any_rank_restarted(dist::ProcessGroup* group) {
  int64_t restarts = launcher_restart_count();
  if (group == nullptr) return restarts > 0;
  return dist::all_reduce_values(*group, {restarts}, dist::ReduceOp::max)[0] > 0;
}

void report_resume_to_launcher(const std::string& line) {
  const char* path = std::getenv("LOOM_RESUME_REPORT");
  if (path == nullptr || *path == '\0') return;
  std::FILE* file = std::fopen(path, "w");
  if (file == nullptr) return;  // the launcher's report is a courtesy; training goes on
  std::fprintf(file, "%s\n", line.c_str());
  std::fclose(file);
}

bool checkpoints_enabled(const CheckpointOptions& options) { return !options.directory().empty(); }

bool step_checkpoint_due(const CheckpointOptions& options, int64_t step) {
  return checkpoints_enabled(options) && options.every_steps() > 0 && step % options.every_steps() == 0;
}

CheckpointWriter::CheckpointWriter(const CheckpointOptions& options, int world) : options_(options), world_(world) {
  if (!enabled()) return;
  std::error_code ec;
  fs::create_directories(options_.directory(), ec);
  LOOM_CHECK(!ec, "checkpoint directory (--checkpoint-dir) ", options_.directory(), ": cannot create it: ", ec.message());
  for (const fs::path& removed : nn::remove_stale_temporaries(options_.directory()))
    std::printf("Removed %s, left by a checkpoint write that was interrupted\n", removed.c_str());
}

fs::path CheckpointWriter::path(CheckpointKind kind, int64_t number) const {
  return fs::path(options_.directory()) /
         (kind == CheckpointKind::step ? step_checkpoint_name(world_, number) : epoch_checkpoint_name(world_, number));
}

std::optional<fs::path> CheckpointWriter::write(CheckpointKind kind, int64_t number, const nn::Checkpoint& checkpoint) {
  const fs::path path = this->path(kind, number);
  try {
    nn::save_checkpoint(path, checkpoint);
  } catch (const std::exception& e) {
    if (options_.on_error() == CheckpointErrorPolicy::stop) throw;
    std::fprintf(stderr, "warning: %s; training continues without this checkpoint (--on-checkpoint-error continue)\n",
                 e.what());
    std::fflush(stderr);
    return std::nullopt;
  }
  std::printf("Saved %s\n", path.c_str());
  std::fflush(stdout);
  if (kind == CheckpointKind::step) rotate();
  return path;
}

void CheckpointWriter::rotate() {
  if (options_.keep() <= 0) return;
  const std::string prefix = str(world_, "GPU_step");
  std::vector<std::pair<int64_t, fs::path>> steps;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(options_.directory(), ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix) || !name.ends_with(".checkpoint")) continue;
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - 11);
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    steps.emplace_back(std::stoll(digits), entry.path());
  }
  std::sort(steps.begin(), steps.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (size_t i = static_cast<size_t>(options_.keep()); i < steps.size(); ++i) fs::remove(steps[i].second, ec);
}

nn::Checkpoint training_checkpoint(nn::Module& model, amp::MixedPrecisionOptimizer& optimizer,
                                   const optim::LRScheduler* scheduler, data::DataLoader& loader, int world,
                                   TrainingPosition position, nn::Metadata settings) {
  nn::TrainingState state;
  state.epoch = position.epoch;
  state.epoch_step = position.epoch_step;
  state.step = position.step;
  state.epoch_samples = position.epoch_samples;
  state.world_size = world;
  state.global_batch_size = loader.options().batch_size() * world;
  if (scheduler) state.scheduler_last_epoch = scheduler->last_epoch();
  state.sampler_epoch = loader.sampler().epoch();
  state.generators["default"] = {default_generator().seed(), default_generator().counter()};
  state.extra_metadata = std::move(settings);
  optimizer.save_state(state);  // optimizer state, f32 masters, loss scale
  return nn::Checkpoint{model.state_dict(), std::move(state)};
}

std::optional<TrainingPosition> resume_training(const CheckpointOptions& options, int world,
                                                int64_t global_batch_size, Device device, bool leader,
                                                dist::ProcessGroup* group, nn::Module& model,
                                                amp::MixedPrecisionOptimizer& optimizer,
                                                optim::LRScheduler* scheduler, const nn::Metadata& settings) {
  // '' means auto after a launcher's restart of any rank: torchrun's elastic
  // agents count their own restarts, so a node that joins a running job
  // starts its workers with TORCHELASTIC_RESTART_COUNT 0 while the others'
  // are higher, and every rank must take the same decision.
  CheckpointOptions agreed = options;
  if (options.resume().empty() && any_rank_restarted(group)) agreed.resume("auto");
  std::optional<ResumePoint> resume = find_resume_point(agreed, device, leader ? stdout : nullptr);
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
      *position = {state.epoch, state.epoch_step, state.step, state.epoch_samples, state.world_size};
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
      static const nn::TrainingState kNone;  // a plain state_dict file
      const nn::TrainingState& state = checkpoint.training ? *checkpoint.training : kNone;
      std::printf("%s\n", resume_line(resume->path, state, world).c_str());
      if (const std::string note = global_batch_note(state, world, global_batch_size); !note.empty())
        std::printf("%s\n", note.c_str());
      report_resume_to_launcher(str("step ", position->step, " (epoch ", position->epoch + 1, ", batch ",
                                    position->epoch_step, ") from ", resume->path.string()));
    }
  }
  check_same_resume_step(group, position ? position->step : -1);
  return position;
}

}  // namespace loom::train
