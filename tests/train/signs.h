// What the Trainer's multi-process tests (test_accumulation.cpp,
// test_join.cpp) share: a small learnable data set and the comparison of two
// runs' numbers.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <loom/core/generator.h>
#include "tests/support/generated_dataset.h"

namespace loom::train::testing {

// 200 samples of three classes by the sign pattern of two noisy coordinates, as 1x2x2 images.
class Signs : public loom::testing::GeneratedDataset {
 public:
  static constexpr int64_t kSize = 200;
  Signs()
      : GeneratedDataset("signs", kSize, {1, 2, 2}, [](int64_t index, float* pixels) -> int64_t {
          Generator random(static_cast<uint64_t>(index) * 7 + 1);
          const double a = random.normal(), b = random.normal();
          pixels[0] = static_cast<float>(a);
          pixels[1] = static_cast<float>(b);
          pixels[2] = static_cast<float>(a - b);
          pixels[3] = 1.0f;
          return a > 0 ? (b > 0 ? 0 : 1) : 2;
        }) {}
};

// The largest |a - b| / max(1, |b|); infinity for vectors of different
// lengths. (No doctest macro: the ranks of a scenario run outside doctest.)
inline double relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(1.0, std::abs(b[i])));
  return worst;
}

}  // namespace loom::train::testing
