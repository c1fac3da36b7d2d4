// Metrics summed over a process group.
#include <loom/dist/metrics.h>

#include <loom/core/error.h>

namespace loom::dist {

ShardSampler::ShardSampler(int64_t dataset_size, int64_t world_size, int64_t rank)
    : dataset_size_(dataset_size), world_size_(world_size), rank_(rank) {
  LOOM_CHECK(dataset_size >= 0, "ShardSampler: dataset size ", dataset_size, " must not be negative");
  LOOM_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "ShardSampler: rank ", rank,
             " must be in [0, world size ", world_size, ")");
}

int64_t ShardSampler::size() const {
  return dataset_size_ > rank_ ? (dataset_size_ - rank_ + world_size_ - 1) / world_size_ : 0;
}

std::vector<int64_t> ShardSampler::indices() const {
  std::vector<int64_t> result;
  result.reserve(static_cast<size_t>(size()));
  for (int64_t i = rank_; i < dataset_size_; i += world_size_) result.push_back(i);
  return result;
}

AccuracyCounts all_reduce_accuracy(const AccuracyCounts& local, ProcessGroup* group) {
  if (group == nullptr || group->size() == 1) return local;
  // On the group's device (CUDA for nccl); the host reads the sum.
  Tensor counts = Tensor::from_vector<int64_t>({local.correct, local.total}, {2}).to(group->device());
  group->all_reduce(counts, ReduceOp::sum)->wait();
  const std::vector<int64_t> summed = counts.to(Device::cpu()).to_vector<int64_t>();
  return {summed[0], summed[1]};
}

}  // namespace loom::dist
