// conv2d: hand-computed forward values, backward against finite differences,
// and f16 / bf16 against f32.
#include <doctest/doctest.h>

#include "ops/conv2d.h"
#include "tests/support/gradcheck.h"

using namespace loom;
using loom::testing::check_gradients;
using loom::testing::random_tensor;
using loom::testing::relative_error;

namespace {
// x = [[1 2 3] [4 5 6] [7 8 9]], k = [[1 2] [3 4]]
Tensor image_3x3() { return Tensor::from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3}); }
Tensor kernel_2x2() { return Tensor::from_vector<float>({1, 2, 3, 4}, {1, 1, 2, 2}); }
}  // namespace

TEST_CASE("conv2d forward matches hand computation") {
  SUBCASE("stride 1, no padding, with bias") {
    Tensor y = conv2d(image_3x3(), kernel_2x2(), Tensor::from_vector<float>({0.5f}, {1}));
    CHECK(y.sizes() == Shape{1, 1, 2, 2});
    // 1*1+2*2+4*3+5*4 = 37, 2+6+15+24 = 47, 4+10+21+32 = 67, 5+12+24+36 = 77
    CHECK(y.to_vector<float>() == std::vector<float>{37.5f, 47.5f, 67.5f, 77.5f});
  }
  SUBCASE("stride 2, padding 1") {
    Tensor y = conv2d(image_3x3(), kernel_2x2(), Tensor(), {.stride = {2, 2}, .padding = {1, 1}});
    CHECK(y.sizes() == Shape{1, 1, 2, 2});
    // Windows start at rows / cols -1 and 1: (0,0) sees only x00 under k11;
    // (0,1) x01*k10 + x02*k11; (1,0) x10*k01 + x20*k11; (1,1) the full window.
    CHECK(y.to_vector<float>() == std::vector<float>{4, 2 * 3 + 3 * 4, 4 * 2 + 7 * 4, 77});
  }
  SUBCASE("dilation 2") {
    Tensor y = conv2d(image_3x3(), kernel_2x2(), Tensor(), {.dilation = {2, 2}});
    CHECK(y.sizes() == Shape{1, 1, 1, 1});
    CHECK(y.item() == 1 * 1 + 3 * 2 + 7 * 3 + 9 * 4);
  }
  SUBCASE("several channels, 1x1 kernel") {
    Tensor x = Tensor::from_vector<float>({1, 2, 3, 4}, {1, 2, 1, 2});        // channels [1 2], [3 4]
    Tensor w = Tensor::from_vector<float>({1, 10, 100, 1000}, {2, 2, 1, 1});  // out o = w[o,0]*c0 + w[o,1]*c1
    CHECK(conv2d(x, w).to_vector<float>() == std::vector<float>{31, 42, 3100, 4200});
  }
  SUBCASE("non-square kernel with asymmetric stride") {
    // 1x2 kernel [1 -1], stride (2, 1): rows 0 and 2, horizontal differences.
    Tensor w = Tensor::from_vector<float>({1, -1}, {1, 1, 1, 2});
    Tensor y = conv2d(image_3x3(), w, Tensor(), {.stride = {2, 1}});
    CHECK(y.sizes() == Shape{1, 1, 2, 2});
    CHECK(y.to_vector<float>() == std::vector<float>{-1, -1, -1, -1});
  }
}

TEST_CASE("conv2d rejects what it does not implement") {
  Tensor x = Tensor::zeros({1, 2, 4, 4});
  CHECK_THROWS_WITH_AS(conv2d(x, Tensor::zeros({2, 1, 3, 3}), Tensor(), {}, 2), doctest::Contains("groups"), Error);
  CHECK_THROWS_WITH_AS(conv2d(x, Tensor::zeros({2, 3, 3, 3})), doctest::Contains("channels"), Error);
  CHECK_THROWS_WITH_AS(conv2d(x, Tensor::zeros({2, 2, 5, 5})), doctest::Contains("kernel spans"), Error);
}

TEST_CASE("conv2d backward matches finite differences") {
  struct Case {
    const char* name;
    Shape input, weight;
    Conv2dParams params;
    bool bias;
  };
  const Case cases[] = {
      {"3x3, bias", {2, 3, 5, 5}, {4, 3, 3, 3}, {}, true},
      {"no bias", {2, 2, 4, 5}, {3, 2, 2, 3}, {}, false},
      {"stride 2, padding 1, odd sizes", {3, 2, 7, 5}, {2, 2, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}, true},
      {"padding 2, 5x5 kernel", {2, 1, 6, 6}, {3, 1, 5, 5}, {.padding = {2, 2}}, true},
      {"dilation 2", {2, 2, 7, 6}, {2, 2, 3, 2}, {.dilation = {2, 2}}, true},
      {"non-square everything", {2, 2, 5, 8}, {3, 2, 2, 4}, {.stride = {1, 3}, .padding = {2, 1}, .dilation = {1, 2}}, true},
      {"1x1 kernel", {3, 4, 3, 2}, {5, 4, 1, 1}, {}, true},
      {"1x1 kernel, stride 2", {2, 3, 5, 5}, {2, 3, 1, 1}, {.stride = {2, 2}}, false},
  };
  uint64_t seed = 10;
  for (const Case& c : cases) {
    INFO(c.name);
    Tensor x = random_tensor(c.input, seed++).set_requires_grad(true);
    Tensor w = random_tensor(c.weight, seed++).set_requires_grad(true);
    Tensor b = c.bias ? random_tensor({c.weight[0]}, seed++).set_requires_grad(true) : Tensor();
    const Conv2dParams params = c.params;
    if (c.bias) {
      check_gradients([&](const TensorList& t) { return conv2d(t[0], t[1], t[2], params); }, {x, w, b});
    } else {
      check_gradients([&](const TensorList& t) { return conv2d(t[0], t[1], Tensor(), params); }, {x, w});
    }
  }
}

TEST_CASE("conv2d in f16 and bf16 is close to f32") {
  // Inputs rounded to the low-precision type first, so the only differences
  // left are the f32 accumulation order and the rounding of the result.
  for (DType low : {DType::f16, DType::bf16}) {
    INFO(dtype_name(low));
    Tensor x = random_tensor({3, 4, 9, 9}, 1, -1, 1, DType::f32).to(low);
    Tensor w = random_tensor({6, 4, 3, 3}, 2, -1, 1, DType::f32).to(low);
    Tensor b = random_tensor({6}, 3, -1, 1, DType::f32).to(low);
    const Conv2dParams params{.stride = {2, 2}, .padding = {1, 1}};
    Tensor reference = conv2d(x.to(DType::f32), w.to(DType::f32), b.to(DType::f32), params);
    Tensor y = conv2d(x, w, b, params);
    CHECK(y.dtype() == low);
    const double tolerance = low == DType::f16 ? 1e-3 : 8e-3;  // about 2 ulps at the largest output
    CHECK(relative_error(y, reference) < tolerance);

    // Backward runs in the same dtype and gives the parameter dtype back.
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    conv2d(x, w, b, params).backward(Tensor::ones(reference.sizes(), low));
    CHECK(x.grad().dtype() == low);
    CHECK(w.grad().dtype() == low);
  }
}
