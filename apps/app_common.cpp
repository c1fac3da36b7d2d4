#include "apps/app_common.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <loom/core/cuda/runtime.h>
#include <loom/core/error.h>
#include <loom/core/profiler.h>
#include <loom/core/version.h>
#include <loom/dist/environment.h>
#include <loom/dist/launcher.h>
#include <loom/ops/cpu/gemm.h>

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

std::string format_duration(std::chrono::steady_clock::duration elapsed) {
  const long long micros = std::chrono::duration_cast<std::chrono::microseconds>(elapsed).count();
  const long long seconds = micros / 1000000;
  char text[64];
  std::snprintf(text, sizeof(text), "%lld:%02lld:%02lld.%06lld", seconds / 3600, (seconds / 60) % 60, seconds % 60,
                micros % 1000000);
  return text;
}

long peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      long kilobytes = 0;
      fields >> kilobytes;
      return kilobytes * 1024;
    }
  }
  return 0;
}

std::string version_text(const std::string& program) {
  const int devices = cuda::device_count();
  return program + " " + version() + "\n" + build_summary() + "this machine: f32 GEMM kernel " +
         ops::cpu::gemm_kernel_name() + ", " + std::to_string(devices) + " CUDA device" + (devices == 1 ? "" : "s") +
         " visible\n";
}

}  // namespace loom::apps

namespace loom::apps {

CLI::Validator at_least(double minimum) {
  return CLI::Validator(
      [minimum](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        if (text.empty() || end == nullptr || *end != '\0') return "'" + text + "' is not a number";
        if (value < minimum) {
          std::ostringstream out;
          out << "must be a number >= " << minimum << ", got '" << text << "'";
          return out.str();
        }
        return "";
      },
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
              parse_signal_name(text);
            } catch (const std::exception& e) {
              return e.what();
            }
            return "";
          },
          "SIGNAL"));
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

std::string effective_resume(const CheckpointFlags& flags) {
  if (!flags.resume.empty()) return flags.resume;
  return launcher_restart_count() > 0 ? "auto" : "none";
}

std::string epoch_checkpoint_name(int world, int64_t epoch) { return str(world, "GPU_", epoch, "epoch.checkpoint"); }
std::string step_checkpoint_name(int world, int64_t step) { return str(world, "GPU_step", step, ".checkpoint"); }

namespace {

// The step count a checkpoint file's header records, or nullopt with the reason.
std::optional<int64_t> recorded_step(const fs::path& path, std::string& problem) {
  try {
    const nn::Metadata metadata = nn::read_safetensors_metadata(path);
    auto it = metadata.find(std::string(nn::kTrainingPrefix) + "step");
    if (it == metadata.end()) {
      problem = "it holds no training state";
      return std::nullopt;
    }
    return std::stoll(it->second);
  } catch (const std::exception& e) {
    problem = e.what();
    return std::nullopt;
  }
}

}  // namespace

std::optional<ResumePoint> find_resume_point(const CheckpointFlags& flags, int world, Device device, std::FILE* log) {
  const std::string resume = effective_resume(flags);
  if (resume == "none") return std::nullopt;
  if (resume != "auto") {
    return ResumePoint{resume, nn::load_checkpoint(resume, device)};
  }
  LOOM_CHECK(!flags.dir.empty(), "--resume auto looks in --checkpoint-dir, which is ''");
  const std::string prefix = str(world, "GPU_");
  struct Candidate {
    fs::path path;
    int64_t step;
    fs::file_time_type written;
  };
  std::vector<Candidate> candidates;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(flags.dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix) || !name.ends_with(".checkpoint") || !entry.is_regular_file(ec)) continue;
    std::string problem;
    const std::optional<int64_t> step = recorded_step(entry.path(), problem);
    if (!step) {
      if (log) std::fprintf(log, "Skipping checkpoint %s, it is unusable: %s\n", entry.path().c_str(), problem.c_str());
      continue;
    }
    candidates.push_back({entry.path(), *step, entry.last_write_time(ec)});
  }
  // Most steps first; of equal steps the later written.
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.step != b.step ? a.step > b.step : a.written > b.written;
  });
  for (size_t i = 0; i < candidates.size(); ++i) {
    try {
      nn::Checkpoint checkpoint = nn::load_checkpoint(candidates[i].path, device);
      if (log) {
        std::fprintf(log, "--resume auto: %s is the newest valid checkpoint in %s\n", candidates[i].path.c_str(),
                     flags.dir.c_str());
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
    std::fprintf(log, "--resume auto: no valid %s*.checkpoint in %s; starting from the beginning\n", prefix.c_str(),
                 flags.dir.c_str());
  }
  return std::nullopt;
}

void check_same_resume_step(dist::ProcessGroup* group, int64_t step) {
  if (group == nullptr) return;
  // max(step) and max(-step): equal on every rank exactly when all loaded the same step.
  Tensor steps = Tensor::from_vector<int64_t>({step, -step}, {2}).to(group->device());
  group->all_reduce({steps}, dist::ReduceOp::max)->wait();
  const std::vector<int64_t> agreed = steps.to(Device::cpu()).to_vector<int64_t>();
  LOOM_CHECK(agreed[0] == -agreed[1], "the ranks resume from different steps (between ", -agreed[1], " and ",
             agreed[0], "; -1 is none): every rank must see the same checkpoint directory");
}

void report_resume_to_launcher(const std::string& line) {
  const char* path = std::getenv("LOOM_RESUME_REPORT");
  if (path == nullptr || *path == '\0') return;
  std::FILE* file = std::fopen(path, "w");
  if (file == nullptr) return;  // the launcher's report is a courtesy; training goes on
  std::fprintf(file, "%s\n", line.c_str());
  std::fclose(file);
}

CheckpointWriter::CheckpointWriter(const CheckpointFlags& flags, int world) : flags_(flags), world_(world) {
  if (!enabled()) return;
  std::error_code ec;
  fs::create_directories(flags_.dir, ec);
  LOOM_CHECK(!ec, "--checkpoint-dir ", flags_.dir, ": cannot create the directory: ", ec.message());
  for (const fs::path& removed : nn::remove_stale_temporaries(flags_.dir))
    std::printf("Removed %s, left by a checkpoint write that was interrupted\n", removed.c_str());
}

std::optional<fs::path> CheckpointWriter::write(CheckpointKind kind, int64_t number, const nn::Checkpoint& checkpoint) {
  const fs::path path = fs::path(flags_.dir) / (kind == CheckpointKind::step ? step_checkpoint_name(world_, number)
                                                                             : epoch_checkpoint_name(world_, number));
  try {
    nn::save_checkpoint(path, checkpoint);
  } catch (const std::exception& e) {
    if (flags_.on_error == "stop") throw;
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
  if (flags_.keep <= 0) return;
  const std::string prefix = str(world_, "GPU_step");
  std::vector<std::pair<int64_t, fs::path>> steps;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(flags_.dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix) || !name.ends_with(".checkpoint")) continue;
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - 11);
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    steps.emplace_back(std::stoll(digits), entry.path());
  }
  std::sort(steps.begin(), steps.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (size_t i = static_cast<size_t>(flags_.keep); i < steps.size(); ++i) fs::remove(steps[i].second, ec);
}

