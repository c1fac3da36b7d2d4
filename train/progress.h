// Rank 0's progress display (--progress): a bar redrawn in place on a
// terminal, as tqdm and Lightning show it, or plain lines where stderr is a
// file or a pipe. Per epoch: step / steps, images/s, loss, the share of the
// time spent waiting for data, and the time left.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace loom::train {

enum class ProgressStyle { bar, lines, none };

// --progress: bar, lines or none as given; auto is bar when `stderr_is_terminal`, else lines.
ProgressStyle parse_progress_style(const std::string& flag, bool stderr_is_terminal);

// What one progress line shows.
struct ProgressSnapshot {
  int64_t epoch = 1, epochs = 1;  // 1-based
  int64_t step = 0, steps = 0;    // steps done in this epoch, of `steps`
  double images_per_second = 0;
  double loss = 0;                // NaN: not read yet
  double data_wait_share = 0;     // of the epoch's time so far, 0..1
  double seconds_left = 0;        // in this epoch; < 0: unknown
};

// The bar (without the leading '\r'), fitted into `width` columns:
//   "Epoch 1/2  43%|######        | 258/600 [0:00:05<0:00:07, 4890.2 img/s, loss 0.2714, data 1%]"
// or, for lines, the same fields without the bar:
//   "Epoch 1/2, step 258/600, 4890.2 images/s, loss 0.2714, data wait 1%, ETA 0:00:07"
std::string format_progress(const ProgressSnapshot& snapshot, ProgressStyle style, double elapsed_seconds,
                            int width = 100);

// Draws the progress of rank 0's epochs. update() after every step is cheap:
// it reads the clock and returns unless a redraw is due; the bar is redrawn
// at most every `redraw_interval` (a few times a second), a line is printed
// every `line_interval` steps and at the epoch's end. The bar is cleared at
// the end of each epoch and by clear() before other output.
class ProgressDisplay {
 public:
  using Clock = std::chrono::steady_clock;
  ProgressDisplay(ProgressStyle style, std::FILE* out, int64_t line_interval,
                  Clock::duration redraw_interval = std::chrono::milliseconds(250));
  ProgressStyle style() const { return style_; }

  void start_epoch(int64_t epoch, int64_t epochs, int64_t first_step, int64_t steps);
  // After step `step` (of this epoch) that brought `images` images (all
  // ranks) and waited `data_wait_seconds` for them. `loss` is read only when
  // something is drawn (it may synchronize a GPU).
  template <typename LossReader>
  void update(int64_t step, int64_t images, double data_wait_seconds, LossReader&& loss) {
    step_ = step;
    images_ += images;
    data_wait_seconds_ += data_wait_seconds;
    if (style_ == ProgressStyle::none) return;
    const Clock::time_point now = Clock::now();
    const bool line_due = style_ == ProgressStyle::lines && step % line_interval_ == 0;
    if (!line_due && (style_ != ProgressStyle::bar || now < next_redraw_)) return;
    loss_ = loss();
    draw(now);
  }
  // The loss, when the caller read it anyway (its loss lines).
  void set_loss(double loss) { loss_ = loss; }
  // Ends the epoch: clears the bar; prints the epoch's last line for lines.
  void end_epoch();
  // Clears the bar (until its next redraw) so that other output starts on a clean line.
  void clear();
  // Redraws counted so far (the benchmark and tests).
  int64_t draws() const { return draws_; }

 private:
  void draw(Clock::time_point now);
  ProgressStyle style_;
  std::FILE* out_;
  int64_t line_interval_;
  Clock::duration redraw_interval_;
  Clock::time_point epoch_start_, next_redraw_;
  int64_t epoch_ = 1, epochs_ = 1, first_step_ = 0, step_ = 0, steps_ = 0, images_ = 0, draws_ = 0;
  double data_wait_seconds_ = 0, loss_;
  bool bar_shown_ = false, in_epoch_ = false;
};

}  // namespace loom::train
