// What rank 0's progress bar, metrics file and TensorBoard scalars cost a
// training step (train/monitor.h), as a share of the step: train_mnist's
// ConvNet step (batch 100, SGD, synthetic images) is timed, then in the same
// run the monitor's per-step call with everything on (--progress bar drawn
// into /dev/null, --metrics and --tensorboard every --log-interval steps),
// and a bar redraw alone. The share does not depend on a quiet machine the
// way a with/without comparison of whole runs would: it is two costs measured
// back to back, and a bound follows from them: per step, one update plus one
// redraw per redraw interval (250 ms) plus a record per log interval.
// Checks the step's loss is finite and the bar was drawn before reporting.
//   progress_overhead [--threads 1] [--steps 20] [--updates 200000]
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <loom/train/monitor.h>
#include <loom/train/progress.h>
#include <loom/core/error.h>
#include <loom/core/generator.h>
#include <loom/core/parallel.h>
#include <loom/nn/convnet.h>
#include <loom/ops/loss.h>
#include <loom/optim/optimizer.h>

using namespace loom;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Cost of the progress bar and metrics per training step"};
  int threads = 1;
  int64_t steps = 20, updates = 200000, redraws = 20000, log_interval = 100;
  app.add_option("--threads", threads)->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "timed ConvNet steps")->check(CLI::PositiveNumber);
  app.add_option("--updates", updates, "timed monitor updates")->check(CLI::PositiveNumber);
  app.add_option("--redraws", redraws, "timed bar redraws")->check(CLI::PositiveNumber);
  app.add_option("--log-interval", log_interval, "steps between metrics records")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    set_num_threads(threads);
    manual_seed(0);
    // ---- train_mnist's step ----
    nn::ConvNet model;
    optim::SGD sgd(model.parameters(), optim::SGDOptions(0.01).momentum(0.9));
    std::vector<float> pixels(100 * 28 * 28);
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = std::sin(0.37f * static_cast<float>(i));
    const Tensor images = Tensor::from_vector(pixels, {100, 1, 28, 28});
    std::vector<int64_t> label_values(100);
    for (int64_t i = 0; i < 100; ++i) label_values[i] = i % 10;
    const Tensor labels = Tensor::from_vector<int64_t>(label_values, {100});
    Tensor loss;
    auto train_step = [&] {
      loss = cross_entropy(model(images), labels);
      sgd.zero_grad();
      loss.backward();
      sgd.step();
    };
    for (int i = 0; i < 3; ++i) train_step();
    LOOM_CHECK(std::isfinite(loss.item()), "the ConvNet step's loss is not finite");
    const auto step_start = Clock::now();
    for (int64_t i = 0; i < steps; ++i) train_step();
    const double step_seconds = seconds_since(step_start) / static_cast<double>(steps);

    // ---- a redraw (format + write to /dev/null), every update ----
    std::FILE* null_file = std::fopen("/dev/null", "w");
    LOOM_CHECK(null_file != nullptr, "cannot open /dev/null");
    train::ProgressDisplay always(train::ProgressStyle::bar, null_file, log_interval, Clock::duration::zero());
    always.start_epoch(0, 1, 0, redraws);
    const auto redraw_start = Clock::now();
    for (int64_t i = 1; i <= redraws; ++i) always.update(i, 100, 1e-4, [] { return 0.25; });
    const double redraw_seconds = seconds_since(redraw_start) / static_cast<double>(redraws);
    LOOM_CHECK(always.draws() == redraws, "the bar was drawn ", always.draws(), " times, expected ", redraws);

    // ---- the monitor's per-step call: bar (throttled), metrics and TensorBoard ----
    const std::filesystem::path dir = std::filesystem::temp_directory_path() / "loom-progress-overhead";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    train::RunDescription run{.program = "progress_overhead", .command = {"progress_overhead"}, .backend = "none",
                             .device = Device::cpu(), .amp = "O0", .dtype = "f32", .global_batch_size = 100,
                             .epochs = 1, .steps_per_epoch = updates, .log_interval = log_interval};
    double update_seconds = 0;
    {
      train::TrainingMonitor monitor(true, "bar", (dir / "metrics.jsonl").string(), (dir / "tb").string(), run);
      // The bar goes to stderr: point it at /dev/null for the measurement.
      std::fflush(stderr);
      std::FILE* saved = std::freopen("/dev/null", "w", stderr);
      LOOM_CHECK(saved != nullptr, "cannot redirect stderr");
      monitor.start_epoch(0, 0);
      const auto update_start = Clock::now();
      for (int64_t i = 1; i <= updates; ++i) {
        train::StepReport report{.epoch_step = i, .step = i, .images = 100, .data_wait_seconds = 1e-4, .loss = &loss,
                                .lr = 0.01};
        monitor.step(report);
      }
      update_seconds = seconds_since(update_start) / static_cast<double>(updates);
      monitor.end_epoch(std::nullopt);
      monitor.finish();
    }
    std::filesystem::remove_all(dir);
    std::fclose(null_file);

    // Per step: one update (its records and throttled redraws included, as
    // they came in the timed loop) and at most one extra redraw per 250 ms.
    const double redraws_per_step = std::min(1.0, step_seconds / 0.25);
    const double worst_case = update_seconds + redraws_per_step * redraw_seconds;
    std::printf(
        "{\"step_ms\": %.3f, \"monitor_update_us\": %.3f, \"bar_redraw_us\": %.3f, \"log_interval\": %lld, "
        "\"overhead_share\": %.6f, \"overhead_share_bound\": %.6f}\n",
        1000.0 * step_seconds, 1e6 * update_seconds, 1e6 * redraw_seconds, static_cast<long long>(log_interval),
        update_seconds / step_seconds, worst_case / step_seconds);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "progress_overhead: %s\n", e.what());
    return 1;
  }
}
