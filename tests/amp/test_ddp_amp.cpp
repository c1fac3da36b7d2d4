// Two ranks (real processes, Gloo on loopback) training an f16 model at O2
// under DDP: f16 gradient buckets are averaged in f16, and when one rank's
// gradient overflows -- an inf forced into it, or a batch too large for f16 --
// both ranks skip that step and halve the scale, because the check reads the
// all-reduced gradients; the replicas stay bit-identical. The same with
// clip_grad_norm between the all-reduce and the step (the Trainer's order):
// every rank computes the same norm of the averaged, unscaled gradients and
// still skips the overflowed steps, and with the SGD over the masters
// sharded by a ZeroRedundancyOptimizer.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include <loom/core/autograd.h>
#include <loom/core/generator.h>
#include <loom/dist/ddp.h>
#include <loom/dist/process_group.h>
#include <loom/dist/zero_redundancy_optimizer.h>
#include <loom/nn/layers.h>
#include <loom/ops/loss.h>
#include <loom/optim/amp.h>
#include <loom/optim/clip_grad.h>
#include "tests/amp/helpers.h"
#include "tests/dist/multiprocess.h"

using namespace loom;
using namespace loom::dist::testing;
using namespace std::chrono_literals;

namespace {

constexpr int kSteps = 6;
constexpr int kForcedInfStep = 2;   // rank 1 writes an inf into a gradient
constexpr int kLargeInputStep = 4;  // rank 1's batch is scaled to 3e4: f16 overflows

bool all_finite(const Tensor& t) {
  for (double v : t.to_vector<double>())
    if (!std::isfinite(v)) return false;
  return true;
}

// All masters of this rank, flattened; and the same gathered from every rank.
Tensor flat_masters(const amp::MixedPrecisionOptimizer& optimizer) {
  int64_t total = 0;
  for (const Tensor& m : optimizer.master_weights()->masters()) total += m.numel();
  Tensor flat = Tensor::empty({total});
  int64_t offset = 0;
  for (const Tensor& m : optimizer.master_weights()->masters()) {
    make_view(flat, {m.numel()}, {1}, offset).copy_(m.reshape({-1}));
    offset += m.numel();
  }
  return flat;
}

// max_norm for the clipping variant: below the gradients' norm, so it clips.
constexpr double kMaxNorm = 0.05;

// `zero`: the SGD over the masters is sharded (ZeroRedundancyOptimizer), so
// a rank that stepped alone would wait for the others' broadcasts.
void overflow_skip(bool clip, bool zero) {
  auto group = dist::init_process_group(dist::InitOptions().init_method("env://").timeout(20s));
  const int rank = group->rank(), world = group->size();
  manual_seed(7 + rank);  // different weights until DDP broadcasts rank 0's
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 16), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(16, 4)});
  const amp::OptimizerFactory sgd = amp_test::sgd(0.1);
  const amp::OptimizerFactory sharded_sgd = [&](std::vector<Tensor> masters) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<dist::ZeroRedundancyOptimizer>(std::move(masters), group, sgd);
  };
  auto optimizer = amp::initialize(*model, zero ? sharded_sgd : sgd, amp::OptLevel::O2,
                                   optim::GradScalerOptions().init_scale(1024));
  if (zero) {
    auto& sharded = dynamic_cast<dist::ZeroRedundancyOptimizer&>(optimizer->optimizer());
    expect(sharded.group_params(0)[0].is_same(optimizer->master_weights()->masters()[0]) &&
               sharded.shard(0).size() + sharded.shard(1).size() == 4,
           "ZeRO is not over the 4 f32 masters");
  }

  // Hooks registered before DDP's run before its reduction: they see (and may
  // poison) this rank's own gradient.
  int step = 0;
  std::vector<bool> locally_finite(kSteps, true);
  for (auto& [name, parameter] : model->named_parameters()) {
    Tensor handle = parameter;
    handle.register_post_accumulate_grad_hook([&, name = name](Tensor& p) {
      if (rank == 1 && step == kForcedInfStep && name == "0.weight") {
        make_view(p.mutable_grad(), {1}, {1}, 3).fill_(std::numeric_limits<double>::infinity());
      }
      locally_finite[step] = locally_finite[step] && all_finite(p.grad());
    });
  }
  dist::DistributedDataParallel ddp(
      model, group, dist::DistributedDataParallelOptions().first_bucket_bytes_cap(64).bucket_bytes_cap(256));
  expect(ddp.bucket_parameter_names().size() >= 2, "expected several buckets");

  std::vector<bool> stepped;
  for (step = 0; step < kSteps; ++step) {
    Generator generator(1000 * static_cast<uint64_t>(step) + static_cast<uint64_t>(rank));
    Tensor x = Tensor::empty({4, 6});
    generator.normal_(x, 0.0, 1.0);
    if (rank == 1 && step == kLargeInputStep) x.mul_(3e4);
    std::vector<int64_t> label_values;
    for (int i = 0; i < 4; ++i) label_values.push_back(static_cast<int64_t>(generator.below(4)));
    Tensor labels = Tensor::from_vector(label_values, {4});
    Tensor loss;
    {
      auto autocast = optimizer->autocast();
      loss = cross_entropy(ddp(x.to(DType::f16)), labels);
    }
    optimizer->zero_grad();
    optimizer->scale_loss(loss).backward();
    ddp.wait_for_gradients();
    for (auto& [name, parameter] : model->named_parameters())
      expect(parameter.grad().dtype() == DType::f16, "gradient of ", name, " is ", parameter.grad().str(), ", not f16");
    if (clip) {
      const double norm = optimizer->clip_grad_norm(kMaxNorm);
      const bool overflow = step == kForcedInfStep || step == kLargeInputStep;
      expect(std::isfinite(norm) != overflow, "rank ", rank, " step ", step, ": total norm ", norm);
      Tensor norms = Tensor::zeros({world}, DType::f64);
      group->all_gather_into(norms, Tensor::full({1}, norm, DType::f64))->wait();
      const std::vector<double> all = norms.to_vector<double>();
      expect(std::isnan(all[0]) ? std::isnan(all[1]) : all[0] == all[1], "step ", step, ": the ranks' norms differ");
      if (!overflow) {
        expect(norm > kMaxNorm, "step ", step, ": norm ", norm, " was not clipped; the test shows nothing");
        const double clipped = optim::get_total_norm(optimizer->stepped_parameters());
        expect(clipped <= kMaxNorm * (1 + 1e-5), "step ", step, ": clipped norm ", clipped);
      }
    }
    optimizer->step();
    stepped.push_back(!optimizer->last_step_skipped());
  }

  const std::vector<bool> expected = {true, true, false, true, false, true};
  expect(stepped == expected, "rank ", rank, ": the steps taken differ from the expected skip pattern");
  expect(optimizer->scaler().get_scale() == 256.0, "rank ", rank, ": scale ", optimizer->scaler().get_scale(),
         ", expected 1024 halved twice");
  expect(optimizer->scaler().skipped_steps() == 2, "rank ", rank, ": skipped ", optimizer->scaler().skipped_steps());
  if (rank == 0) {
    // Rank 0's own gradients were finite: it skipped because of rank 1's.
    expect(locally_finite[kForcedInfStep] && locally_finite[kLargeInputStep],
           "rank 0's local gradients were not finite; the test does not show what it should");
  } else {
    expect(!locally_finite[kForcedInfStep] && !locally_finite[kLargeInputStep], "rank 1 did not overflow");
  }

  // Bit-identical masters and f16 weights on both ranks.
  Tensor mine = flat_masters(*optimizer);
  Tensor everyone = Tensor::zeros({world * mine.numel()});
  group->all_gather_into(everyone, mine)->wait();
  std::vector<float> all = everyone.to_vector<float>();
  for (int64_t i = 0; i < mine.numel(); ++i)
    expect(all[static_cast<size_t>(i)] == all[static_cast<size_t>(mine.numel() + i)], "master ", i, " differs between ranks");
  for (auto& [name, parameter] : model->named_parameters()) {
    Tensor gathered = Tensor::zeros({world * parameter.numel()}, parameter.dtype());
    group->all_gather_into(gathered, parameter.reshape({-1}).contiguous())->wait();
    std::vector<float> values = gathered.to_vector<float>();
    for (int64_t i = 0; i < parameter.numel(); ++i)
      expect(values[static_cast<size_t>(i)] == values[static_cast<size_t>(parameter.numel() + i)], name, "[", i,
             "] differs between ranks");
  }
  group->barrier()->wait();
}

}  // namespace

