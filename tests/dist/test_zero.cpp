// ZeroRedundancyOptimizer (ZeRO stage 1) against the unsharded optimizer.
// PyTorch's partition, computed by hand; a world of one and the errors; and
// at worlds 2 and 3 (real processes, gloo on loopback) a small MLP under DDP
// stepped by SGD (momentum, weight decay) and by AdamW, each rank also
// stepping an unsharded copy on the same averaged gradients: the parameters
// equal the copy's after every step, exactly (tolerance 0: the local
// optimizer does the same arithmetic on the same values, and the broadcasts
// copy bits), a parameter without a gradient included; each rank's local
// state holds its shard only and the shards add up to the unsharded state;
// the state consolidated on rank 0 is the unsharded optimizer's, name for
// name and bit for bit; and a checkpoint of it, loaded by every rank, goes on
// as the unsharded optimizer does.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <loom/core/autograd.h>
#include <loom/core/generator.h>
#include <loom/dist/ddp.h>
#include <loom/dist/zero_redundancy_optimizer.h>
#include <loom/nn/checkpoint.h>
#include <loom/nn/layers.h>
#include "tests/dist/multiprocess.h"
#include "tests/dist/tiny_mlp.h"
#include "tests/support/temp_dir.h"

using namespace loom;
using namespace loom::dist;
using namespace loom::dist::testing;
using namespace std::chrono_literals;

namespace {

// A (6 -> 8 -> 8 -> 3) f32 MLP; its parameters have 48, 8, 64, 8, 24 and 3 elements.
std::shared_ptr<nn::Module> mlp(uint64_t seed) {
  manual_seed(seed);
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 8), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(8, 8),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(8, 3)});
  return model;
}

// PyTorch's sorted-greedy partition of those sizes, by hand: largest first,
// each to the rank with the fewest elements so far (the lowest on a tie).
//   world 2: 64 -> r0, 48 -> r1, 24 -> r1 (72), 8 -> r0 (72), 8 -> r0 (tie: 80), 3 -> r1 (75)
//   world 3: 64 -> r0, 48 -> r1, then 24, 8, 8, 3 -> r2 (43)
const std::map<int, std::vector<std::vector<size_t>>> kMlpShards = {
    {1, {{0, 1, 2, 3, 4, 5}}}, {2, {{1, 2, 3}, {0, 4, 5}}}, {3, {{2}, {0}, {1, 3, 4, 5}}}};

// The unsharded optimizer of a scenario, and the local one ZeRO builds: SGD
// with momentum and weight decay, or AdamW.
std::unique_ptr<optim::Optimizer> make_optimizer(const std::string& kind, std::vector<Tensor> parameters) {
  if (kind == "sgd")
    return std::make_unique<optim::SGD>(std::move(parameters), optim::SGDOptions(0.05).momentum(0.9).weight_decay(0.01));
  return std::make_unique<optim::AdamW>(std::move(parameters), optim::AdamWOptions(0.01).weight_decay(0.1));
}

std::unique_ptr<ZeroRedundancyOptimizer> make_zero(const std::string& kind, std::vector<Tensor> parameters,
                                                   const std::shared_ptr<ProcessGroup>& group) {
  // SGD through the options constructor, AdamW through a factory: both ways users write it.
  if (kind == "sgd")
    return std::make_unique<ZeroRedundancyOptimizer>(std::move(parameters), group,
                                                     optim::SGDOptions(0.05).momentum(0.9).weight_decay(0.01));
  return std::make_unique<ZeroRedundancyOptimizer>(
      std::move(parameters), group, [&](std::vector<Tensor> shard) { return make_optimizer(kind, std::move(shard)); });
}

// The same names, dtypes, shapes and bits.
void expect_same(const nn::NamedTensors& actual, const nn::NamedTensors& expected, const std::string& what) {
  expect(actual.size() == expected.size(), what, ": ", actual.size(), " tensors, expected ", expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    const Tensor a = actual[i].second.to(Device::cpu()).contiguous();
    const Tensor b = expected[i].second.to(Device::cpu()).contiguous();
    expect(actual[i].first == expected[i].first, what, ": tensor ", i, " is '", actual[i].first, "', expected '",
           expected[i].first, "'");
    expect(a.dtype() == b.dtype() && a.sizes() == b.sizes(), what, ": '", actual[i].first, "' is ", a.str(),
           ", expected ", b.str());
    expect(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0, what, ": '", actual[i].first,
           "' differs from the unsharded optimizer's");
  }
}

