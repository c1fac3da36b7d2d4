// Metrics summed over a process group.
#include <loom/dist/metrics.h>

#include <loom/core/error.h>

namespace loom::dist {

AccuracyCounts all_reduce_accuracy(const AccuracyCounts& local, ProcessGroup* group) {
  if (group == nullptr || group->size() == 1) return local;
  // On the group's device (CUDA for nccl); the host reads the sum.
  Tensor counts = Tensor::from_vector<int64_t>({local.correct, local.total}, {2}).to(group->device());
  group->all_reduce(counts, ReduceOp::sum)->wait();
  const std::vector<int64_t> summed = counts.to(Device::cpu()).to_vector<int64_t>();
  return {summed[0], summed[1]};
}

}  // namespace loom::dist
