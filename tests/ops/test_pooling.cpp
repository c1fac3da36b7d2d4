// max_pool2d and adaptive_avg_pool2d: hand-computed values and argmax
// indices, backward against finite differences, f16 / bf16 against f32.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include <loom/ops/pooling.h>
#include "tests/support/gradcheck.h"

using namespace loom;
using loom::testing::check_gradients;
using loom::testing::random_tensor;
using loom::testing::relative_error;

namespace {
// [[1 5 2 0]
//  [3 4 8 6]
//  [9 0 1 2]
//  [7 6 3 5]]
Tensor grid_4x4() {
  return Tensor::from_vector<float>({1, 5, 2, 0, 3, 4, 8, 6, 9, 0, 1, 2, 7, 6, 3, 5}, {1, 1, 4, 4}).set_requires_grad(true);
}
}  // namespace

TEST_CASE("max_pool2d matches hand computation") {
  SUBCASE("2x2 windows, stride = kernel") {
    Tensor x = grid_4x4();
    auto [y, indices] = max_pool2d_with_indices(x, {2, 2}, {2, 2});
    CHECK(y.to_vector<float>() == std::vector<float>{5, 8, 9, 5});
    CHECK(indices.dtype() == DType::i64);
    CHECK(indices.to_vector<int64_t>() == std::vector<int64_t>{1, 6, 8, 15});
    CHECK_FALSE(indices.requires_grad());
    CHECK(max_pool2d(x, {2, 2}).to_vector<float>() == y.to_vector<float>());
  }
  SUBCASE("3x3 windows, stride 2, padding 1: overlapping windows share a maximum") {
    Tensor x = grid_4x4();
    // Windows cover rows/cols {0,1} and {1,2,3}.
    auto [y, indices] = max_pool2d_with_indices(x, {3, 3}, {2, 2}, {1, 1});
    CHECK(y.to_vector<float>() == std::vector<float>{5, 8, 9, 8});
    CHECK(indices.to_vector<int64_t>() == std::vector<int64_t>{1, 6, 8, 6});
    y.backward(Tensor::from_vector<float>({1, 2, 3, 4}, {1, 1, 2, 2}));
    std::vector<float> expected(16, 0);
    expected[1] = 1;
    expected[6] = 2 + 4;  // the maximum of two windows gets both gradients
    expected[8] = 3;
    CHECK(x.grad().to_vector<float>() == expected);
  }
  SUBCASE("ties keep the first maximum; a NaN wins, the last of several") {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    // [[2 1 NaN 1]
    //  [2 0 0 NaN]]
    Tensor x = Tensor::from_vector<float>({2, 1, nan, 1, 2, 0, 0, nan}, {1, 1, 2, 4});
    auto [y, indices] = max_pool2d_with_indices(x, {2, 2});
    CHECK(y.to_vector<float>()[0] == 2);
    CHECK(std::isnan(y.to_vector<float>()[1]));
    CHECK(indices.to_vector<int64_t>() == std::vector<int64_t>{0, 7});
  }
  SUBCASE("padding must stay within half the kernel") {
    CHECK_THROWS_WITH_AS(max_pool2d(grid_4x4(), {2, 2}, {1, 1}, {2, 2}), doctest::Contains("half the kernel"), Error);
  }
}

TEST_CASE("adaptive_avg_pool2d matches hand computation") {
  SUBCASE("5 -> 3: windows [0, 2), [1, 4), [3, 5)") {
    Tensor row = Tensor::from_vector<float>({1, 2, 3, 4, 5}, {1, 1, 1, 5});
    CHECK(adaptive_avg_pool2d(row, {1, 3}).to_vector<float>() == std::vector<float>{1.5f, 3, 4.5f});
    // x[h, w] = 10 h + w: each output is 10 * (mean of its rows) + (mean of its columns).
    std::vector<float> values;
    for (int h = 0; h < 5; ++h) {
      for (int w = 0; w < 5; ++w) values.push_back(static_cast<float>(10 * h + w));
    }
    Tensor x = Tensor::from_vector<float>(values, {1, 1, 5, 5});
    CHECK(adaptive_avg_pool2d(x, {3, 3}).to_vector<float>() ==
          std::vector<float>{5.5f, 7, 8.5f, 20.5f, 22, 23.5f, 35.5f, 37, 38.5f});
  }
  SUBCASE("global average") {
    Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 10, 20, 30, 40}, {1, 2, 2, 2});
    CHECK(adaptive_avg_pool2d(x, {1, 1}).to_vector<float>() == std::vector<float>{2.5f, 25});
  }
  SUBCASE("backward spreads each gradient over its window") {
    Tensor row = Tensor::from_vector<float>({1, 2, 3, 4, 5}, {1, 1, 1, 5}).set_requires_grad(true);
    adaptive_avg_pool2d(row, {1, 3}).backward(Tensor::from_vector<float>({2, 3, 4}, {1, 1, 1, 3}));
    // [0,2) gets 2/2 each, [1,4) 3/3 each, [3,5) 4/2 each
    CHECK(row.grad().to_vector<float>() == std::vector<float>{1, 2, 1, 3, 2});
  }
}