int64_t elements(const nn::NamedTensors& tensors) {
  int64_t total = 0;
  for (const auto& entry : tensors) total += entry.second.numel();
  return total;
}

// Rank `rank`'s two rows of step `step` (DDP averages the ranks' gradients).
Tensor step_loss(nn::Module& model, int rank, int step) {
  const int64_t first = 2 * rank + 5 * step;
  return mse(model(inputs(first, 2).to(DType::f32)), targets(first, 2).to(DType::f32));
}

// One step of both: DDP's averaged gradients, with `gradless` left without a
// gradient, handed to the unsharded `reference` too; then both step.
void step_both(DistributedDataParallel& ddp, ZeroRedundancyOptimizer& zero, optim::Optimizer& reference, int rank,
               int step, const std::string& gradless) {
  zero.zero_grad();
  step_loss(ddp, rank, step).backward();
  const nn::NamedTensors parameters = ddp.module().named_parameters();
  const std::vector<Tensor>& copies = reference.group_params(0);
  for (size_t i = 0; i < parameters.size(); ++i) {
    Tensor parameter = parameters[i].second, copy = copies[i];
    if (parameters[i].first == gradless) parameter.set_grad(Tensor());
    copy.set_grad(parameter.grad().defined() ? parameter.grad().clone() : Tensor());
  }
  zero.step();
  reference.step();
}

