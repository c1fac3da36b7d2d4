// Join (uneven inputs): ranks with different numbers of batches train with
// DDP to the end without hanging, and their parameters (and, with
// ShadowStep, SGD's momentum buffers) equal those of one process that
// computes each iteration's averaged gradient itself: the running ranks'
// gradients summed, divided by the world size (divide_by_initial_world_size,
// PyTorch's default) or by the ranks that contributed; with accumulation
// over 2 batches, a rank whose data ends inside a group contributes what it
// accumulated. World 2 with rank 1 three batches short, world 3, gloo and
// shm; buffers broadcast from the lowest running rank; the errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>
#include <sstream>

#include <loom/core/autograd.h>
#include <loom/dist/ddp.h>
#include <loom/dist/join.h>
#include <loom/dist/sync_batch_norm.h>
#include <loom/nn/layers.h>
#include <loom/optim/optimizer.h>
#include "tests/dist/multiprocess.h"
#include "tests/dist/tiny_mlp.h"

using namespace loom;
using namespace loom::dist;
using namespace loom::dist::testing;
using namespace std::chrono_literals;

namespace {

constexpr int64_t kRowsPerBatch = 2;
constexpr double kLearningRate = 0.1;

// The batch counts of LOOM_JOIN_COUNTS ("8,5": rank 0 has 8, rank 1 has 5).
std::vector<int64_t> batch_counts() {
  std::vector<int64_t> counts;
  std::stringstream text(env_string("LOOM_JOIN_COUNTS"));
  for (std::string count; std::getline(text, count, ',');) counts.push_back(std::stoll(count));
  return counts;
}

// Rank r's batch i: rows [(i * world + r) * 2, +2) of tiny_mlp's inputs and targets.
int64_t first_row(int64_t iteration, int rank, int world) { return (iteration * world + rank) * kRowsPerBatch; }

// Iterations are grouped by `accumulate` up to the largest count: group g
// covers [g K, min(g K + K, M)), its last iteration all-reduces, and each
// loss is divided by the group's size.
struct Grouping {
  int64_t accumulate, largest;
  int64_t begin(int64_t iteration) const { return iteration / accumulate * accumulate; }
  int64_t end(int64_t iteration) const { return std::min(begin(iteration) + accumulate, largest); }
  int64_t size(int64_t iteration) const { return end(iteration) - begin(iteration); }
};

std::unique_ptr<optim::SGD> make_sgd(nn::Module& model, double momentum) {
  return std::make_unique<optim::SGD>(model.parameters(), optim::SGDOptions(kLearningRate).momentum(momentum));
}

// One process: for every group, the gradients of every rank's batches in it
// summed (each loss over the group's size), divided by the world or by the
// ranks that had a batch in the group, then one SGD step.
std::pair<std::shared_ptr<nn::Module>, std::unique_ptr<optim::SGD>> reference_run(
    const std::vector<int64_t>& counts, const Grouping& grouping, bool divide_by_world, double momentum) {
  const int world = static_cast<int>(counts.size());
  auto model = tiny_model(100);
  auto optimizer = make_sgd(*model, momentum);
  for (int64_t begin = 0; begin < grouping.largest; begin += grouping.accumulate) {
    const int64_t end = grouping.end(begin);
    int contributors = 0;
    for (int r = 0; r < world; ++r) contributors += counts[r] > begin ? 1 : 0;
    const double divisor = divide_by_world ? world : contributors;
    model->zero_grad();
    for (int r = 0; r < world; ++r) {
      for (int64_t i = begin; i < std::min(end, counts[r]); ++i) {
        const int64_t row = first_row(i, r, world);
        (mse(model->forward(inputs(row, kRowsPerBatch)), targets(row, kRowsPerBatch)) *
         (1.0 / (static_cast<double>(grouping.size(i)) * divisor)))
            .backward();
      }
    }
    optimizer->step();
  }
  return {model, std::move(optimizer)};
}

}  // namespace

