// CUDA device ordinals on a real machine: one beyond the visible devices is a
// one-line error naming it, and cuda:1 (a device other than the default one)
// computes where two GPUs are visible; with one GPU that part says it is
// skipped and why.
#include <doctest/doctest.h>

#include <cstdlib>

#include <loom/core/cuda/runtime.h>
#include <loom/core/error.h>
#include <loom/ops/elementwise.h>
#include "tests/gpu/compare.h"

using namespace loom;
using namespace loom::gpu_testing;

TEST_SUITE("device_ordinal") {

TEST_CASE("an ordinal beyond the visible devices names it and CUDA_VISIBLE_DEVICES") {
  const int count = cuda::device_count();
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string expected = cuda::device_ordinal_error(count, count, visible);
  CHECK(expected.rfind(str("cuda:", count, " requested but only ", count, " CUDA device"), 0) == 0);
  const int before = cuda::current_device();
  CHECK_THROWS_WITH_AS(cuda::set_device(count), expected.c_str(), Error);
  CHECK(cuda::current_device() == before);
}

TEST_CASE("cuda:1 computes where two GPUs are visible") {
  const int count = cuda::device_count();
  if (count < 2) {
    MESSAGE("skipped: cuda:1 needs two visible GPUs; ", count, " visible");
    return;
  }
  const int before = cuda::current_device();
  const Device second = Device::cuda(1);
  const Tensor host = random_cpu({64, 33}, 7, DType::f32, -4, 4);
  Tensor device = host.to(second);
  CHECK(device.device() == second);
  CHECK(cuda::memory_stats(1).allocated_bytes > 0);
  device.mul_(2.0);
  device.add_(host.to(second), 0.5);
  Tensor expected = host.clone();
  expected.mul_(2.5);
  check_close(device.to(Device::cpu()), expected, 1e-6, "2 x + 0.5 x on cuda:1");
  // Between devices, both ways.
  check_close(device.to(Device::cuda(0)).to(second).to(Device::cpu()), expected, 0, "cuda:1 -> cuda:0 -> cuda:1");
  CHECK(cuda::current_device() == before);  // work on cuda:1 left the thread's device alone
}

}  // TEST_SUITE