LOOM_DIST_SCENARIO("amp_overflow_skip") { overflow_skip(false, false); }
LOOM_DIST_SCENARIO("amp_clip_overflow_skip") { overflow_skip(true, false); }
LOOM_DIST_SCENARIO("amp_zero_overflow_skip") { overflow_skip(true, true); }

TEST_SUITE("ddp") {
  TEST_CASE("an overflow on one rank makes both ranks skip the same steps") {
    for (const RankResult& result : spawn_ranks("amp_overflow_skip", 2, {.deadline = std::chrono::seconds(60)}))
      CHECK_MESSAGE(result.ok(), result.describe());
  }

  TEST_CASE("with clip_grad_norm too: the same norm on both ranks, the same steps skipped") {
    for (const RankResult& result : spawn_ranks("amp_clip_overflow_skip", 2, {.deadline = std::chrono::seconds(60)}))
      CHECK_MESSAGE(result.ok(), result.describe());
  }

  TEST_CASE("with the masters' SGD sharded (ZeRO) and clip_grad_norm: the same steps skipped on both ranks") {
    for (const RankResult& result : spawn_ranks("amp_zero_overflow_skip", 2, {.deadline = std::chrono::seconds(60)}))
      CHECK_MESSAGE(result.ok(), result.describe());
  }
}
