// avg_pool2d: hand-computed windows (padding counted and not), and backward
// against finite differences.
#include <doctest/doctest.h>

#include <loom/ops/pooling.h>
#include "tests/support/gradcheck.h"

using namespace loom;
using loom::testing::check_gradients;
using loom::testing::random_tensor;

namespace {
// 1..16 in one 4x4 plane.
Tensor sixteen() {
  std::vector<double> v(16);
  for (int i = 0; i < 16; ++i) v[i] = i + 1;
  return Tensor::from_vector<double>(v, {1, 1, 4, 4});
}

// Within 1e-14 of values computed by hand.
void check_near(const Tensor& actual, const std::vector<double>& expected) {
  loom::testing::check_values_near(actual, expected, 1e-14);
}
}  // namespace

TEST_CASE("avg_pool2d averages each window by hand") {
  // 2x2 windows, stride 2: (1+2+5+6)/4, (3+4+7+8)/4, (9+10+13+14)/4, (11+12+15+16)/4.
  check_near(avg_pool2d(sixteen(), {.kernel = {2, 2}, .stride = {2, 2}}), {3.5, 5.5, 11.5, 13.5});
  // 3x3 windows, stride 2, padding 1 (ResNet-D's and Inception's): window sums
  // 1+2+5+6 = 14, 2+3+4+6+7+8 = 30, 5+6+9+10+13+14 = 57, 6+7+8+10+11+12+14+15+16 = 99,
  // divided by 9 with the padding counted (PyTorch's default) ...
  const AvgPool2dParams padded{.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}};
  check_near(avg_pool2d(sixteen(), padded), {14.0 / 9, 30.0 / 9, 57.0 / 9, 11.0});
  // ... or by the input elements in the window.
  AvgPool2dParams excluded = padded;
  excluded.count_include_pad = false;
  check_near(avg_pool2d(sixteen(), excluded), {3.5, 5.0, 9.5, 11.0});
  // f32 and bf16 keep their dtype.
  CHECK(avg_pool2d(sixteen().to(DType::f32), padded).to_vector<float>()[3] == 11.0f);
  CHECK(avg_pool2d(sixteen().to(DType::bf16), padded).dtype() == DType::bf16);
}

TEST_CASE("avg_pool2d backward matches finite differences") {
  Tensor x = random_tensor({2, 3, 7, 6}, 31).set_requires_grad(true);
  for (bool include : {true, false}) {
    for (AvgPool2dParams params : {AvgPool2dParams{.kernel = {2, 2}, .stride = {2, 2}},
                                   AvgPool2dParams{.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}},
                                   AvgPool2dParams{.kernel = {3, 2}, .stride = {1, 2}, .padding = {1, 0}}}) {
      params.count_include_pad = include;
      check_gradients([params](const TensorList& t) { return avg_pool2d(t[0], params); }, {x});
    }
  }
}

TEST_CASE("avg_pool2d refuses a window that does not fit") {
  const Tensor x = sixteen();
  CHECK_THROWS_WITH_AS(avg_pool2d(x, {.kernel = {2, 2}, .stride = {2, 2}, .padding = {2, 2}}),
                       doctest::Contains("avg_pool2d: padding 2 along the height must be between 0 and half"), Error);
  CHECK_THROWS_WITH_AS(avg_pool2d(x, {.kernel = {5, 5}, .stride = {1, 1}}), doctest::Contains("larger than"), Error);
  CHECK_THROWS_WITH_AS(avg_pool2d(x, {.kernel = {2, 2}, .stride = {0, 1}}), doctest::Contains("must be positive"),
                       Error);
}
