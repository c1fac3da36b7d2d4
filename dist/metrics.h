// Metrics over a process group: each rank counts on its shard of the
// evaluation set, then the counts are summed over ranks (the tutorial's
// all_reduce of (correct, total)).
#pragma once

#include <cstdint>
#include <vector>

#include <loom/data/sampler.h>
#include <loom/dist/process_group.h>

namespace loom::dist {

// The evaluation shards that the counts below come from: a data::Sampler,
// defined in data/sampler.h; this name stays for code written against dist.
using ShardSampler = data::ShardSampler;

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
