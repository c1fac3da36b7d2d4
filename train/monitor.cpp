#include <loom/train/monitor.h>

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <loom/core/cuda/runtime.h>
#include <loom/core/error.h>
#include <loom/core/json_string.h>
#include <loom/core/version.h>

namespace loom::train {

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

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration duration) { return std::chrono::duration<double>(duration).count(); }

double unix_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Fields that locate a record rather than measure something: not TensorBoard scalars.
bool is_position(const std::string& key) {
  return key == "time" || key == "elapsed_s" || key == "step" || key == "epoch" || key == "epoch_step" ||
         key == "epoch_steps" || key == "test_correct" || key == "test_total";
}

}  // namespace

std::string to_json(const MetricRecord& record) {
  std::string out = "{";
  for (const auto& [key, value] : record) {
    if (out.size() > 1) out += ", ";
    append_json_string(out, key);
    out += ": ";
    if (const auto* number = std::get_if<double>(&value)) {
      if (std::isfinite(*number)) {
        char text[40];
        std::snprintf(text, sizeof(text), "%.15g", *number);  // Unix times keep their microseconds
        out += text;
      } else {
        out += "null";  // JSON has no NaN or infinity
      }
    } else if (const auto* whole = std::get_if<int64_t>(&value)) {
      out += std::to_string(*whole);
    } else if (const auto* text = std::get_if<std::string>(&value)) {
      append_json_string(out, *text);
    } else if (const auto* list = std::get_if<std::vector<std::string>>(&value)) {
      out += '[';
      for (size_t i = 0; i < list->size(); ++i) {
        if (i > 0) out += ", ";
        append_json_string(out, (*list)[i]);
      }
      out += ']';
    } else {
      out += "null";
    }
  }
  return out + "}";
}

TrainingMonitor::TrainingMonitor(bool leader, const std::string& progress, const std::string& metrics_path,
                                 const std::string& tensorboard_dir, RunDescription run)
    : leader_(leader), run_(std::move(run)), metrics_path_(metrics_path) {
  records_epochs_ = !metrics_path.empty() || !tensorboard_dir.empty();
  run_start_ = epoch_start_ = interval_start_ = last_step_end_ = Clock::now();
  const ProgressStyle style = parse_progress_style(progress, ::isatty(STDERR_FILENO) == 1);
  progress_ = std::make_unique<ProgressDisplay>(leader_ ? style : ProgressStyle::none, stderr, run_.log_interval);
  if (!leader_) return;
  if (!metrics_path.empty()) {
    // Appended: a resumed run adds its header and records after the earlier ones.
    const std::filesystem::path parent = std::filesystem::path(metrics_path).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    LOOM_CHECK(!ec, "--metrics ", metrics_path, ": cannot create the directory ", parent.string(), ": ", ec.message());
    metrics_ = std::fopen(metrics_path.c_str(), "a");
    LOOM_CHECK(metrics_ != nullptr, "--metrics ", metrics_path, ": cannot open the file: ", std::strerror(errno));
  }
  if (!tensorboard_dir.empty()) {
    try {
      tensorboard_ = std::make_unique<SummaryWriter>(tensorboard_dir);
    } catch (const std::exception& e) {
      throw Error(str("--tensorboard ", tensorboard_dir, ": ", e.what()));
    }
  }
  write({{"type", std::string("header")},
         {"time", unix_time()},
         {"program", run_.program},
         {"command", run_.command},
         {"loom_version", std::string(version())},
         {"world_size", int64_t{run_.world_size}},
         {"backend", run_.backend},
         {"device", run_.device.str()},
         {"amp", run_.amp},
         {"dtype", run_.dtype},
         {"global_batch_size", run_.global_batch_size},
         {"epochs", run_.epochs},
         {"steps_per_epoch", run_.steps_per_epoch},
         {"log_interval", run_.log_interval}},
        nullptr);
}

TrainingMonitor::~TrainingMonitor() {
  if (metrics_) std::fclose(metrics_);
}

void TrainingMonitor::start_epoch(int64_t epoch, int64_t first_step) {
  epoch_ = epoch;
  epoch_steps_ = first_step;
  in_epoch_ = true;
  epoch_steps_ended_ = false;
  epoch_start_ = interval_start_ = last_step_end_ = Clock::now();
  interval_ = epoch_sums_ = Sums{};
  progress_->start_epoch(epoch, run_.epochs, first_step, run_.steps_per_epoch);
}