// Every rank trains its LOOM_JOIN_COUNTS batches with DDP inside a Join
// (LOOM_JOIN_ACCUMULATE batches per step, the divisor of LOOM_JOIN_DIVISOR:
// "world" or "contributors"; LOOM_JOIN_MOMENTUM > 0 adds a ShadowStep), then
// joins; the result equals reference_run's on every rank.
LOOM_DIST_SCENARIO("join_uneven_sgd") {
  auto group = group_from_environment(20s);
  const int rank = group->rank(), world = group->size();
  const std::vector<int64_t> counts = batch_counts();
  expect(static_cast<int>(counts.size()) == world, "LOOM_JOIN_COUNTS has ", counts.size(), " counts for ", world,
         " ranks");
  const Grouping grouping{env_int("LOOM_JOIN_ACCUMULATE"), *std::max_element(counts.begin(), counts.end())};
  const bool divide_by_world = env_string("LOOM_JOIN_DIVISOR") == "world";
  const double momentum = std::atof(env_string("LOOM_JOIN_MOMENTUM").c_str());

  auto model = tiny_model(100 + rank);  // different until DDP broadcasts rank 0's
  DistributedDataParallel ddp(model, group, DistributedDataParallelOptions().first_bucket_bytes_cap(64).bucket_bytes_cap(128));
  auto optimizer = make_sgd(*model, momentum);
  // With momentum a joined rank must take the others' steps, or its momentum
  // buffers go stale; without, PyTorch's way: the final sync alone suffices.
  ShadowStep shadow_step(group, [&] { optimizer->step(); });
  std::vector<std::reference_wrapper<Joinable>> joinables{ddp};
  if (momentum > 0) joinables.push_back(shadow_step);
  Join join(joinables, JoinOptions().divide_by_initial_world_size(divide_by_world));
  for (int64_t i = 0; i < counts[rank]; ++i) {
    if (i == grouping.begin(i)) optimizer->zero_grad();
    const bool synchronize = i + 1 == grouping.end(i);
    std::optional<DistributedDataParallel::NoSyncGuard> no_sync;
    if (!synchronize) no_sync.emplace(ddp.no_sync());
    const int64_t row = first_row(i, rank, world);
    (mse(ddp.forward(inputs(row, kRowsPerBatch)), targets(row, kRowsPerBatch)) *
     (1.0 / static_cast<double>(grouping.size(i))))
        .backward();
    if (synchronize) optimizer->step();
  }
  expect(join.all_ranks_active() == (counts[rank] <= *std::min_element(counts.begin(), counts.end())),
         "all_ranks_active() after this rank's last iteration");
  join.join();
  expect(join.shadowed_iterations() == grouping.largest - counts[rank], "rank ", rank, " shadowed ",
         join.shadowed_iterations(), " iterations, expected ", grouping.largest - counts[rank]);

  auto [reference, reference_optimizer] = reference_run(counts, grouping, divide_by_world, momentum);
  expect_close(model->named_parameters(), reference->named_parameters(), str("parameters on rank ", rank));
  if (momentum > 0) expect_close(optimizer->state(), reference_optimizer->state(), str("momentum on rank ", rank));
  // The divisor matters here: the other one gives other parameters.
  auto [other, other_optimizer] = reference_run(counts, grouping, !divide_by_world, momentum);
  bool differs = false;
  for (size_t k = 0; k < other->parameters().size(); ++k) {
    const auto a = other->parameters()[k].to_vector<double>(), b = reference->parameters()[k].to_vector<double>();
    for (size_t i = 0; i < a.size(); ++i) differs = differs || std::abs(a[i] - b[i]) > 1e-6;
  }
  expect(differs, "the two divisors give the same parameters: the test cannot tell them apart");
  group->barrier()->wait();
}

