// CUDA tensors over gloo and shm (dist/host_staging.h) on a real GPU: 2 and 4
// processes sharing cuda:0 (NCCL would refuse that; the CPU backends do not
// care), DDP on CUDA equal to one process on the combined batch with bucket
// timings that show the all-reduces overlapping backward, SyncBatchNorm on
// CUDA equal to BatchNorm2d on the combined batch, forward and backward, and
// a Trainer run on CUDA at world 2, checkpointed and resumed, ending bit for
// bit where an uninterrupted run ends. Tolerance: 1e-10 relative
// (expect_close), all in f64; the GPU and CPU differ only in summation order.
// Part of test_gpu_nccl (its main starts the ranks and skips without a GPU);
// written and compiled without a GPU, not run yet.
#include <doctest/doctest.h>

#include <filesystem>

#include <loom/core/autograd.h>
#include <loom/core/generator.h>
#include <loom/data/loader.h>
#include <loom/data/sampler.h>
#include <loom/dist/host_staging.h>
#include <loom/dist/sync_batch_norm.h>
#include <loom/nn/layers.h>
#include <loom/ops/elementwise.h>
#include <loom/optim/amp.h>
#include <loom/optim/lr_scheduler.h>
#include <loom/optim/optimizer.h>
#include <loom/train/trainer.h>
#include "tests/dist/multiprocess.h"
#include "tests/dist/tiny_mlp.h"
#include "tests/support/temp_dir.h"
#include "tests/train/signs.h"

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

// Caps that put each of the MLP's four f64 parameters in a bucket of its own
// (2.bias 24 B, 2.weight 120 B, 0.bias 40 B, 0.weight 240 B).
DistributedDataParallelOptions four_buckets() {
  return DistributedDataParallelOptions().first_bucket_bytes_cap(64).bucket_bytes_cap(128);
}

// The last backward's bucket timings show the all-reduces overlapping it: the
// first bucket (the last layer's gradients, ready first) went to the group
// before the last bucket's gradients existed, so backward was still running;
// and every bucket's collective started and finished, in order.
void expect_buckets_overlap_backward(DistributedDataParallel& ddp) {
  const IterationTiming iteration = ddp.last_iteration_timing();
  expect(iteration.buckets.size() == 4, "expected 4 buckets, got ", iteration.buckets.size());
  const BucketTiming& first = iteration.buckets.front();
  const BucketTiming& last = iteration.buckets.back();
  expect(first.launched < last.ready, "bucket 0's all-reduce was launched only after the last bucket was ready: ",
         "the all-reduces did not overlap backward");
  expect(first.launched < iteration.backward_end, "bucket 0's all-reduce was launched after backward ended");
  for (const BucketTiming& bucket : ddp.bucket_timings()) {
    expect(bucket.done != std::chrono::steady_clock::time_point{}, "bucket ", bucket.bucket, " has no done time");
    expect(bucket.ready <= bucket.launched && bucket.launched <= bucket.started && bucket.started <= bucket.done,
           "bucket ", bucket.bucket, " timestamps out of order");
  }
}

// A linear classifier of Signs (tests/train/signs.h) on kGpu, initialised
// from `seed`, with SGD (momentum), a halving LR schedule per epoch and rank
// `rank`'s shard of `world` in batches of 8 (13 per epoch).
struct CudaRun {
  std::shared_ptr<nn::Module> model;
  std::shared_ptr<amp::MixedPrecisionOptimizer> optimizer;
  std::shared_ptr<optim::LRScheduler> schedule;
  data::DataLoader loader;
};

CudaRun make_cuda_run(uint64_t seed, int world, int rank) {
  using loom::train::testing::Signs;
  manual_seed(seed);
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(4, 3)});
  model->to(kGpu);
  std::shared_ptr<amp::MixedPrecisionOptimizer> optimizer = amp::initialize(
      *model,
      [](std::vector<Tensor> parameters) -> std::unique_ptr<optim::Optimizer> {
        return std::make_unique<optim::SGD>(std::move(parameters), optim::SGDOptions(0.2).momentum(0.9));
      },
      amp::OptLevel::O0);
  auto schedule = std::make_shared<optim::StepLR>(optimizer->optimizer(), 1, 0.5);
  data::DataLoader loader(std::make_shared<Signs>(), data::DataLoaderOptions().batch_size(8).device(kGpu),
                          std::make_shared<data::DistributedSampler>(Signs::kSize, world, rank, /*shuffle=*/true, 4));
  return {model, optimizer, schedule, std::move(loader)};
}

