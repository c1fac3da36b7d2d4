// The error for a CUDA device ordinal beyond the visible devices, with the
// device count and CUDA_VISIBLE_DEVICES injected (no GPU needed).
#include <doctest/doctest.h>

#include <loom/core/cuda/runtime.h>

using loom::cuda::device_ordinal_error;

TEST_SUITE("device_ordinal") {
  TEST_CASE("a visible ordinal is no error") {
    CHECK(device_ordinal_error(0, 1, nullptr).empty());
    CHECK(device_ordinal_error(3, 4, "4,5,6,7").empty());
  }

  TEST_CASE("an ordinal beyond the visible devices names it, the count and CUDA_VISIBLE_DEVICES") {
    CHECK(device_ordinal_error(3, 1, "0") ==
          "cuda:3 requested but only 1 CUDA device is visible (CUDA_VISIBLE_DEVICES=0); the one visible is cuda:0");
    CHECK(device_ordinal_error(1, 1, nullptr) ==
          "cuda:1 requested but only 1 CUDA device is visible (CUDA_VISIBLE_DEVICES is not set); the one visible "
          "is cuda:0");
    CHECK(device_ordinal_error(2, 2, "2,3") ==
          "cuda:2 requested but only 2 CUDA devices are visible (CUDA_VISIBLE_DEVICES=2,3); the visible ones are "
          "cuda:0 to cuda:1");
    CHECK(device_ordinal_error(0, 0, "") ==
          "cuda:0 requested but no CUDA device is visible (CUDA_VISIBLE_DEVICES=); use --device cpu");
  }

  TEST_CASE("a negative ordinal is named as such") {
    CHECK(device_ordinal_error(-1, 2, nullptr) ==
          "cuda:-1 is not a CUDA device: ordinals start at 0 (CUDA_VISIBLE_DEVICES is not set); the visible ones "
          "are cuda:0 to cuda:1");
  }
}
