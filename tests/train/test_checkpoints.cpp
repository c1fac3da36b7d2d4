// loom::train's checkpoints and stop signals: checkpoint naming, rotation
// and the choice of the checkpoint to resume from; the restart count
// launchers pass; stop signals.
#include <doctest/doctest.h>

#include <loom/core/error.h>
#include <loom/dist/process_group_gloo.h>
#include <loom/dist/store.h>
#include <loom/train/checkpoints.h>
#include <loom/train/resume.h>
#include <loom/train/stop.h>
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>

#include "tests/support/memory_stream.h"
#include "tests/support/temp_dir.h"

namespace {

namespace fs = std::filesystem;

loom::nn::Checkpoint checkpoint_at(int64_t step) {
  loom::nn::TrainingState state;
  state.step = step;
  return {{{"w", loom::Tensor::full({4}, static_cast<double>(step))}}, state};
}

std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> names;
  for (auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

}  // namespace

TEST_SUITE("train.checkpoints") {
  TEST_CASE("--checkpoint-signal names") {
    using loom::train::parse_signal_name;
    CHECK(parse_signal_name("USR1") == SIGUSR1);
    CHECK(parse_signal_name("sigusr2") == SIGUSR2);
    CHECK(parse_signal_name("TERM") == SIGTERM);
    CHECK(parse_signal_name("none") == 0);
    CHECK_THROWS_WITH_AS(parse_signal_name("KILL"), doctest::Contains("'KILL' is not a signal loom stops on"),
                         loom::Error);
  }

  TEST_CASE("--resume defaults to auto only after a launcher's restart") {
    loom::train::CheckpointOptions flags;
    ::unsetenv("SLURM_RESTART_COUNT");
    ::setenv("TORCHELASTIC_RESTART_COUNT", "0", 1);
    CHECK(loom::train::effective_resume(flags) == "none");
    ::setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
    CHECK(loom::train::launcher_restart_count() == 2);
    CHECK(loom::train::effective_resume(flags) == "auto");
    ::unsetenv("TORCHELASTIC_RESTART_COUNT");
    ::setenv("SLURM_RESTART_COUNT", "1", 1);
    CHECK(loom::train::effective_resume(flags) == "auto");
    flags.resume("none");  // given explicitly, it wins
    CHECK(loom::train::effective_resume(flags) == "none");
    ::setenv("SLURM_RESTART_COUNT", "x", 1);
    CHECK_THROWS_WITH_AS(loom::train::launcher_restart_count(), doctest::Contains("SLURM_RESTART_COUNT='x'"),
                         loom::Error);
    ::unsetenv("SLURM_RESTART_COUNT");
  }

  TEST_CASE("step checkpoints rotate, epoch checkpoints stay; --resume auto takes the newest valid one") {
    loom::testing::TempDir dir;
    loom::train::CheckpointOptions flags = loom::train::CheckpointOptions().directory(dir.path().string()).every_steps(10).keep(2);
    loom::train::CheckpointWriter writer(flags, 2);
    CHECK(writer.step_due(20));
    CHECK_FALSE(writer.step_due(25));
    for (int64_t step : {10, 20}) writer.write(loom::train::CheckpointKind::step, step, checkpoint_at(step));
    writer.write(loom::train::CheckpointKind::epoch, 1, checkpoint_at(25));
    writer.write(loom::train::CheckpointKind::step, 30, checkpoint_at(30));
    CHECK(names_in(dir.path()) ==
          std::set<std::string>{"2GPU_step20.checkpoint", "2GPU_step30.checkpoint", "2GPU_1epoch.checkpoint"});

    flags.resume("auto");
    {
      loom::testing::MemoryStream log;  // what find_resume_point prints
      auto point = loom::train::find_resume_point(flags, loom::Device::cpu(), log.file);
      REQUIRE(point.has_value());
      CHECK(point->path.filename() == "2GPU_step30.checkpoint");
      CHECK(point->checkpoint.training->step == 30);
    }
    // The newest truncated: reported, and the one with the most steps after it is taken.
    fs::resize_file(dir / "2GPU_step30.checkpoint", fs::file_size(dir / "2GPU_step30.checkpoint") - 4);
    {
      loom::testing::MemoryStream log;
      auto point = loom::train::find_resume_point(flags, loom::Device::cpu(), log.file);
      REQUIRE(point.has_value());
      CHECK(point->path.filename() == "2GPU_1epoch.checkpoint");  // step 25
      const std::string text = log.str();
      CHECK_MESSAGE(text.find("Skipping checkpoint " + (dir / "2GPU_step30.checkpoint").string() +
                              ", it is truncated or corrupt") != std::string::npos,
                    text);
      CHECK_MESSAGE(text.find("trying the previous one") != std::string::npos, text);
    }
    // Another world size's checkpoints are this run's too (elastic resume): the furthest one is taken.
    loom::train::CheckpointWriter(flags, 4).write(loom::train::CheckpointKind::step, 26, checkpoint_at(26));
    CHECK(loom::train::find_resume_point(flags, loom::Device::cpu(), nullptr)->path.filename() ==
          "4GPU_step26.checkpoint");
    flags.resume("none");
    CHECK_FALSE(loom::train::find_resume_point(flags, loom::Device::cpu(), nullptr).has_value());
  }

  TEST_CASE("--resume auto reads checkpoint names of every world size and refuses a newer format version") {
    CHECK(loom::train::is_checkpoint_name("4GPU_step12.checkpoint"));
    CHECK(loom::train::is_checkpoint_name("12GPU_3epoch.checkpoint"));
    CHECK_FALSE(loom::train::is_checkpoint_name("GPU_step1.checkpoint"));
    CHECK_FALSE(loom::train::is_checkpoint_name("2GPU_step.checkpoint"));
    CHECK_FALSE(loom::train::is_checkpoint_name("x2GPU_1epoch.checkpoint"));
    CHECK_FALSE(loom::train::is_checkpoint_name(".2GPU_step1.checkpoint.tmp-abc123"));
    CHECK_FALSE(loom::train::is_checkpoint_name("2GPU_1epoch.checkpoint.bak"));

    loom::testing::TempDir dir;
    loom::train::CheckpointOptions flags = loom::train::CheckpointOptions().directory(dir.path().string()).resume("auto");
    loom::train::CheckpointWriter(flags, 2).write(loom::train::CheckpointKind::step, 5, checkpoint_at(5));
    // What a later loom might write: version 3, with a field this one does not know.
    const fs::path newer = dir / "1GPU_step6.checkpoint";
    loom::nn::save_safetensors(newer, {{"w", loom::Tensor::full({4}, 6.0)}},
                               {{"__training__.format_version", "3"},
                                {"__training__.epoch", "0"},
                                {"__training__.step", "6"},
                                {"__training__.something_new", "1"}});
    const std::string expected = "checkpoint " + newer.string() + " has format version 3, newer than this loom reads (2)";
    CHECK_THROWS_WITH_AS(loom::nn::load_checkpoint(newer), doctest::Contains(expected.c_str()), loom::Error);
    CHECK_THROWS_WITH_AS(loom::train::find_resume_point(flags, loom::Device::cpu(), nullptr), doctest::Contains(expected.c_str()),
                         loom::Error);
    fs::remove(newer);
    CHECK(loom::train::find_resume_point(flags, loom::Device::cpu(), nullptr)->path.filename() == "2GPU_step5.checkpoint");
  }

  TEST_CASE("a checkpoint whose position lies beyond its own schedule is refused, or skipped by --resume auto (#50)") {
    loom::testing::TempDir dir;
    auto flags = loom::train::CheckpointOptions().directory(dir.path().string());
    loom::train::CheckpointWriter writer(flags, 1);
    auto at = [](int64_t epoch, int64_t epoch_step, int64_t step) {
      loom::nn::Checkpoint checkpoint = checkpoint_at(step);
      checkpoint.training->epoch = epoch;
      checkpoint.training->epoch_step = epoch_step;
      checkpoint.training->extra_metadata["epochs"] = "2";  // the run's schedule, as the apps record it
      return checkpoint;
    };
    writer.write(loom::train::CheckpointKind::epoch, 2, at(2, 0, 20));       // the last epoch done: valid
    writer.write(loom::train::CheckpointKind::step, 25, at(2, 5, 25));       // 5 batches into a third epoch of 2
    writer.write(loom::train::CheckpointKind::epoch, 7, at(7, 0, 70));       // epoch 7 of 2
    const fs::path beyond = dir / "1GPU_7epoch.checkpoint";
    const std::string message = [&] {
      try {
        loom::train::find_resume_point(loom::train::CheckpointOptions(flags).resume(beyond.string()),
                                       loom::Device::cpu(), nullptr);
      } catch (const loom::Error& error) {
        return std::string(error.what());
      }
      return std::string("(no error)");
    }();
    CHECK_MESSAGE(message.find("checkpoint " + beyond.string() + ": it records epoch 7 (batch 0), beyond its own "
                               "schedule of 2 epochs") != std::string::npos,
                  message);
    loom::testing::MemoryStream log;
    auto point = loom::train::find_resume_point(loom::train::CheckpointOptions(flags).resume("auto"),
                                                loom::Device::cpu(), log.file);
    REQUIRE(point.has_value());
    CHECK(point->path.filename() == "1GPU_2epoch.checkpoint");
    const std::string text = log.str();
    CHECK_MESSAGE(text.find("Skipping checkpoint " + beyond.string()) != std::string::npos, text);
    CHECK_MESSAGE(text.find("1GPU_step25.checkpoint, it is truncated or corrupt: checkpoint") != std::string::npos,
                  text);
  }

  TEST_CASE("the agreement reads each all-reduce `depth` polls after issuing it, and finish() drains them") {
    using namespace std::chrono_literals;
    auto store = std::make_shared<loom::dist::TCPStore>("127.0.0.1", 0, loom::dist::TCPStoreOptions().is_server(true).timeout(5s));
    auto group = std::make_shared<loom::dist::ProcessGroupGloo>(store, 0, 1, loom::dist::GlooOptions().timeout(5s));
    CHECK(loom::train::StopAgreement(group).depth() == 1);  // a CPU group
    CHECK_THROWS_WITH_AS(loom::train::StopAgreement(group, -1), doctest::Contains("depth must be >= 0"), loom::Error);
    for (int depth : {1, 2, 3}) {
      INFO("depth ", depth);
      loom::train::StopSignals::install(SIGUSR1);
      loom::train::StopAgreement agreement(group, depth);
      CHECK(agreement.depth() == depth);
      for (int i = 0; i < 4; ++i) CHECK(agreement.poll() == 0);
      ::raise(SIGUSR1);
      // This poll issues the flag; `depth` polls later it comes back.
      for (int i = 0; i < depth; ++i) CHECK(agreement.poll() == 0);
      CHECK(agreement.poll() == SIGUSR1);
      agreement.finish();
      agreement.finish();  // nothing left: returns at once
      loom::train::StopSignals::reset();
    }
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGUSR1, SIG_DFL);
  }

  TEST_CASE("a stop signal only sets the flag; without a group the agreement is the local flag") {
    loom::train::StopSignals::install(SIGUSR1);
    loom::train::StopAgreement agreement(nullptr);
    CHECK(agreement.poll() == 0);
    ::raise(SIGUSR1);  // would end the process without the handler
    CHECK(loom::train::StopSignals::received() == SIGUSR1);
    CHECK(agreement.poll() == SIGUSR1);
    loom::train::StopSignals::reset();
    CHECK(loom::train::StopSignals::received() == 0);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGUSR1, SIG_DFL);
  }
}

