// apps/app_common: the device a rank trains on (--device with LOCAL_RANK), the
// rule both apps and the NCCL group's default share; pure, so no GPU needed.
#include <doctest/doctest.h>

#include "apps/app_common.h"
#include "core/error.h"

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
    if (loom::apps::resolve_training_device("auto", 0).is_cpu()) {  // no visible GPU here
      CHECK_THROWS_AS(loom::apps::resolve_training_device("cuda", 0), loom::Error);
      CHECK_THROWS_AS(loom::apps::resolve_training_device("cuda:1", 1), loom::Error);
    }
  }
}
