// A user's own Dataset (data/dataset.h) driven like the built-in ones: a
// DataLoader with worker threads over a DistributedSampler shard, feeding
// DistributedDataParallel at world 2; the ranks' shards cover the dataset and
// training equals one process stepping on both shards together.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <set>
#include <vector>

#include <loom/data/dataset.h>
#include <loom/data/loader.h>
#include <loom/data/sampler.h>
#include <loom/dist/ddp.h>
#include "tests/dist/multiprocess.h"
#include "tests/dist/rows_dataset.h"
#include "tests/dist/tiny_mlp.h"

using namespace loom;
using namespace loom::dist;
using namespace loom::dist::testing;

namespace {

constexpr int64_t kRows = 16;

Tensor inputs_of(const std::vector<int64_t>& rows) {
  std::vector<double> values;
  for (int64_t row : rows)
    for (int64_t column = 0; column < 6; ++column) values.push_back(row_feature(row, column));
  return Tensor::from_vector_as(values, {static_cast<int64_t>(rows.size()), 6}, DType::f64);
}

Tensor targets_of(const std::vector<int64_t>& rows) { return row_targets(rows, DType::f64); }

}  // namespace

LOOM_DIST_SCENARIO("ddp_user_dataset") {
  auto group = group_from_environment(std::chrono::seconds(20));
  const int rank = group->rank(), world = group->size();
  constexpr int64_t batch = 4, epochs = 2;
  auto sampler = std::make_shared<data::DistributedSampler>(kRows, world, rank, /*shuffle=*/true, /*seed=*/5);
  data::DataLoader loader(std::make_shared<RowsDataset>(kRows),
                          data::DataLoaderOptions().batch_size(batch).num_workers(2).dtype(DType::f64), sampler);
  auto model = tiny_model(300 + rank);
  DistributedDataParallel ddp(model, group, {});
  auto reference = tiny_model(300);
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    // Every rank's shard of this epoch, as each rank's sampler gives it.
    std::vector<std::vector<int64_t>> shards;
    std::set<int64_t> covered;
    for (int r = 0; r < world; ++r) {
      data::DistributedSampler other(kRows, world, r, true, 5);
      other.set_epoch(epoch);
      shards.push_back(other.indices());
      covered.insert(shards.back().begin(), shards.back().end());
    }
    expect(static_cast<int64_t>(covered.size()) == kRows, "epoch ", epoch, ": the shards cover ", covered.size(),
           " of ", kRows, " rows");
    int64_t step = 0;
    for (data::Batch& delivered : loader.epoch(epoch)) {
      const std::vector<int64_t> labels = delivered.labels.to_vector<int64_t>();
      const std::vector<int64_t> expected(shards[rank].begin() + step * batch, shards[rank].begin() + (step + 1) * batch);
      expect(labels == expected, "rank ", rank, " epoch ", epoch, " step ", step, ": the batch holds other rows");
      expect(delivered.images.sizes() == Shape{batch, 1, 2, 3}, "a batch of another shape");
      mse(ddp.forward(delivered.images.reshape({batch, 6})), targets_of(labels)).backward();
      sgd_step(*model, 0.1);
      // The reference: one process on both ranks' rows of this step.
      std::vector<int64_t> both;
      for (int r = 0; r < world; ++r) both.insert(both.end(), shards[r].begin() + step * batch, shards[r].begin() + (step + 1) * batch);
      mse(reference->forward(inputs_of(both)), targets_of(both)).backward();
      sgd_step(*reference, 0.1);
      ++step;
    }
    expect(step == kRows / world / batch, "rank ", rank, " epoch ", epoch, ": ", step, " batches");
  }
  expect_close(model->named_parameters(), reference->named_parameters(), str("parameters after training, rank ", rank));
  group->barrier()->wait();
}

TEST_SUITE("user_dataset") {
  TEST_CASE("a user-defined Dataset through DataLoader workers, DistributedSampler and DDP at world 2") {
    expect_all_ok(spawn_ranks("ddp_user_dataset", 2));
  }
}