// ---- signals ----

namespace {

std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "a signal handler may only touch lock-free atomics");

// Only records the signal: the training loop acts on it between steps.
void record_stop_signal(int signal) {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, signal);
}

}  // namespace

int parse_signal_name(const std::string& name) {
  std::string upper;
  for (char c : name) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (upper.starts_with("SIG")) upper = upper.substr(3);
  if (upper == "NONE") return 0;
  static const std::pair<const char*, int> kSignals[] = {{"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"TERM", SIGTERM},
                                                         {"INT", SIGINT},   {"HUP", SIGHUP},   {"QUIT", SIGQUIT},
                                                         {"ALRM", SIGALRM}, {"XCPU", SIGXCPU}};
  for (auto& [signal_name, number] : kSignals)
    if (upper == signal_name) return number;
  LOOM_FAIL("'", name, "' is not a signal loom stops on: use USR1, USR2, TERM, HUP, QUIT, ALRM, XCPU or none");
}

void StopSignals::install(int extra) {
  struct sigaction action {};
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, &action, nullptr);
  if (extra != 0 && extra != SIGINT) ::sigaction(extra, &action, nullptr);
  // The second Ctrl-C finds the default action again and ends the process.
  action.sa_flags = SA_RESTART | SA_RESETHAND;
  ::sigaction(SIGINT, &action, nullptr);
  ::signal(SIGXFSZ, SIG_IGN);
}

void print_preempted(int rank, int signal, int64_t step, const std::optional<fs::path>& checkpoint) {
  if (rank != 0) {
    std::fprintf(stderr, "rank %d: stopped by %s after step %lld\n", rank, dist::signal_name(signal).c_str(),
                 static_cast<long long>(step));
    std::fflush(stderr);
    return;
  }
  const std::string saved = checkpoint ? str("checkpoint ", checkpoint->string(), " written; resume with --resume auto")
                                       : std::string("no checkpoint written");
  const std::string line = str("Preempted by ", dist::signal_name(signal), " after step ", step, ": ", saved,
                               " (exit code ", 128 + signal, ")");
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

int StopSignals::received() { return g_stop_signal.load(); }

StopAgreement::StopAgreement(std::shared_ptr<dist::ProcessGroup> group) : group_(std::move(group)) {
  if (group_) flag_ = Tensor::zeros({1}, DType::f32, group_->device());
}

int StopAgreement::poll() {
  if (!group_) return StopSignals::received();
  if (pending_) {
    pending_->wait();
    pending_.reset();
    const int agreed = static_cast<int>(flag_.item());
    if (agreed != 0) return agreed;
  }
  flag_.fill_(static_cast<double>(StopSignals::received()));
  pending_ = group_->all_reduce({flag_}, dist::ReduceOp::max);
  return 0;
}

void StopAgreement::finish() {
  if (pending_) pending_->wait();
  pending_.reset();
}

// ---- command lines and fatal errors ----

void argparse_option_rules(CLI::App& app) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
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

std::string trace_path_for_rank(const std::string& path, int rank, int world) {
  if (path.empty() || world <= 1) return path;
  const fs::path file(path);
  return (file.parent_path() / str(file.stem().string(), ".rank", rank, file.extension().string())).string();
}

TraceRecording::TraceRecording(const std::string& path, int rank, int world)
    : path_(trace_path_for_rank(path, rank, world)) {
  if (path_.empty()) return;
  // Fail now, not after training, when the file cannot be written.
  const bool existed = fs::exists(path_);
  {
    std::ofstream probe(path_, std::ios::app);
    LOOM_CHECK(probe.good(), "--trace ", path_, ": cannot write this file");
  }
  if (!existed) fs::remove(path_);
  profiler::set_process_name(world > 1 ? str("rank ", rank) : std::string("loom"));
  profiler::set_thread_name("main");
  profiler::start_tracing();
}

TraceRecording::~TraceRecording() {
  if (!path_.empty()) profiler::stop_tracing();
}

void TraceRecording::finish(std::FILE* log) {
  if (path_.empty()) return;
  profiler::stop_tracing();
  profiler::write_chrome_trace(path_);
  if (log != nullptr) std::fprintf(log, "Wrote the trace to %s (open it at https://ui.perfetto.dev)\n", path_.c_str());
}

}  // namespace loom::apps
