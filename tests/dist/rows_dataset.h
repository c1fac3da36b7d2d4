// A user-defined Dataset the dist tests train on through a DataLoader: row i
// is 6 features laid out as a (1, 2, 3) sample, and its label is i itself, so
// a test can see which rows a batch holds; with the targets each row is fit to.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include <loom/core/tensor.h>
#include "tests/support/generated_dataset.h"

namespace loom::dist::testing {

// Feature `column` of row `row`, as f32 (what the dataset writes).
inline float row_feature(int64_t row, int64_t column) {
  return static_cast<float>(std::sin(0.7 * static_cast<double>(row) + 1.3 * static_cast<double>(column)));
}

class RowsDataset : public loom::testing::GeneratedDataset {
 public:
  explicit RowsDataset(int64_t rows)
      : GeneratedDataset("rows", rows, {1, 2, 3}, [](int64_t index, float* pixels) {
          for (int64_t column = 0; column < 6; ++column) pixels[column] = row_feature(index, column);
          return index;
        }) {}
};

// The (rows, 3) targets of `rows`, in `dtype`.
inline Tensor row_targets(const std::vector<int64_t>& rows, DType dtype) {
  std::vector<double> values;
  for (int64_t row : rows)
    for (int64_t column = 0; column < 3; ++column) values.push_back(std::cos(0.3 * static_cast<double>(row) - column));
  return Tensor::from_vector_as(values, {static_cast<int64_t>(rows.size()), 3}, dtype);
}

}  // namespace loom::dist::testing