void TrainingMonitor::before_output() { progress_->clear(); }

void TrainingMonitor::set_loss(double loss) {
  loss_ = loss;
  loss_read_ = true;
  progress_->set_loss(loss);
}

void TrainingMonitor::set_epoch_images(int64_t images) { epoch_sums_.images = images; }

double TrainingMonitor::read_loss(const StepReport& report) {
  if (!loss_read_ && report.loss != nullptr) {
    loss_ = report.loss->item();
    loss_read_ = true;
  }
  return loss_;
}

void TrainingMonitor::step(const StepReport& report) {
  const Clock::time_point now = Clock::now();
  const double step_seconds = seconds(now - last_step_end_);
  last_step_end_ = now;
  step_ = report.step;
  epoch_steps_ = report.epoch_step;
  if (!leader_) return;
  progress_->update(report.epoch_step, report.images, report.data_wait_seconds, [&] { return read_loss(report); });
  if (metrics_ || tensorboard_) {
    scaler_ = report.scaler;
    last_lr_ = report.lr;
    Sums step_sums;
    step_sums.steps = step_sums.timed_steps = 1;
    step_sums.images = report.images;
    step_sums.data_wait = report.data_wait_seconds;
    step_sums.step_seconds = step_seconds;
    if (report.ddp) {
      // Time on the wire (each bucket from started to done), the part of it
      // before backward ended (hidden behind backward), and the wait after
      // backward for the last buckets (exposed).
      const dist::IterationTiming timing = report.ddp->last_iteration_timing();
      for (const dist::BucketTiming& bucket : timing.buckets) {
        if (bucket.started == Clock::time_point{} || bucket.done == Clock::time_point{}) continue;
        step_sums.communication += seconds(bucket.done - bucket.started);
        if (timing.backward_end != Clock::time_point{})
          step_sums.hidden += std::max(0.0, seconds(std::min(bucket.done, timing.backward_end) - bucket.started));
      }
      if (timing.reduced != Clock::time_point{} && timing.backward_end != Clock::time_point{})
        step_sums.exposed += std::max(0.0, seconds(timing.reduced - timing.backward_end));
    }
    for (Sums* sums : {&interval_, &epoch_sums_}) {
      sums->steps += step_sums.steps;
      sums->timed_steps += step_sums.timed_steps;
      sums->images += step_sums.images;
      sums->data_wait += step_sums.data_wait;
      sums->step_seconds += step_sums.step_seconds;
      sums->communication += step_sums.communication;
      sums->hidden += step_sums.hidden;
      sums->exposed += step_sums.exposed;
    }
    if (report.epoch_step % run_.log_interval == 0) {
      const double wall = seconds(now - interval_start_);
      MetricRecord record = {{"type", std::string("step")},
                             {"time", unix_time()},
                             {"elapsed_s", seconds(now - run_start_)},
                             {"epoch", epoch_ + 1},
                             {"epoch_step", report.epoch_step},
                             {"step", report.step},
                             {"loss", read_loss(report)},
                             {"lr", report.lr},
                             {"images_per_s", wall > 0 ? static_cast<double>(interval_.images) / wall : 0.0},
                             {"data_wait_s", interval_.data_wait},
                             {"data_wait_share", wall > 0 ? std::min(1.0, interval_.data_wait / wall) : 0.0},
                             {"step_time_ms", 1000.0 * interval_.step_seconds / static_cast<double>(interval_.steps)}};
      if (report.ddp) {
        const double steps = static_cast<double>(interval_.steps);
        record.push_back({"comm_ms", 1000.0 * interval_.communication / steps});
        record.push_back({"comm_hidden_share", interval_.communication > 0 ? interval_.hidden / interval_.communication : 1.0});
        record.push_back({"exposed_comm_ms", 1000.0 * interval_.exposed / steps});
      }
      if (report.scaler && report.scaler->enabled()) {
        record.push_back({"loss_scale", report.scaler->get_scale()});
        record.push_back({"skipped_steps", report.scaler->skipped_steps()});
      }
      add_memory(record);
      write(record, "train/");
      interval_ = Sums{};
      interval_start_ = now;
    }
  }
  // The loss is read at most once per step; the next step's is another.
  last_loss_ = report.loss ? *report.loss : Tensor();
  last_loss_read_ = loss_read_;
  loss_read_ = false;
}

