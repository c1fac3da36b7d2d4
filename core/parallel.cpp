#include <loom/core/parallel.h>

#include <Eigen/Core>
#include <algorithm>
#include <omp.h>

namespace loom {

void set_num_threads(int threads) {
  if (threads <= 0) return;
  omp_set_num_threads(threads);
  Eigen::setNbThreads(threads);
}

int get_num_threads() { return omp_get_max_threads(); }

bool in_parallel_region() { return omp_in_parallel() != 0; }

int64_t detail::omp_threads_for(int64_t work, int64_t grain) {
  if (omp_in_parallel()) return 1;
  const int64_t by_grain = std::max<int64_t>(1, work / std::max<int64_t>(grain, 1));
  return std::min<int64_t>(by_grain, omp_get_max_threads());
}

}  // namespace loom
