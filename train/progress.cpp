#include <loom/train/progress.h>

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include <loom/core/error.h>

namespace loom::train {

ProgressStyle parse_progress_style(const std::string& flag, bool stderr_is_terminal) {
  if (flag == "bar") return ProgressStyle::bar;
  if (flag == "lines") return ProgressStyle::lines;
  if (flag == "none") return ProgressStyle::none;
  LOOM_CHECK(flag == "auto", "--progress ", flag, ": use auto, bar, lines or none");
  return stderr_is_terminal ? ProgressStyle::bar : ProgressStyle::lines;
}

namespace {

// "0:01:05" (h:mm:ss), "?" when unknown.
std::string clock_text(double seconds) {
  if (!(seconds >= 0) || seconds > 1e8) return "?";
  const long long whole = std::llround(seconds);
  char text[32];
  std::snprintf(text, sizeof(text), "%lld:%02lld:%02lld", whole / 3600, (whole / 60) % 60, whole % 60);
  return text;
}

std::string loss_text(double loss) {
  if (std::isnan(loss)) return "-";
  char text[32];
  std::snprintf(text, sizeof(text), "%.4f", loss);
  return text;
}

// Columns of the terminal on `file`, else $COLUMNS, else 100.
int terminal_width(std::FILE* file) {
  winsize size{};
  if (::ioctl(::fileno(file), TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  if (const char* columns = std::getenv("COLUMNS")) {
    const int value = std::atoi(columns);
    if (value > 0) return value;
  }
  return 100;
}

}  // namespace

std::string format_progress(const ProgressSnapshot& s, ProgressStyle style, double elapsed_seconds, int width) {
  char text[512];
  const int data_percent = static_cast<int>(std::lround(100.0 * std::clamp(s.data_wait_share, 0.0, 1.0)));
  if (style == ProgressStyle::lines) {
    std::snprintf(text, sizeof(text), "Epoch %lld/%lld, step %lld/%lld, %.1f images/s, loss %s, data wait %d%%, ETA %s",
                  static_cast<long long>(s.epoch), static_cast<long long>(s.epochs), static_cast<long long>(s.step),
                  static_cast<long long>(s.steps), s.images_per_second, loss_text(s.loss).c_str(), data_percent,
                  clock_text(s.seconds_left).c_str());
    return text;
  }
  const double fraction = s.steps > 0 ? std::clamp(static_cast<double>(s.step) / static_cast<double>(s.steps), 0.0, 1.0) : 0.0;
  char head[64], tail[256];
  std::snprintf(head, sizeof(head), "Epoch %lld/%lld %3d%%|", static_cast<long long>(s.epoch),
                static_cast<long long>(s.epochs), static_cast<int>(100.0 * fraction));
  std::snprintf(tail, sizeof(tail), "| %lld/%lld [%s<%s, %.1f img/s, loss %s, data %d%%]",
                static_cast<long long>(s.step), static_cast<long long>(s.steps), clock_text(elapsed_seconds).c_str(),
                clock_text(s.seconds_left).c_str(), s.images_per_second, loss_text(s.loss).c_str(), data_percent);
  const std::string head_text = head, tail_text = tail;
  // The bar takes what the text leaves, 10 to 40 columns; below 10 it is left out.
  const int room = width - 1 - static_cast<int>(head_text.size() + tail_text.size());
  const int bar_width = std::min(room, 40);
  std::string line = head_text;
  if (bar_width >= 10) {
    const int filled = static_cast<int>(fraction * bar_width);
    line += std::string(static_cast<size_t>(filled), '#') + std::string(static_cast<size_t>(bar_width - filled), ' ');
  }
  line += tail_text;
  if (static_cast<int>(line.size()) > width - 1) line.resize(static_cast<size_t>(std::max(width - 1, 0)));
  return line;
}

ProgressDisplay::ProgressDisplay(ProgressStyle style, std::FILE* out, int64_t line_interval,
                                 Clock::duration redraw_interval)
    : style_(style),
      out_(out),
      line_interval_(std::max<int64_t>(line_interval, 1)),
      redraw_interval_(redraw_interval),
      loss_(std::numeric_limits<double>::quiet_NaN()) {}

void ProgressDisplay::start_epoch(int64_t epoch, int64_t epochs, int64_t first_step, int64_t steps) {
  epoch_ = epoch + 1;
  epochs_ = epochs;
  first_step_ = step_ = first_step;
  steps_ = steps;
  images_ = 0;
  data_wait_seconds_ = 0;
  epoch_start_ = Clock::now();
  next_redraw_ = epoch_start_;  // the first step draws at once
  in_epoch_ = true;
}

void ProgressDisplay::draw(Clock::time_point now) {
  const double elapsed = std::chrono::duration<double>(now - epoch_start_).count();
  ProgressSnapshot snapshot;
  snapshot.epoch = epoch_;
  snapshot.epochs = epochs_;
  snapshot.step = step_;
  snapshot.steps = steps_;
  snapshot.loss = loss_;
  snapshot.images_per_second = elapsed > 0 ? static_cast<double>(images_) / elapsed : 0.0;
  snapshot.data_wait_share = elapsed > 0 ? data_wait_seconds_ / elapsed : 0.0;
  const int64_t done = step_ - first_step_;
  snapshot.seconds_left = done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(steps_ - step_) : -1.0;
  if (style_ == ProgressStyle::bar) {
    const std::string line = format_progress(snapshot, style_, elapsed, terminal_width(out_));
    std::fprintf(out_, "\r%s\x1b[K", line.c_str());
    bar_shown_ = true;
    next_redraw_ = now + redraw_interval_;
  } else {
    std::fprintf(out_, "%s\n", format_progress(snapshot, style_, elapsed).c_str());
  }
  std::fflush(out_);
  ++draws_;
}

void ProgressDisplay::end_epoch() {
  if (!in_epoch_) return;
  in_epoch_ = false;
  // lines: the epoch's last line, unless the last step printed it.
  if (style_ == ProgressStyle::lines && step_ % line_interval_ != 0 && step_ > first_step_) draw(Clock::now());
  clear();
}

void ProgressDisplay::clear() {
  if (!bar_shown_) return;
  std::fputs("\r\x1b[K", out_);
  std::fflush(out_);
  bar_shown_ = false;
  next_redraw_ = Clock::now();  // the next step draws it again
}

}  // namespace loom::train