// DDP's buffers (batch-norm statistics) come from the lowest running rank:
// rank 0 runs 2 no-grad forwards and joins, rank 1 runs 5; after every
// iteration every rank holds the statistics the lowest rank running the next
// iteration computed, and at the end those of the last joiner.
LOOM_DIST_SCENARIO("join_buffers") {
  auto group = group_from_environment(20s);
  const int rank = group->rank();
  const std::vector<int64_t> counts = {2, 5};
  auto make_model = [] {
    manual_seed(5);
    auto model = std::make_shared<nn::Sequential>(
        std::initializer_list<std::shared_ptr<nn::Module>>{std::make_shared<nn::BatchNorm2d>(2)});
    model->to(DType::f64);
    return model;
  };
  // Rank r's batch i: (4, 2, 1, 3) values of its own.
  auto batch = [](int64_t iteration, int r) {
    std::vector<double> values;
    for (int64_t k = 0; k < 24; ++k) values.push_back(std::sin(0.37 * static_cast<double>((iteration * 2 + r) * 24 + k)));
    return Tensor::from_vector_as(values, {4, 2, 1, 3}, DType::f64);
  };
  auto model = make_model();
  DistributedDataParallel ddp(model, group);
  {
    Join join({ddp});
    NoGradGuard no_grad;
    for (int64_t i = 0; i < counts[rank]; ++i) ddp.forward(batch(i, rank));
    join.join();
  }
  // One process: iteration i's statistics are those of the lowest rank still
  // running at i + 1 (the last iteration: at i), who broadcasts them next.
  auto reference = make_model();
  NoGradGuard no_grad;
  for (int64_t i = 0; i < 5; ++i) {
    const int64_t next = std::min<int64_t>(i + 1, 4);
    reference->forward(batch(i, counts[0] > next ? 0 : 1));
  }
  expect_close(model->named_buffers(), reference->named_buffers(), str("buffers on rank ", rank));
  group->barrier()->wait();
}

namespace {
// A scenario in which every rank throws: `run(ddp, join, rank)` with DDP over
// tiny_model(100) inside a Join with `options`; the error on each rank must
// mention `expected`.
void expect_join_error(const JoinOptions& options,
                       const std::function<void(DistributedDataParallel&, Join&, int rank)>& run,
                       const std::string& expected) {
  auto group = group_from_environment(20s);
  const int rank = group->rank();
  auto model = tiny_model(100);
  DistributedDataParallel ddp(model, group);
  Join join({ddp}, options);
  const std::string message = error_of([&] { run(ddp, join, rank); });
  expect(contains(message, expected), "rank ", rank, ": ", message);
  group->barrier()->wait();
}
}  // namespace

// The running ranks disagree on no_sync: every rank throws, naming them.
LOOM_DIST_SCENARIO("join_no_sync_disagreement") {
  expect_join_error(
      JoinOptions(),
      [](DistributedDataParallel& ddp, Join&, int rank) {
        std::optional<DistributedDataParallel::NoSyncGuard> no_sync;
        if (rank == 0) no_sync.emplace(ddp.no_sync());
        ddp.forward(inputs(0, 2));
      },
      "rank(s) 0 run it under no_sync() and rank(s) 1 do not");
}

// throw_on_early_termination: rank 1 has one batch, rank 0 three; both throw
// at iteration 1, rank 1 from join(), rank 0 from its second forward.
LOOM_DIST_SCENARIO("join_throw_on_early_termination") {
  expect_join_error(
      JoinOptions().throw_on_early_termination(true),
      [](DistributedDataParallel& ddp, Join& join, int rank) {
        for (int64_t i = 0; i < (rank == 0 ? 3 : 1); ++i) {
          mse(ddp.forward(inputs(2 * i, 2)), targets(2 * i, 2)).backward();
        }
        join.join();
      },
      "rank(s) 1 exhausted their inputs at iteration 1");
}

namespace {

SpawnOptions join_run(const std::string& counts, int accumulate, const std::string& divisor, double momentum,
                      const std::string& backend = "gloo") {
  return {.deadline = 60s,
          .environment = {{"LOOM_JOIN_COUNTS", counts},
                          {"LOOM_JOIN_ACCUMULATE", std::to_string(accumulate)},
                          {"LOOM_JOIN_DIVISOR", divisor},
                          {"LOOM_JOIN_MOMENTUM", std::to_string(momentum)},
                          {"LOOM_TEST_BACKEND", backend}}};
}

}  // namespace