TEST_CASE("pooling backward matches finite differences") {
  // Uniform random values: no ties, and no maximum within eps of another.
  Tensor a = random_tensor({2, 3, 7, 6}, 51).set_requires_grad(true);
  check_gradients([](const TensorList& t) { return max_pool2d(t[0], {3, 3}, {2, 2}, {1, 1}); }, {a});
  check_gradients([](const TensorList& t) { return max_pool2d(t[0], {2, 2}); }, {a});
  check_gradients([](const TensorList& t) { return max_pool2d(t[0], {2, 3}, {1, 2}, {1, 1}); }, {a});
  check_gradients([](const TensorList& t) { return adaptive_avg_pool2d(t[0], {3, 4}); }, {a});
  check_gradients([](const TensorList& t) { return adaptive_avg_pool2d(t[0], {1, 1}); }, {a});
  Tensor small = random_tensor({1, 2, 3, 2}, 52).set_requires_grad(true);
  check_gradients([](const TensorList& t) { return adaptive_avg_pool2d(t[0], {5, 3}); }, {small});  // windows overlap
}

TEST_CASE("pooling in f16 and bf16 matches f32") {
  for (DType low : {DType::f16, DType::bf16}) {
    INFO(dtype_name(low));
    Tensor x = random_tensor({2, 3, 9, 7}, 61, -4, 4, DType::f32).to(low);
    Tensor xf = x.to(DType::f32);
    auto [y, indices] = max_pool2d_with_indices(x, {3, 3}, {2, 2}, {1, 1});
    auto [yf, indices_f] = max_pool2d_with_indices(xf, {3, 3}, {2, 2}, {1, 1});
    CHECK(y.dtype() == low);
    CHECK(y.to_vector<float>() == yf.to_vector<float>());  // a maximum is exact
    CHECK(indices.to_vector<int64_t>() == indices_f.to_vector<int64_t>());
    Tensor avg = adaptive_avg_pool2d(x, {4, 3});
    CHECK(avg.dtype() == low);
    CHECK(relative_error(avg, adaptive_avg_pool2d(xf, {4, 3})) < (low == DType::f16 ? 1e-3 : 8e-3));
  }
}

TEST_CASE("max_pool2d 2x2 / stride 2 on odd sizes matches a direct scan") {
  Tensor x = loom::testing::random_tensor({2, 3, 5, 7}, 77, -1, 1, DType::f32);
  auto [y, indices] = max_pool2d_with_indices(x, {2, 2}, {2, 2});
  REQUIRE(y.sizes() == Shape{2, 3, 2, 3});
  auto values = x.to_vector<float>();
  auto pooled = y.to_vector<float>();
  auto argmax = indices.to_vector<int64_t>();
  for (int64_t p = 0; p < 6; ++p) {
    for (int64_t oh = 0; oh < 2; ++oh) {
      for (int64_t ow = 0; ow < 3; ++ow) {
        int64_t best = 2 * oh * 7 + 2 * ow;
        for (int64_t dh = 0; dh < 2; ++dh) {
          for (int64_t dw = 0; dw < 2; ++dw) {
            const int64_t i = (2 * oh + dh) * 7 + 2 * ow + dw;
            if (values[p * 35 + i] > values[p * 35 + best]) best = i;
          }
        }
        CHECK(argmax[p * 6 + oh * 3 + ow] == best);
        CHECK(pooled[p * 6 + oh * 3 + ow] == values[p * 35 + best]);
      }
    }
  }
}

// The vectorised 2x2 path takes eight outputs at a time: rows wide enough for
// it (and a ragged tail), ties (the first maximum wins) and NaNs (a NaN takes
// over, so the last NaN of a window wins), against the same rule by hand.
TEST_CASE("max_pool2d 2x2 on wide rows with ties and NaNs follows the scan rule") {
  // Rows of 18 outputs (two vectors and an overlapping last one), 8 (one), 7
  // from 14 and 15 columns (masked loads: the ConvNet's second pool).
  for (const int64_t width : {37, 16, 14, 15}) {
    INFO("width " << width);
    const int64_t height = 10, out_h = 5, out_w = width / 2;
    Tensor x = loom::testing::random_tensor({2, 3, height, width}, 78, -1, 1, DType::f32);
    std::vector<float> values = x.to_vector<float>();
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = std::round(values[i] * 2) / 2;  // few distinct values: many ties
      if (i % 41 == 7 || i % 53 == 0) values[i] = std::numeric_limits<float>::quiet_NaN();
    }
    x = Tensor::from_vector<float>(values, {2, 3, height, width});
    auto [y, indices] = max_pool2d_with_indices(x, {2, 2}, {2, 2});
    REQUIRE(y.sizes() == Shape{2, 3, out_h, out_w});
    const auto pooled = y.to_vector<float>();
    const auto argmax = indices.to_vector<int64_t>();
    int64_t nan_windows = 0;
    for (int64_t p = 0; p < 6; ++p) {
      const float* plane = values.data() + p * height * width;
      for (int64_t oh = 0; oh < out_h; ++oh) {
        for (int64_t ow = 0; ow < out_w; ++ow) {
          const int64_t i0 = 2 * oh * width + 2 * ow;
          int64_t best = i0;
          for (int64_t i : {i0 + 1, i0 + width, i0 + width + 1}) {
            if (plane[i] > plane[best] || std::isnan(plane[i])) best = i;
          }
          const int64_t o = p * out_h * out_w + oh * out_w + ow;
          CHECK(argmax[o] == best);
          if (std::isnan(plane[best])) {
            ++nan_windows;
            CHECK(std::isnan(pooled[o]));
          } else {
            CHECK(pooled[o] == plane[best]);
          }
        }
      }
    }
    CHECK(nan_windows > 10);
  }
}
