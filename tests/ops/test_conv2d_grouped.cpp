// Grouped and depthwise conv2d: hand-computed outputs, the depthwise kernel
// against dense convolutions of each channel alone, and backward against
// finite differences (input, weight, bias) for depthwise, channel multipliers
// and general groups.
#include <doctest/doctest.h>

#include <loom/ops/conv2d.h>
#include "tests/support/gradcheck.h"

using namespace loom;
using loom::testing::check_gradients;
using loom::testing::random_tensor;
using loom::testing::relative_error;

TEST_CASE("depthwise conv2d by hand") {
  // Channel 0 holds 1..9, channel 1 ones. Weight 0 sums a window's diagonal,
  // weight 1 the whole 2x2 window; bias (0, 0.5).
  std::vector<double> x(18, 1.0);
  for (int i = 0; i < 9; ++i) x[i] = i + 1;
  const Tensor input = Tensor::from_vector<double>(x, {1, 2, 3, 3});
  const Tensor weight = Tensor::from_vector<double>({1, 0, 0, 1, 1, 1, 1, 1}, {2, 1, 2, 2});
  const Tensor bias = Tensor::from_vector<double>({0, 0.5}, {2});
  // 1+5, 2+6, 4+8, 5+9; and 4 ones + 0.5.
  CHECK(conv2d(input, weight, bias, {.groups = 2}).to_vector<double>() ==
        std::vector<double>{6, 8, 12, 14, 4.5, 4.5, 4.5, 4.5});
  // Padding 1 on channel 1: each output counts the ones its window covers.
  const std::vector<double> padded = conv2d(input, weight, bias, {.padding = {1, 1}, .groups = 2}).to_vector<double>();
  const std::vector<double> counts{1, 2, 2, 1, 2, 4, 4, 2, 2, 4, 4, 2, 1, 2, 2, 1};
  for (size_t i = 0; i < counts.size(); ++i) CHECK(padded[16 + i] == counts[i] + 0.5);
}

TEST_CASE("grouped conv2d by hand: each output group sees only its input group") {
  // Input channels (1, 2, 3, 4); groups 2: outputs 0, 1 from channels 0, 1 and outputs 2, 3 from channels 2, 3.
  const Tensor input = Tensor::from_vector<double>({1, 2, 3, 4}, {1, 4, 1, 1});
  const Tensor weight = Tensor::from_vector<double>({1, 1, 1, -1, 2, 0, 0, 3}, {4, 2, 1, 1});
  // 1 + 2, 1 - 2, 2 * 3, 3 * 4.
  CHECK(conv2d(input, weight, Tensor(), {.groups = 2}).to_vector<double>() == std::vector<double>{3, -1, 6, 12});
  CHECK(conv2d(input.to(DType::f32), weight.to(DType::f32), Tensor(), {.groups = 2}).to_vector<float>() ==
        std::vector<float>{3, -1, 6, 12});
}

TEST_CASE("depthwise conv2d equals a dense convolution of each channel alone") {
  // Channel multiplier 2, stride 2, dilation 2, padding 2, odd sizes.
  const int64_t channels = 5, multiplier = 2;
  const Tensor input = random_tensor({3, channels, 11, 9}, 61, -1.0, 1.0, DType::f32);
  const Tensor weight = random_tensor({channels * multiplier, 1, 3, 3}, 62, -1.0, 1.0, DType::f32);
  const Tensor bias = random_tensor({channels * multiplier}, 63, -1.0, 1.0, DType::f32);
  // The last two take the padded-plane path (stride 1, rows of 8 or more outputs).
  for (const Conv2dParams dense : {Conv2dParams{}, Conv2dParams{.stride = {2, 2}, .padding = {2, 2}, .dilation = {2, 2}},
                                   Conv2dParams{.stride = {1, 2}, .padding = {1, 0}}, Conv2dParams{.padding = {1, 1}},
                                   Conv2dParams{.padding = {0, 2}}}) {
    Conv2dParams grouped = dense;
    grouped.groups = channels;
    const Tensor y = conv2d(input, weight, bias, grouped);
    for (int64_t c = 0; c < channels; ++c) {
      const Tensor expected = conv2d(input.slice(1, c, c + 1).contiguous(),
                                     weight.slice(0, c * multiplier, (c + 1) * multiplier).contiguous(),
                                     bias.slice(0, c * multiplier, (c + 1) * multiplier).contiguous(), dense);
      CHECK(relative_error(y.slice(1, c * multiplier, (c + 1) * multiplier).contiguous(), expected) < 1e-5);
    }
  }
}