TEST_SUITE("join") {
  TEST_CASE("world 2, rank 1 three batches short: PyTorch's divisor (the world) and the contributors'") {
    for (const char* divisor : {"world", "contributors"}) {
      CAPTURE(divisor);
      expect_all_ok(spawn_ranks("join_uneven_sgd", 2, join_run("8,5", 1, divisor, 0.0)));
    }
  }
  TEST_CASE("world 2 with momentum: ShadowStep keeps the joined rank's optimizer in step") {
    for (const char* divisor : {"world", "contributors"}) {
      CAPTURE(divisor);
      expect_all_ok(spawn_ranks("join_uneven_sgd", 2, join_run("8,5", 1, divisor, 0.9)));
    }
  }
  TEST_CASE("accumulation over 2 batches: rank 1's data ends inside a group and its gradients still count") {
    for (const char* divisor : {"world", "contributors"}) {
      CAPTURE(divisor);
      expect_all_ok(spawn_ranks("join_uneven_sgd", 2, join_run("8,5", 2, divisor, 0.9)));
    }
  }
  TEST_CASE("world 3, three different counts; rank 0 joining first") {
    for (int accumulate : {1, 2}) {
      CAPTURE(accumulate);
      expect_all_ok(spawn_ranks("join_uneven_sgd", 3, join_run("6,4,3", accumulate, "contributors", 0.9)));
      expect_all_ok(spawn_ranks("join_uneven_sgd", 2, join_run("3,7", accumulate, "world", 0.9)));
    }
  }
  TEST_CASE("shm: world 2 and 3") {
    expect_all_ok(spawn_ranks("join_uneven_sgd", 2, join_run("8,5", 2, "world", 0.9, "shm")));
    expect_all_ok(spawn_ranks("join_uneven_sgd", 3, join_run("6,4,3", 1, "contributors", 0.0, "shm")));
  }
  TEST_CASE("buffers come from the lowest running rank") { expect_all_ok(spawn_ranks("join_buffers", 2)); }
  TEST_CASE("the running ranks disagreeing on no_sync fail on every rank") {
    expect_all_ok(spawn_ranks("join_no_sync_disagreement", 2));
  }
  TEST_CASE("throw_on_early_termination") { expect_all_ok(spawn_ranks("join_throw_on_early_termination", 2)); }

  TEST_CASE("world of one, options, and what a Join refuses") {
    const JoinOptions defaults;
    CHECK(defaults.enable());
    CHECK(!defaults.throw_on_early_termination());
    CHECK(defaults.divide_by_initial_world_size());

    auto group = world_of_one();
    auto model = tiny_model(3);
    DistributedDataParallel ddp(model, group);
    {
      Join join({ddp});
      mse(ddp.forward(inputs(0, 2)), targets(0, 2)).backward();
      CHECK(join.last_iteration().has_value());
      CHECK(join.last_iteration()->active_ranks == 1);
      CHECK(join.last_iteration()->synchronize);
      CHECK(contains(error_of([&] { Join again({ddp}); }), "already inside another Join"));
      join.join();
      CHECK(join.shadowed_iterations() == 0);
      join.join();  // a second call does nothing
    }
    {
      Join disabled({ddp}, JoinOptions().enable(false));
      ddp.forward(inputs(0, 2));
      CHECK(!disabled.last_iteration().has_value());
      disabled.join();
    }
    CHECK(contains(error_of([] { Join({}); }), "at least one joinable"));
    CHECK(contains(error_of([&] { Join({ddp, ddp}); }), "listed twice"));
    ShadowStep other_group(world_of_one(), [] {});
    CHECK(contains(error_of([&] { Join({ddp, other_group}); }), "different process groups"));

    std::shared_ptr<nn::Module> with_sync_bn = std::make_shared<nn::Sequential>(
        std::initializer_list<std::shared_ptr<nn::Module>>{std::make_shared<nn::BatchNorm2d>(2)});
    with_sync_bn = convert_sync_batchnorm(with_sync_bn, group);
    DistributedDataParallel sync_bn_ddp(with_sync_bn, group);
    const std::string refused = error_of([&] { Join join({sync_bn_ddp}); });
    CHECK(contains(refused, "SyncBatchNorm ('0')"));
    CHECK(contains(refused, "cannot shadow"));

    // A joinable destroyed before its Join detaches itself.
    auto short_lived = std::make_unique<ShadowStep>(group, [] {});
    Join join({ddp, *short_lived});
    short_lived.reset();
    join.join();
  }
}
