// What a training run shows and records about itself, from rank 0: the
// progress display (--progress), the metrics file (--metrics FILE, JSON Lines,
// schema in docs/metrics.md) and TensorBoard scalars (--tensorboard DIR).
// One record feeds both files, so they hold the same numbers.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <loom/train/progress.h>
#include <loom/core/device.h>
#include <loom/core/summary_writer.h>
#include <loom/core/tensor.h>
#include <loom/dist/ddp.h>
#include <loom/dist/metrics.h>
#include <loom/optim/grad_scaler.h>

namespace loom::train {

// "0:00:12.345678", as the tutorials print datetime.now() - start.
std::string format_duration(std::chrono::steady_clock::duration elapsed);

// Peak resident set size of this process in bytes (VmHWM), 0 if unknown.
long peak_rss_bytes();

// One metrics record: named fields in order. A double that is not finite is written as null.
using MetricValue = std::variant<std::nullptr_t, int64_t, double, std::string, std::vector<std::string>>;
using MetricRecord = std::vector<std::pair<std::string, MetricValue>>;

// The record as one line of JSON (no newline).
std::string to_json(const MetricRecord& record);

// What the header record says about the run.
struct RunDescription {
  std::string program;
  std::vector<std::string> command;  // argv
  int world_size = 1;
  std::string backend;  // the process group's, "none" for one process
  Device device;
  std::string amp;      // --amp
  std::string dtype;    // the input and (O2/O3/bf16) weight dtype
  int64_t global_batch_size = 0;
  int64_t epochs = 0;
  int64_t steps_per_epoch = 0;
  int64_t log_interval = 1;
};

// What one optimizer step brought, given to TrainingMonitor::step().
struct StepReport {
  int64_t epoch_step = 0;           // steps done in this epoch, this one included
  int64_t step = 0;                 // steps done in the run
  int64_t images = 0;               // this step's images, all ranks
  double data_wait_seconds = 0;     // the loader's wait for this step's batch
  const Tensor* loss = nullptr;     // read only when something is drawn or recorded
  double lr = 0;
  const dist::DistributedDataParallel* ddp = nullptr;  // its last iteration's timing; null for one process
  const optim::GradScaler* scaler = nullptr;
};

class TrainingMonitor {
 public:
  // `leader`: rank 0, the only one that draws and writes; the others only
  // keep the step count. Opens --metrics and --tensorboard (errors name the
  // flag and the file) and writes the header record.
  TrainingMonitor(bool leader, const std::string& progress, const std::string& metrics_path,
                  const std::string& tensorboard_dir, RunDescription run);
  ~TrainingMonitor();
  TrainingMonitor(const TrainingMonitor&) = delete;
  TrainingMonitor& operator=(const TrainingMonitor&) = delete;

  // With --metrics or --tensorboard every rank evaluates at each epoch's end
  // (collective: the flags are the same on every rank).
  bool records_epochs() const { return records_epochs_; }

  void start_epoch(int64_t epoch, int64_t first_step);
  // After every optimizer step, on every rank (cheap: reads the clock, sums a
  // few numbers; draws and writes only when due).
  void step(const StepReport& report);
  // Before the app prints a line of its own: clears the bar.
  void before_output();
  // The loss when the app read it anyway (its loss lines), so nothing reads it again.
  void set_loss(double loss);
  // The epoch's images over all ranks when the steps' count (each step's
  // images times the world) is not exact: with Join, ranks run different
  // numbers of batches. Before end_epoch().
  void set_epoch_images(int64_t images);
  // After the epoch's last step: clears the bar (lines: prints the epoch's
  // last line). The epoch stays open for end_epoch().
  void end_epoch_steps();
  // Ends the epoch begun last (nothing when none is open): end_epoch_steps(),
  // then the epoch record with the test accuracy when it was measured.
  void end_epoch(std::optional<dist::AccuracyCounts> accuracy);
  // Flushes the files; throws naming the file on a failed write.
  void finish();

 private:
  void write(const MetricRecord& record, const char* tensorboard_prefix);
  void add_memory(MetricRecord& record) const;
  double read_loss(const StepReport& report);

  bool leader_;
  RunDescription run_;
  std::unique_ptr<ProgressDisplay> progress_;
  std::FILE* metrics_ = nullptr;
  std::string metrics_path_;
  std::unique_ptr<SummaryWriter> tensorboard_;
  bool records_epochs_ = false;
  std::chrono::steady_clock::time_point run_start_, epoch_start_, interval_start_, last_step_end_;
  bool in_epoch_ = false, epoch_steps_ended_ = false;
  int64_t epoch_ = 0, step_ = 0, epoch_steps_ = 0;
  double loss_ = 0;
  bool loss_read_ = false;  // loss_ is this step's loss
  Tensor last_loss_;        // the last step's, for the epoch record
  bool last_loss_read_ = false;
  const optim::GradScaler* scaler_ = nullptr;
  // Sums since the last step record / since the epoch started.
  struct Sums {
    int64_t steps = 0, images = 0, timed_steps = 0;
    double data_wait = 0, step_seconds = 0, communication = 0, hidden = 0, exposed = 0;
  } interval_, epoch_sums_;
  double last_lr_ = 0;
};

}  // namespace loom::train