void TrainingMonitor::end_epoch_steps() {
  if (!in_epoch_ || epoch_steps_ended_) return;
  epoch_steps_ended_ = true;
  progress_->end_epoch();
}

void TrainingMonitor::end_epoch(std::optional<dist::AccuracyCounts> accuracy) {
  if (!in_epoch_) return;
  end_epoch_steps();
  in_epoch_ = false;
  if (!leader_) return;
  if (!metrics_ && !tensorboard_) return;
  const Clock::time_point now = Clock::now();
  const double wall = seconds(last_step_end_ - epoch_start_);
  if (!last_loss_read_ && last_loss_.defined()) {
    loss_ = last_loss_.item();
    last_loss_read_ = true;
  }
  const double steps = static_cast<double>(std::max<int64_t>(epoch_sums_.steps, 1));
  MetricRecord record = {{"type", std::string("epoch")},
                         {"time", unix_time()},
                         {"elapsed_s", seconds(now - run_start_)},
                         {"epoch", epoch_ + 1},
                         {"epoch_steps", epoch_sums_.steps},
                         {"step", step_},
                         {"loss", epoch_sums_.steps > 0 ? loss_ : std::nan("")},
                         {"lr", last_lr_},
                         {"epoch_time_s", wall},
                         {"images", epoch_sums_.images},
                         {"images_per_s", wall > 0 ? static_cast<double>(epoch_sums_.images) / wall : 0.0},
                         {"data_wait_s", epoch_sums_.data_wait},
                         {"data_wait_share", wall > 0 ? std::min(1.0, epoch_sums_.data_wait / wall) : 0.0},
                         {"step_time_ms", 1000.0 * epoch_sums_.step_seconds / steps}};
  if (run_.world_size > 1) {
    record.push_back({"comm_ms", 1000.0 * epoch_sums_.communication / steps});
    record.push_back({"comm_hidden_share", epoch_sums_.communication > 0 ? epoch_sums_.hidden / epoch_sums_.communication : 1.0});
    record.push_back({"exposed_comm_ms", 1000.0 * epoch_sums_.exposed / steps});
  }
  if (scaler_ && scaler_->enabled()) {
    record.push_back({"loss_scale", scaler_->get_scale()});
    record.push_back({"skipped_steps", scaler_->skipped_steps()});
  }
  add_memory(record);
  if (accuracy) {
    record.push_back({"test_accuracy", accuracy->accuracy()});
    record.push_back({"test_correct", accuracy->correct});
    record.push_back({"test_total", accuracy->total});
  } else {
    record.push_back({"test_accuracy", nullptr});
  }
  write(record, "epoch/");
}

void TrainingMonitor::add_memory(MetricRecord& record) const {
  record.push_back({"peak_host_rss_bytes", int64_t{peak_rss_bytes()}});
  record.push_back({"peak_gpu_bytes", run_.device.is_cuda() ? static_cast<int64_t>(cuda::memory_stats(run_.device.index).peak_allocated_bytes) : int64_t{0}});
}

void TrainingMonitor::write(const MetricRecord& record, const char* tensorboard_prefix) {
  if (metrics_) {
    const std::string line = to_json(record) + "\n";
    LOOM_CHECK(std::fwrite(line.data(), 1, line.size(), metrics_) == line.size(), "--metrics ", metrics_path_,
               ": write failed: ", std::strerror(errno));
    std::fflush(metrics_);  // a crash loses nothing already recorded
  }
  if (tensorboard_ && tensorboard_prefix) {
    for (const auto& [key, value] : record) {
      if (is_position(key)) continue;
      if (const auto* number = std::get_if<double>(&value)) {
        if (std::isfinite(*number)) tensorboard_->add_scalar(tensorboard_prefix + key, *number, step_);
      } else if (const auto* whole = std::get_if<int64_t>(&value)) {
        tensorboard_->add_scalar(tensorboard_prefix + key, static_cast<double>(*whole), step_);
      }
    }
    tensorboard_->flush();  // TensorBoard shows the run while it trains
  }
}

void TrainingMonitor::finish() {
  progress_->clear();
  if (metrics_) {
    LOOM_CHECK(std::fflush(metrics_) == 0 && !std::ferror(metrics_), "--metrics ", metrics_path_,
               ": write failed: ", std::strerror(errno));
  }
  if (tensorboard_) tensorboard_->flush();
}

}  // namespace loom::train
