// Save and resume: a run interrupted after k steps and resumed from its
// checkpoint (model, optimizer moments, f32 masters, loss scale and growth
// count in one safetensors file) ends bit for bit where the uninterrupted run
// ends, with the loss scale both skipping and growing along the way.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include <loom/nn/checkpoint.h>
#include <loom/nn/convnet.h>
#include "tests/amp/helpers.h"

using namespace loom;
using namespace loom::amp_test;

namespace {

// A high initial scale that f16 gradients overflow and a short growth
// interval: the schedule both backs off and grows within a few steps.
const optim::GradScalerOptions kScaler = optim::GradScalerOptions().init_scale(1 << 17).growth_interval(2);

struct Run {
  std::shared_ptr<nn::ConvNet> model;
  std::unique_ptr<amp::MixedPrecisionOptimizer> optimizer;
  std::vector<double> scales;  // after each step
  int64_t steps_taken = 0;
};

Run start_run(amp::OptLevel level, const amp::OptimizerFactory& make_optimizer) {
  manual_seed(21);
  Run run;
  run.model = std::make_shared<nn::ConvNet>();
  run.optimizer = amp::initialize(*run.model, make_optimizer, level, kScaler);
  return run;
}

void train(Run& run, int64_t first_step, int64_t end_step) {
  for (int64_t step = first_step; step < end_step; ++step) {
    run.steps_taken += train_step(*run.model, *run.optimizer, 5000 + static_cast<uint64_t>(step));
    run.scales.push_back(run.optimizer->scaler().get_scale());
  }
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  Tensor c = t.contiguous();
  const uint8_t* p = static_cast<const uint8_t*>(c.raw_data());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

void check_identical(const nn::NamedTensors& a, const nn::NamedTensors& b, const char* what) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CAPTURE(what);
    CAPTURE(a[i].first);
    CHECK(a[i].first == b[i].first);
    CHECK(a[i].second.dtype() == b[i].second.dtype());
    CHECK(bytes_of(a[i].second) == bytes_of(b[i].second));
  }
}

void check_resume(amp::OptLevel level, const amp::OptimizerFactory& make_optimizer) {
  constexpr int64_t kSteps = 10, kInterruptAt = 5;
  Run whole = start_run(level, make_optimizer);
  train(whole, 0, kSteps);
  if (whole.optimizer->scaler().enabled()) {
    // The run exercised the schedule: some steps skipped, the scale grew at least once.
    CHECK(whole.optimizer->scaler().skipped_steps() > 0);
    bool grew = false;
    for (size_t i = 1; i < whole.scales.size(); ++i) grew = grew || whole.scales[i] > whole.scales[i - 1];
    CHECK(grew);
  }
  CHECK(whole.steps_taken >= kSteps / 2);
  std::string schedule;
  for (double scale : whole.scales) schedule += str(" ", std::log2(scale));
  MESSAGE(std::string(amp::opt_level_name(level)), ": ", whole.steps_taken, " of ", kSteps, " steps taken; log2(scale) after each:", schedule);

  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / str("loom_amp_resume_", ::getpid(), "_", std::string(amp::opt_level_name(level)), ".safetensors");
  {
    Run first = start_run(level, make_optimizer);
    train(first, 0, kInterruptAt);
    nn::TrainingState state;
    state.step = kInterruptAt;
    first.optimizer->save_state(state);
    nn::save_checkpoint(path, {first.model->state_dict(), std::move(state)});
  }
  manual_seed(999);  // the resumed run builds its model from other random numbers
  Run resumed = start_run(level, make_optimizer);
  {
    nn::Checkpoint checkpoint = nn::load_checkpoint(path);
    std::filesystem::remove(path);
    nn::load_model_state(*resumed.model, checkpoint.model, "checkpoint");
    REQUIRE(checkpoint.training);
    resumed.optimizer->load_state(*checkpoint.training);
  }
  train(resumed, kInterruptAt, kSteps);

  check_identical(resumed.model->state_dict(), whole.model->state_dict(), "model");
  check_identical(resumed.optimizer->master_weights()->state(), whole.optimizer->master_weights()->state(), "masters");
  check_identical(resumed.optimizer->optimizer().state(), whole.optimizer->optimizer().state(), "optimizer");
  CHECK(resumed.optimizer->scaler().get_scale() == whole.optimizer->scaler().get_scale());
  CHECK(resumed.optimizer->scaler().growth_tracker() == whole.optimizer->scaler().growth_tracker());
  CHECK(resumed.optimizer->scaler().skipped_steps() == whole.optimizer->scaler().skipped_steps());
}

}  // namespace

TEST_SUITE("resume") {
  TEST_CASE("O2 with SGD momentum continues bit for bit") { check_resume(amp::OptLevel::O2, sgd(0.05)); }
  TEST_CASE("bf16 with Adam continues bit for bit") { check_resume(amp::OptLevel::bf16, adam(1e-3)); }

  TEST_CASE("a checkpoint of another level is refused with both names") {
    Run o2 = start_run(amp::OptLevel::O2, sgd(0.05));
    nn::TrainingState state;
    o2.optimizer->save_state(state);
    CHECK(state.extra_metadata.at("amp.opt_level") == "O2");
    Run bf16 = start_run(amp::OptLevel::bf16, sgd(0.05));
    CHECK_THROWS_WITH_AS(bf16.optimizer->load_state(state),
                         doctest::Contains("written with --amp O2 but this run uses --amp bf16"), loom::Error);
    CHECK_THROWS_WITH_AS(bf16.optimizer->check_compatible(state), doctest::Contains("resume with --amp O2"), loom::Error);
    CHECK_NOTHROW(o2.optimizer->check_compatible(state));
    CHECK_THROWS_WITH_AS(o2.optimizer->load_state(nn::TrainingState{}), doctest::Contains("without --amp"), loom::Error);
    Run o0 = start_run(amp::OptLevel::O0, sgd(0.05));
    CHECK_NOTHROW(o0.optimizer->load_state(nn::TrainingState{}));  // a checkpoint written before --amp existed
  }
}