std::vector<float> values_of(nn::Module& model) {
  std::vector<float> values;
  for (const Tensor& parameter : model.parameters()) {
    for (float v : parameter.to(Device::cpu()).contiguous().to_vector<float>()) values.push_back(v);
  }
  return values;
}

}  // namespace

LOOM_DIST_SCENARIO("staged_ddp_cuda") {
  auto group = stage_through_host(group_from_environment(30s), kGpu);
  expect(group->device() == kGpu, "the staged group works on ", group->device().str());
  expect_ddp_steps_equal_one_process(group, kGpu, four_buckets(), expect_buckets_overlap_backward);
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

// Two epochs (26 steps) on CUDA at world 2 straight, then the same run cut at
// step 18 with a checkpoint every 4 steps, resumed into a model initialised
// otherwise: from the newest checkpoint (step 16, 3 steps into the second
// epoch: parameters, momentum, the schedule's position, the sample order) it
// ends bit for bit where the straight run ended. (The same kernels on the
// same GPU in the same order: nothing in this model sums with atomics.)
LOOM_DIST_SCENARIO("staged_resume_cuda") {
  auto group = stage_through_host(group_from_environment(30s), kGpu);
  const int rank = group->rank(), world = group->size();
  const std::filesystem::path directory = env_string("LOOM_TEST_CHECKPOINT_DIR");
  auto options = [&] { return train::TrainerOptions().epochs(2).log_interval(1000).stop_signal(0).process_group(group); };

  CudaRun straight = make_cuda_run(11, world, rank);
  train::Trainer whole(straight.model, straight.optimizer, options());
  whole.scheduler(straight.schedule);
  const int64_t all_steps = whole.fit(straight.loader).steps;
  expect(all_steps == 26, "the straight run took ", all_steps, " steps, expected 26");
  const std::vector<float> expected = values_of(*straight.model);

  const auto checkpoints = train::CheckpointOptions().directory(directory.string()).resume("auto").every_steps(4);
  {
    CudaRun cut = make_cuda_run(11, world, rank);
    train::Trainer first(cut.model, cut.optimizer, options().checkpoints(checkpoints).max_steps(18));
    first.scheduler(cut.schedule);
    const int64_t steps = first.fit(cut.loader).steps;
    expect(steps == 18, "the cut run took ", steps, " steps, expected 18");
  }
  expect(std::filesystem::exists(directory / "2GPU_step16.checkpoint"), "no 2GPU_step16.checkpoint in ", directory);

  CudaRun again = make_cuda_run(999, world, rank);  // only the checkpoint can make it equal
  int64_t first_step = -1;
  train::Trainer resumed(again.model, again.optimizer, options().checkpoints(checkpoints));
  resumed.scheduler(again.schedule);
  resumed.on_step([&](const train::StepInfo& step) {
    if (first_step < 0) first_step = step.step;
  });
  const int64_t steps = resumed.fit(again.loader).steps;
  expect(first_step == 17 && steps == 26, "rank ", rank, ": resumed at step ", first_step, " and ended at ", steps,
         "; expected 17 and 26");
  const std::vector<float> actual = values_of(*again.model);
  expect(actual.size() == expected.size(), "rank ", rank, ": ", actual.size(), " parameters vs ", expected.size());
  for (size_t i = 0; i < actual.size(); ++i)
    expect(actual[i] == expected[i], "rank ", rank, ": parameter value ", i, " is ", actual[i],
           " after the resume, ", expected[i], " after the straight run (expected bit for bit)");
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

  TEST_CASE("a CUDA run over gloo and shm checkpointed at world 2 resumes exactly") {
    for (const char* backend : {"gloo", "shm"}) {
      INFO(backend);
      loom::testing::TempDir checkpoints;  // one per backend: --resume auto would take the other's
      const SpawnOptions options{.deadline = 120s,
                                 .environment = {{"LOOM_TEST_BACKEND", backend},
                                                 {"LOOM_TEST_CHECKPOINT_DIR", checkpoints.path().string()}}};
      expect_all_ok(spawn_ranks("staged_resume_cuda", 2, options));
    }
  }
}