// LOOM_TEST_OPTIMIZER (sgd or adamw), LOOM_TEST_DIR for the checkpoint.
void zero_equals_unsharded() {
  auto group = group_from_environment(20s);
  const int rank = group->rank(), world = group->size();
  const std::string kind = env_string("LOOM_TEST_OPTIMIZER");
  auto model = mlp(40 + rank);  // different until DDP broadcasts rank 0's
  DistributedDataParallel ddp(model, group);
  auto reference_model = mlp(40);  // rank 0's initial weights
  std::unique_ptr<ZeroRedundancyOptimizer> zero = make_zero(kind, model->parameters(), group);
  std::unique_ptr<optim::Optimizer> reference = make_optimizer(kind, reference_model->parameters());

  for (int r = 0; r < world; ++r) expect(zero->shard(r) == kMlpShards.at(world)[r], "rank ", r, "'s shard");
  zero->consolidate_state_dict(0);  // before any step: every rank's part is empty
  if (rank == 0) expect(zero->state().empty() && reference->state().empty(), "a state before the first step");
  // "4.bias" (rank 1's at world 2, rank 2's at world 3) has no gradient in the
  // first two steps, so no state either; "0.bias" none in step 3.
  for (int step = 0; step < 2; ++step) {
    step_both(ddp, *zero, *reference, rank, step, "4.bias");
    expect_same(model->named_parameters(), reference_model->named_parameters(), str("parameters after step ", step));
  }
  zero->consolidate_state_dict(0);
  if (rank == 0) {
    expect(reference->state().size() == (kind == "sgd" ? 5u : 15u), "the unsharded state lacks 4.bias's entries");
    expect_same(zero->state(), reference->state(), "the state consolidated after step 1");
  }
  for (int step = 2; step < 5; ++step) {
    step_both(ddp, *zero, *reference, rank, step, step == 3 ? "0.bias" : "");
    expect_same(model->named_parameters(), reference_model->named_parameters(), str("parameters after step ", step));
  }

  // Sharding: the local state covers this rank's shard only, all of it,
  // and the shards' states add up to the unsharded one.
  const nn::NamedTensors local = zero->local_optimizer().state();
  const std::vector<Tensor> all = model->parameters();
  int64_t shard_elements = 0;
  for (size_t index : zero->shard(rank)) shard_elements += all[index].numel();
  const int64_t per_element = kind == "sgd" ? 1 : 2;  // momentum; or exp_avg and exp_avg_sq (and a step scalar)
  const int64_t scalars = kind == "sgd" ? 0 : static_cast<int64_t>(zero->shard(rank).size());
  expect(elements(local) == per_element * shard_elements + scalars, "rank ", rank, "'s local state has ",
         elements(local), " elements, its shard's is ", per_element * shard_elements + scalars);
  Tensor total = Tensor::full({1}, static_cast<double>(elements(local)), DType::i64);
  group->all_reduce(total)->wait();
  expect(total.item() == static_cast<double>(elements(reference->state())), "the shards' states have ", total.item(),
         " elements, the unsharded optimizer's ", elements(reference->state()));

  // Consolidated: rank 0 holds the unsharded state; the others refuse.
  zero->consolidate_state_dict(0);
  zero->consolidate_state_dict(0);  // nothing changed: returns at once on every rank
  if (rank == 0) {
    expect_same(zero->state(), reference->state(), "the consolidated state");
  } else {
    const std::string error = error_of([&] { zero->state(); });
    expect(contains(error, str("call consolidate_state_dict(", rank, ") on every rank first")), error);
  }

  // A checkpoint of it, loaded by every rank into a new ZeRO over a new
  // model, goes on as the unsharded optimizer does.
  const std::filesystem::path path = std::filesystem::path(env_string("LOOM_TEST_DIR")) / "zero.checkpoint";
  if (rank == 0) {
    nn::TrainingState state;
    state.optimizer = zero->state();
    nn::save_checkpoint(path, {model->state_dict(), state});
  }
  group->barrier()->wait();
  const nn::Checkpoint checkpoint = nn::load_checkpoint(path);
  auto resumed_model = mlp(70);
  nn::load_model_state(*resumed_model, checkpoint.model, "the checkpoint");
  DistributedDataParallel resumed_ddp(resumed_model, group);
  std::unique_ptr<ZeroRedundancyOptimizer> resumed = make_zero(kind, resumed_model->parameters(), group);
  resumed->load_state(checkpoint.training->optimizer);
  for (int step = 5; step < 8; ++step) {
    step_both(resumed_ddp, *resumed, *reference, rank, step, "");
    expect_same(resumed_model->named_parameters(), reference_model->named_parameters(),
                str("resumed parameters after step ", step));
  }
  const std::string stale = error_of([&] { resumed->state(); });
  expect(contains(stale, "was not consolidated on this rank since the last step"), stale);
  group->barrier()->wait();
}

// Rank 1 leaves out the last parameter: every rank refuses, naming both lists.
void zero_mismatched_parameters() {
  auto group = group_from_environment(20s);
  std::vector<Tensor> parameters = mlp(1)->parameters();
  if (group->rank() == 1) parameters.pop_back();
  const std::string error = error_of([&] { ZeroRedundancyOptimizer(parameters, group, optim::SGDOptions(0.1)); });
  expect(contains(error, "every rank must pass the same parameters in the same order"), error);
  // 155 elements in the six, 152 without the last.
  expect(contains(error, group->rank() == 0 ? "rank 1 has 5 parameters of 152 elements, rank 0 has 6 of 155"
                                            : "rank 0 has 6 parameters of 155 elements, rank 1 has 5 of 152"),
         error);
}

void spawn_in_temp_dir(const std::string& scenario, int world, const std::string& kind) {
  loom::testing::TempDir dir;
  SpawnOptions options{.deadline = 60s,
                       .environment = {{"LOOM_TEST_OPTIMIZER", kind}, {"LOOM_TEST_DIR", dir.path().string()}}};
  expect_all_ok(spawn_ranks(scenario, world, options));
}

}  // namespace

LOOM_DIST_SCENARIO("zero_equals_unsharded") { zero_equals_unsharded(); }
LOOM_DIST_SCENARIO("zero_mismatched_parameters") { zero_mismatched_parameters(); }

