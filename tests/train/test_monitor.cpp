// train/progress and train/monitor: the --progress choice, the bar's text and
// its throttle (counted redraws, no timing), JSON encoding of records, and a
// metrics file read back field by field.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <string>

#include <loom/train/monitor.h>
#include <loom/train/progress.h>
#include "tests/support/memory_stream.h"
#include "tests/support/temp_dir.h"
#include <loom/core/error.h>

using loom::train::ProgressDisplay;
using loom::train::ProgressSnapshot;
using loom::train::ProgressStyle;

namespace {

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_SUITE("progress") {
  TEST_CASE("--progress auto is a bar on a terminal and lines elsewhere") {
    CHECK(loom::train::parse_progress_style("auto", true) == ProgressStyle::bar);
    CHECK(loom::train::parse_progress_style("auto", false) == ProgressStyle::lines);
    CHECK(loom::train::parse_progress_style("bar", false) == ProgressStyle::bar);
    CHECK(loom::train::parse_progress_style("lines", true) == ProgressStyle::lines);
    CHECK(loom::train::parse_progress_style("none", true) == ProgressStyle::none);
    CHECK_THROWS_AS(loom::train::parse_progress_style("fancy", true), loom::Error);
  }

  TEST_CASE("the bar and the line show step, rate, loss, data wait and time left") {
    ProgressSnapshot s;
    s.epoch = 1;
    s.epochs = 2;
    s.step = 150;
    s.steps = 600;
    s.images_per_second = 4890.25;
    s.loss = 0.27144;
    s.data_wait_share = 0.014;
    s.seconds_left = 65;
    const std::string bar = loom::train::format_progress(s, ProgressStyle::bar, 21.6, 140);
    CHECK(bar == "Epoch 1/2  25%|##########                              | 150/600 [0:00:22<0:01:05, 4890.2 img/s, "
                 "loss 0.2714, data 1%]");
    CHECK(bar.size() <= 139);
    CHECK(loom::train::format_progress(s, ProgressStyle::bar, 21.6, 100).size() == 99);  // a 21-column bar
    // Narrow terminals lose the bar, then the tail, never overflow.
    CHECK(loom::train::format_progress(s, ProgressStyle::bar, 21.6, 80).find('#') == std::string::npos);
    CHECK(loom::train::format_progress(s, ProgressStyle::bar, 21.6, 40).size() == 39);
    CHECK(loom::train::format_progress(s, ProgressStyle::lines, 21.6) ==
          "Epoch 1/2, step 150/600, 4890.2 images/s, loss 0.2714, data wait 1%, ETA 0:01:05");
    s.loss = std::numeric_limits<double>::quiet_NaN();
    s.seconds_left = -1;
    CHECK(loom::train::format_progress(s, ProgressStyle::lines, 0) ==
          "Epoch 1/2, step 150/600, 4890.2 images/s, loss -, data wait 1%, ETA ?");
  }

  TEST_CASE("the bar redraws in place at most once per interval and is cleared at the epoch's end") {
    loom::testing::MemoryStream out;  // what the display writes
    int reads = 0;
    auto loss = [&] {
      ++reads;
      return 0.5;
    };
    ProgressDisplay display(ProgressStyle::bar, out.file, 10, std::chrono::hours(1));
    display.start_epoch(0, 1, 0, 1000);
    for (int64_t step = 1; step <= 1000; ++step) display.update(step, 100, 0.0, loss);
    CHECK(display.draws() == 1);  // the first step draws; the hour never passes
    CHECK(reads == 1);            // the loss (a GPU sync) is read only for a draw
    display.clear();              // other output; the next step draws again
    display.update(1000, 100, 0.0, loss);
    CHECK(display.draws() == 2);
    display.end_epoch();
    const std::string text = out.str();
    CHECK(count(text, "\r") == 4);  // two draws, two clears
    CHECK(count(text, "\n") == 0);
    CHECK(text.ends_with("\r\x1b[K"));
  }

  TEST_CASE("with no interval every update redraws; lines print every log interval and at the epoch's end") {
    loom::testing::MemoryStream bar_out;
    ProgressDisplay bar(ProgressStyle::bar, bar_out.file, 10, std::chrono::steady_clock::duration::zero());
    bar.start_epoch(0, 1, 0, 50);
    for (int64_t step = 1; step <= 50; ++step) bar.update(step, 1, 0.0, [] { return 1.0; });
    CHECK(bar.draws() == 50);

    loom::testing::MemoryStream lines_out;
    ProgressDisplay lines(ProgressStyle::lines, lines_out.file, 10);
    lines.start_epoch(1, 3, 0, 25);
    for (int64_t step = 1; step <= 25; ++step) lines.update(step, 1, 0.0, [] { return 1.0; });
    lines.end_epoch();
    const std::string text = lines_out.str();
    CHECK(count(text, "\n") == 3);  // steps 10, 20 and the epoch's last, 25
    CHECK(text.find("Epoch 2/3, step 25/25,") != std::string::npos);
    CHECK(text.find('\r') == std::string::npos);

    loom::testing::MemoryStream none_out;
    ProgressDisplay none(ProgressStyle::none, none_out.file, 1);
    none.start_epoch(0, 1, 0, 5);
    for (int64_t step = 1; step <= 5; ++step) none.update(step, 1, 0.0, [] { return 1.0; });
    none.end_epoch();
    CHECK(none_out.str().empty());
  }
}

TEST_SUITE("metrics") {
  TEST_CASE("records are JSON objects; non-finite numbers are null; strings are escaped") {
    const loom::train::MetricRecord record = {{"type", std::string("step")},
                                             {"step", int64_t{12}},
                                             {"loss", 0.5},
                                             {"nan", std::nan("")},
                                             {"none", nullptr},
                                             {"text", std::string("a \"b\"\n\\")},
                                             {"command", std::vector<std::string>{"train_mnist", "--epochs", "1"}}};
    CHECK(loom::train::to_json(record) ==
          "{\"type\": \"step\", \"step\": 12, \"loss\": 0.5, \"nan\": null, \"none\": null, "
          "\"text\": \"a \\\"b\\\"\\n\\\\\", \"command\": [\"train_mnist\", \"--epochs\", \"1\"]}");
  }

  TEST_CASE("a monitor writes a header, step records every log interval and the epoch record") {
    loom::testing::TempDir dir;
    const std::string path = (dir.path() / "metrics.jsonl").string();
    loom::train::RunDescription run;
    run.program = "test";
    run.command = {"test", "--metrics", path};
    run.backend = "none";
    run.device = loom::Device::cpu();
    run.amp = "O0";
    run.dtype = "f32";
    run.global_batch_size = 10;
    run.epochs = 1;
    run.steps_per_epoch = 6;
    run.log_interval = 3;
    {
      loom::train::TrainingMonitor monitor(true, "none", path, "", run);
      CHECK(monitor.records_epochs());
      monitor.start_epoch(0, 0);
      const loom::Tensor loss = loom::Tensor::full({1}, 0.75);
      for (int64_t step = 1; step <= 6; ++step) {
        monitor.step({.epoch_step = step, .step = step, .images = 10, .data_wait_seconds = 0.0, .loss = &loss, .lr = 0.1});
      }
      monitor.end_epoch(loom::dist::AccuracyCounts{3, 4});
      monitor.finish();
    }
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    REQUIRE(lines.size() == 4);
    CHECK(lines[0].starts_with("{\"type\": \"header\""));
    CHECK(lines[1].find("\"epoch_step\": 3, \"step\": 3, \"loss\": 0.75, \"lr\": 0.1") != std::string::npos);
    CHECK(lines[2].find("\"step\": 6") != std::string::npos);
    CHECK(lines[3].find("\"test_accuracy\": 0.75, \"test_correct\": 3, \"test_total\": 4") != std::string::npos);
    CHECK(lines[3].find("\"peak_gpu_bytes\": 0") != std::string::npos);
  }

  TEST_CASE("a metrics file that cannot be opened is an error naming --metrics and the file") {
    // (A missing directory is created, as TensorBoard's log directory is.)
    loom::testing::TempDir dir;
    loom::train::RunDescription run;
    run.device = loom::Device::cpu();
    std::FILE* file = std::fopen((dir.path() / "a-file").c_str(), "w");
    std::fclose(file);
    const std::string path = (dir.path() / "a-file" / "m.jsonl").string();  // a directory that cannot be made
    CHECK_THROWS_WITH_AS(loom::train::TrainingMonitor(true, "none", path, "", run),
                         doctest::Contains(("--metrics " + path).c_str()), loom::Error);
    // Only rank 0 writes: the others open nothing.
    CHECK_NOTHROW(loom::train::TrainingMonitor(false, "none", path, "", run));
  }
}
