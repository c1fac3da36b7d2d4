// Summaries of repeated timings, shared by the benchmarks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace loom::bench {

// The middle value (the mean of the two middle ones for an even count); 0 for none.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace loom::bench