TEST_SUITE("zero") {
  TEST_CASE("partition_parameters: PyTorch's sorted-greedy partition, by hand") {
    std::vector<int64_t> numels;
    for (const Tensor& p : mlp(1)->parameters()) numels.push_back(p.numel());
    CHECK(numels == std::vector<int64_t>{48, 8, 64, 8, 24, 3});
    for (int world : {1, 2, 3}) CHECK(partition_parameters(numels, world) == kMlpShards.at(world));
    // Equal sizes keep their order; the lowest rank wins a tie.
    CHECK(partition_parameters({4, 4, 4, 4}, 3) == std::vector<std::vector<size_t>>{{0, 3}, {1}, {2}});
    CHECK(partition_parameters({30, 5, 15, 3}, 2) == std::vector<std::vector<size_t>>{{0}, {1, 2, 3}});
    // More ranks than parameters: some shards are empty.
    CHECK(partition_parameters({7}, 3) == std::vector<std::vector<size_t>>{{0}, {}, {}});
  }

  TEST_CASE("world of one: the unsharded optimizer's steps and state; the errors") {
    auto group = world_of_one();
    auto model = mlp(3), copy = mlp(3);
    ZeroRedundancyOptimizer zero(model->parameters(), group, optim::AdamWOptions(0.01));
    optim::AdamW reference(copy->parameters(), optim::AdamWOptions(0.01));
    CHECK(zero.lr() == 0.01);
    zero.set_lr(0.02);  // a schedule's rate reaches the local optimizer at the step
    reference.set_lr(0.02);
    for (int step = 0; step < 3; ++step) {
      zero.zero_grad();
      reference.zero_grad();
      step_loss(*model, 0, step).backward();
      step_loss(*copy, 0, step).backward();
      zero.step();
      reference.step();
    }
    CHECK(zero.local_optimizer().lr() == 0.02);
    expect_same(model->named_parameters(), copy->named_parameters(), "parameters");
    CHECK(contains(error_of([&] { zero.state(); }), "call consolidate_state_dict(0) on every rank first"));
    zero.consolidate_state_dict(0);
    expect_same(zero.state(), reference.state(), "state");
    CHECK(contains(error_of([&] { zero.consolidate_state_dict(1); }), "rank 1 is not in the group of 1"));

    const std::vector<Tensor> parameters = model->parameters();
    CHECK(contains(error_of([&] { ZeroRedundancyOptimizer(parameters, nullptr, optim::SGDOptions(0.1)); }),
                   "the process group is null"));
    CHECK(contains(error_of([&] { ZeroRedundancyOptimizer({}, group, optim::SGDOptions(0.1)); }),
                   "the parameter list is empty"));
    std::vector<Tensor> mixed = parameters;
    mixed[1] = Tensor::zeros({8}, DType::f64).set_requires_grad(true);
    CHECK(contains(error_of([&] { ZeroRedundancyOptimizer(mixed, group, optim::SGDOptions(0.1)); }),
                   "every parameter must have one dtype and device; parameter 1 is f64[8] cpu"));
    const LocalOptimizerFactory wrong = [&](std::vector<Tensor>) -> std::unique_ptr<optim::Optimizer> {
      return std::make_unique<optim::SGD>(std::vector<Tensor>{parameters[0]}, optim::SGDOptions(0.1));
    };
    CHECK(contains(error_of([&] { ZeroRedundancyOptimizer(parameters, group, wrong); }),
                   "must have one parameter group holding exactly the parameters it was built over"));
  }

  TEST_CASE("SGD with momentum and weight decay, 2 ranks: the unsharded optimizer's parameters and state") {
    spawn_in_temp_dir("zero_equals_unsharded", 2, "sgd");
  }
  TEST_CASE("SGD with momentum and weight decay, 3 ranks") { spawn_in_temp_dir("zero_equals_unsharded", 3, "sgd"); }
  TEST_CASE("AdamW, 2 ranks") { spawn_in_temp_dir("zero_equals_unsharded", 2, "adamw"); }
  TEST_CASE("AdamW, 3 ranks") { spawn_in_temp_dir("zero_equals_unsharded", 3, "adamw"); }
  TEST_CASE("ranks with different parameter lists are refused on every rank") {
    expect_all_ok(spawn_ranks("zero_mismatched_parameters", 2));
  }
}
