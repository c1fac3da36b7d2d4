// apps/app_common: the device a rank trains on (--device with LOCAL_RANK), the
// rule both apps and the NCCL group's default share; pure, so no GPU needed.
#include <doctest/doctest.h>

#include "apps/app_common.h"
#include <loom/core/error.h>

using loom::Device;
using loom::apps::training_device;

TEST_SUITE("app_common") {
  TEST_CASE("cpu and cuda:N are taken as given on every local rank") {
    for (int local_rank : {0, 1, 3}) {
      CHECK(training_device("cpu", local_rank, 0) == Device::cpu());
      CHECK(training_device("cpu", local_rank, 4) == Device::cpu());
      CHECK(training_device("cuda:0", local_rank, 4) == Device::cuda(0));
      CHECK(training_device("cuda:2", local_rank, 4) == Device::cuda(2));
    }
  }

  TEST_CASE("cuda and auto pick the local rank's GPU, modulo the visible ones") {
    CHECK(training_device("cuda", 0, 4) == Device::cuda(0));
    CHECK(training_device("cuda", 1, 4) == Device::cuda(1));
    CHECK(training_device("cuda", 3, 4) == Device::cuda(3));
    CHECK(training_device("auto", 2, 4) == Device::cuda(2));
    // One GPU shown per rank (CUDA_VISIBLE_DEVICES per task): cuda:0.
    CHECK(training_device("cuda", 5, 1) == Device::cuda(0));
    CHECK(training_device("auto", 5, 1) == Device::cuda(0));
    CHECK(training_device("cuda", 5, 2) == Device::cuda(1));
  }

  TEST_CASE("auto without a GPU is the CPU; cuda without one is left to the device check") {
    CHECK(training_device("auto", 0, 0) == Device::cpu());
    CHECK(training_device("auto", 3, 0) == Device::cpu());
    CHECK(training_device("cuda", 1, 0).is_cuda());
  }

  TEST_CASE("resolve_training_device names what is missing") {
    CHECK(loom::apps::resolve_training_device("cpu", 1) == Device::cpu());
    CHECK_THROWS_AS(training_device("gpu", 0, 1), loom::Error);
    // An index past int's range (found by fuzz_device_flag: std::stoi threw out_of_range).
    CHECK_THROWS_WITH_AS(training_device("cuda:10111111111111111110", 0, 1),
                         doctest::Contains("the GPU index is out of range"), loom::Error);
    if (loom::apps::resolve_training_device("auto", 0).is_cpu()) {  // no visible GPU here
      CHECK_THROWS_AS(loom::apps::resolve_training_device("cuda", 0), loom::Error);
      CHECK_THROWS_AS(loom::apps::resolve_training_device("cuda:1", 1), loom::Error);
    }
  }
}

// apps/training: the flags both apps share and the choices made from them.
#include <CLI/CLI.hpp>

#include <algorithm>

#include "apps/training.h"

TEST_SUITE("training") {
  TEST_CASE("the common flags parse, with one check each") {
    CLI::App app;
    loom::apps::argparse_option_rules(app);  // a repeated option takes its last value
    loom::apps::CommonFlags flags;
    loom::apps::add_common_flags(app, flags);
    std::vector<std::string> arguments = {"--workers", "7", "--threads", "3", "--threads", "2", "--amp", "O2",
                                          "--backend", "gloo"};
    std::reverse(arguments.begin(), arguments.end());  // parse(vector) takes them last to first
    app.parse(arguments);
    CHECK(flags.amp == "O2");
    CHECK(flags.backend == "gloo");
    CHECK(flags.threads == 2);
    CHECK(flags.workers == 7);
    auto error_of = [](std::vector<std::string> arguments) -> std::string {
      CLI::App app;
      loom::apps::CommonFlags flags;
      loom::apps::add_common_flags(app, flags);
      std::reverse(arguments.begin(), arguments.end());  // parse(vector) takes them last to first
      try {
        app.parse(arguments);
      } catch (const CLI::ParseError& e) {
        return e.what();
      }
      return "";
    };
    CHECK(error_of({"--workers", "-1"}).find("--workers: must be a whole number >= 0, got '-1'") != std::string::npos);
    CHECK(error_of({"--threads", "two"}).find("--threads: 'two' is not a whole number") != std::string::npos);
    CHECK(error_of({"--log-interval", "0"}).find("--log-interval: must be a whole number >= 1") != std::string::npos);
    CHECK(error_of({"--amp", "O4"}).find("--amp") != std::string::npos);
    CHECK(error_of({"--backend", "mpi"}).find("--backend") != std::string::npos);
    CHECK(error_of({"--timeout", "-5"}).find("--timeout: must be a number >= 0") != std::string::npos);
    CHECK(error_of({"--device", "cuda:1", "--seed", "3", "--sync-bn"}).empty());
  }

  TEST_CASE("backend auto is nccl on CUDA, the group's own choice on the CPU; nccl for CPU training is refused") {
    CHECK(loom::apps::choose_backend("auto", Device::cpu()) == "auto");
    CHECK(loom::apps::choose_backend("gloo", Device::cpu()) == "gloo");
    CHECK(loom::apps::choose_backend("shm", Device::cpu()) == "shm");
    CHECK_THROWS_WITH_AS(loom::apps::choose_backend("nccl", Device::cpu()), doctest::Contains("nccl"), loom::Error);
  }

  TEST_CASE("the loaders deliver --amp's input dtype on the training device, pinned only for CUDA") {
    loom::apps::CommonFlags flags;
    flags.workers = 3;
    flags.seed = 9;
    const loom::data::DataLoaderOptions f32 = loom::apps::loader_options(flags, 64, Device::cpu());
    CHECK(f32.batch_size() == 64);
    CHECK(f32.num_workers() == 3);
    CHECK(f32.dtype() == loom::DType::f32);
    CHECK(f32.device() == Device::cpu());
    CHECK_FALSE(f32.pin_memory());
    flags.amp = "O2";
    CHECK(loom::apps::loader_options(flags, 64, Device::cpu()).dtype() == loom::DType::f16);
    flags.amp = "bf16";
    CHECK(loom::apps::loader_options(flags, 64, Device::cpu()).dtype() == loom::DType::bf16);
  }
}
