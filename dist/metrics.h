// Metrics over a process group: each rank counts on its shard of the
// evaluation set, then the counts are summed over ranks (the tutorial's
// all_reduce of (correct, total)).
#pragma once

#include <cstdint>
#include <vector>

#include <loom/data/sampler.h>
#include <loom/dist/process_group.h>

namespace loom::dist {

// Rank `rank`'s share of an evaluation set of `dataset_size` items: indices
// rank, rank + world, rank + 2 world, ... in order, with no padding (unlike
// DistributedSampler), so counts summed over ranks cover every item once.
class ShardSampler final : public data::Sampler {
 public:
  ShardSampler(int64_t dataset_size, int64_t world_size, int64_t rank);
  std::vector<int64_t> indices() const override;
  int64_t size() const override;

 private:
  int64_t dataset_size_, world_size_, rank_;
};

struct AccuracyCounts {
  int64_t correct = 0;
  int64_t total = 0;
  // correct / total, 0 when total is 0.
  double accuracy() const { return total > 0 ? static_cast<double>(correct) / static_cast<double>(total) : 0.0; }
};

// Sums (correct, total) over the ranks of `group` (one i64 all-reduce;
// collective: every rank must call it). A null group or a world of one
// returns `local` unchanged.
AccuracyCounts all_reduce_accuracy(const AccuracyCounts& local, ProcessGroup* group);

}  // namespace loom::dist