TEST_CASE("depthwise conv2d on small planes (the channels-last path) equals a dense convolution of each channel") {
  // ConvNeXt's 7x7 over 4x4, 2x2 and 1x1 planes, and a strided 3x3 down to 2x2: at most 16 outputs a plane.
  struct Case {
    Shape input;
    int64_t kernel;
    Conv2dParams params;
  };
  const Case cases[] = {{{3, 16, 4, 4}, 7, {.padding = {3, 3}}},
                        {{2, 24, 2, 2}, 7, {.padding = {3, 3}}},
                        {{2, 9, 1, 1}, 7, {.padding = {3, 3}}},
                        {{2, 70, 4, 3}, 3, {.stride = {2, 2}, .padding = {1, 1}}}};
  uint64_t seed = 90;
  for (const Case& c : cases) {
    INFO("input ", shape_str(c.input), " kernel ", c.kernel);
    const int64_t channels = c.input[1];
    const Tensor input = random_tensor(c.input, seed++, -1.0, 1.0, DType::f32);
    const Tensor weight = random_tensor({channels, 1, c.kernel, c.kernel}, seed++, -1.0, 1.0, DType::f32);
    const Tensor bias = random_tensor({channels}, seed++, -1.0, 1.0, DType::f32);
    Conv2dParams grouped = c.params;
    grouped.groups = channels;
    const Tensor y = conv2d(input, weight, bias, grouped);
    for (int64_t k = 0; k < channels; ++k) {
      const Tensor expected = conv2d(input.slice(1, k, k + 1).contiguous(), weight.slice(0, k, k + 1).contiguous(),
                                     bias.slice(0, k, k + 1).contiguous(), c.params);
      CHECK(relative_error(y.slice(1, k, k + 1).contiguous(), expected) < 1e-5);
    }
  }
}

TEST_CASE("grouped and depthwise conv2d backward match finite differences") {
  struct Case {
    Shape input, weight;
    Conv2dParams params;
  };
  const Case cases[] = {
      {{2, 3, 6, 5}, {3, 1, 3, 3}, {.padding = {1, 1}, .groups = 3}},                        // depthwise
      {{2, 2, 7, 6}, {6, 1, 3, 2}, {.stride = {2, 1}, .padding = {1, 1}, .groups = 2}},      // multiplier 3
      {{1, 3, 8, 8}, {3, 1, 5, 5}, {.stride = {2, 2}, .padding = {2, 2}, .groups = 3}},      // EfficientNet's 5x5
      {{1, 2, 7, 7}, {2, 1, 3, 3}, {.padding = {2, 2}, .dilation = {2, 2}, .groups = 2}},    // dilated
      {{2, 4, 5, 5}, {6, 2, 3, 3}, {.padding = {1, 1}, .groups = 2}},                        // two groups
      {{1, 6, 4, 5}, {3, 2, 1, 1}, {.groups = 3}},                                           // 1x1 per group
      // The padded-plane path (stride 1, rows of 8 or more outputs): ConvNeXt's 7x7, a multiplier of 2.
      {{1, 2, 8, 9}, {2, 1, 7, 7}, {.padding = {3, 3}, .groups = 2}},
      {{2, 2, 5, 10}, {4, 1, 3, 3}, {.padding = {1, 1}, .groups = 2}},
      // The channels-last path (at most 16 outputs a plane, 8 or more channels): 7x7 over 2x2 and 1x1, strided 3x3.
      {{2, 8, 2, 2}, {8, 1, 7, 7}, {.padding = {3, 3}, .groups = 8}},
      {{2, 9, 1, 1}, {9, 1, 7, 7}, {.padding = {3, 3}, .groups = 9}},
      {{1, 10, 4, 3}, {10, 1, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}, .groups = 10}},
  };
  uint64_t seed = 70;
  for (const Case& c : cases) {
    INFO("input ", shape_str(c.input), " weight ", shape_str(c.weight), " groups ", c.params.groups);
    Tensor x = random_tensor(c.input, seed++).set_requires_grad(true);
    Tensor w = random_tensor(c.weight, seed++).set_requires_grad(true);
    Tensor b = random_tensor({c.weight[0]}, seed++).set_requires_grad(true);
    const Conv2dParams params = c.params;
    check_gradients([params](const TensorList& t) { return conv2d(t[0], t[1], t[2], params); }, {x, w, b});
    // The input alone, no bias.
    check_gradients([params, w = w.detach()](const TensorList& t) { return conv2d(t[0], w, Tensor(), params); }, {x});
  }
}

TEST_CASE("grouped conv2d refuses channels the groups do not divide") {
  const Tensor x = Tensor::zeros({1, 4, 3, 3});
  CHECK_THROWS_WITH_AS(conv2d(x, Tensor::zeros({4, 1, 1, 1}), Tensor(), {.groups = 3}),
                       doctest::Contains("groups = 3 must divide the input channels (4)"), Error);
  CHECK_THROWS_WITH_AS(conv2d(x, Tensor::zeros({4, 1, 1, 1}), Tensor(), {.groups = 2}),
                       doctest::Contains("with groups = 2 expects 2"), Error);
  CHECK_THROWS_WITH_AS(conv2d(x, Tensor::zeros({4, 4, 1, 1}), Tensor(), {.groups = 0}),
                       doctest::Contains("groups must be positive"), Error);
}
