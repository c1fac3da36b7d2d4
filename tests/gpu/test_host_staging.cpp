// CUDA tensors over gloo and shm (dist/host_staging.h) on a real GPU: 2 and 4
// processes sharing cuda:0 (NCCL would refuse that; the CPU backends do not
// care), DDP on CUDA equal to one process on the combined batch, and
// SyncBatchNorm on CUDA equal to BatchNorm2d on the combined batch, forward
// and backward. Tolerance: 1e-10 relative (expect_close), all in f64; the GPU
// and CPU differ only in summation order. Part of test_gpu_nccl (its main
// starts the ranks and skips without a GPU); written and compiled without a
// GPU, not run yet.
#include <doctest/doctest.h>

#include <loom/core/autograd.h>
#include <loom/dist/host_staging.h>
#include <loom/dist/sync_batch_norm.h>
#include <loom/nn/layers.h>
#include <loom/ops/elementwise.h>
#include "tests/dist/multiprocess.h"
#include "tests/dist/tiny_mlp.h"

using namespace loom;
using namespace loom::dist;
using namespace loom::dist::testing;
using namespace std::chrono_literals;

namespace {

const Device kGpu = Device::cuda(0);  // every rank shares it

// Rows [first, first + count) of a fixed (N, 3, 2, 2) f64 batch, and the
// weights of the loss sum(out * weights) that gives every element its own gradient.
Tensor image_rows(int64_t first, int64_t count, double phase) {
  std::vector<double> values;
  for (int64_t i = first * 12; i < (first + count) * 12; ++i) values.push_back(std::sin(0.7 * i + phase) + 0.1 * i);
  return Tensor::from_vector_as(values, {count, 3, 2, 2}, DType::f64);
}

}  // namespace

LOOM_DIST_SCENARIO("staged_ddp_cuda") {
  auto group = stage_through_host(group_from_environment(30s), kGpu);
  expect(group->device() == kGpu, "the staged group works on ", group->device().str());
  expect_ddp_steps_equal_one_process(group, kGpu);
  group->barrier()->wait();
}

LOOM_DIST_SCENARIO("staged_sync_batch_norm_cuda") {
  auto group = stage_through_host(group_from_environment(30s), kGpu);
  const int rank = group->rank(), world = group->size();
  const int64_t share = 3, first = rank * share, total = share * world;

  auto sync = std::make_shared<SyncBatchNorm>(3, group);
  sync->to(DType::f64);
  sync->to(kGpu);
  Tensor x = image_rows(first, share, 0).to(kGpu).set_requires_grad(true);
  Tensor out = sync->forward(x);
  sum(out * image_rows(first, share, 1).to(kGpu)).backward();

  auto reference = std::make_shared<nn::BatchNorm2d>(3);
  reference->to(DType::f64);
  Tensor whole = image_rows(0, total, 0).set_requires_grad(true);
  Tensor whole_out = reference->forward(whole);
  sum(whole_out * image_rows(0, total, 1)).backward();

  expect_close({{"output", out}}, {{"output", whole_out.slice(0, first, first + share)}}, "forward");
  expect_close({{"input gradient", x.grad()}}, {{"input gradient", whole.grad().slice(0, first, first + share)}},
               "backward");
  expect_close(sync->named_buffers(), reference->named_buffers(), "running statistics");
  // Weight and bias gradients are each rank's own (DDP averages them): their sum is the whole batch's.
  std::vector<Tensor> gradients;
  for (auto& [name, parameter] : sync->named_parameters()) gradients.push_back(parameter.grad());
  group->all_reduce(gradients)->wait();
  expect_close(sync->named_parameters(), reference->named_parameters(), "summed parameter gradients",
               /*gradients=*/true);
  group->barrier()->wait();
}

TEST_SUITE("host_staging") {
  TEST_CASE("DDP and SyncBatchNorm on CUDA over gloo and shm, 2 and 4 ranks on one GPU") {
    for (int world : {2, 4}) {
      for (const char* backend : {"gloo", "shm"}) {
        INFO(backend, " at world ", world);
        const SpawnOptions options{.deadline = 120s, .environment = {{"LOOM_TEST_BACKEND", backend}}};
        expect_all_ok(spawn_ranks("staged_ddp_cuda", world, options));
        expect_all_ok(spawn_ranks("staged_sync_batch_norm_cuda", world, options));
      }
    }
  }
}
