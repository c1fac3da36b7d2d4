// CPU parallelism: one OpenMP team whose size the user sets (--threads).
#pragma once

#include <cstdint>

namespace loom {

// Sets the number of threads CPU kernels (and Eigen) use; 0 keeps the default.
void set_num_threads(int threads);
int get_num_threads();
// True inside a parallel region: nested parallel_for runs serially.
bool in_parallel_region();

// Splits [begin, end) into chunks of at least `grain` elements and runs
// fn(chunk_begin, chunk_end) on the thread team. Runs inline when the range is
// small, or when already inside a parallel region.
template <class Fn>
void parallel_for(int64_t begin, int64_t end, int64_t grain, Fn&& fn);

namespace detail {
int64_t omp_threads_for(int64_t work, int64_t grain);
}

}  // namespace loom

#include <omp.h>

template <class Fn>
void loom::parallel_for(int64_t begin, int64_t end, int64_t grain, Fn&& fn) {
  const int64_t work = end - begin;
  if (work <= 0) return;
  const int64_t threads = detail::omp_threads_for(work, grain);
  if (threads <= 1) {
    fn(begin, end);
    return;
  }
#pragma omp parallel num_threads(static_cast<int>(threads))
  {
    const int64_t t = omp_get_thread_num();
    const int64_t n = omp_get_num_threads();
    const int64_t chunk = (work + n - 1) / n;
    const int64_t b = begin + t * chunk;
    const int64_t e = b + chunk < end ? b + chunk : end;
    if (b < e) fn(b, e);
  }
}
