// Metrics summed over a process group.
#include <loom/dist/metrics.h>

#include <loom/core/error.h>

namespace loom::dist {

AccuracyCounts all_reduce_accuracy(const AccuracyCounts& local, ProcessGroup* group) {
  if (group == nullptr || group->size() == 1) return local;
  const std::vector<int64_t> summed = all_reduce_values(*group, {local.correct, local.total}, ReduceOp::sum);
  return {summed[0], summed[1]};
}

}  // namespace loom::dist
