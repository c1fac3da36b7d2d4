// conv2d: hand-computed forward values, backward against finite differences,
// and f16 / bf16 against f32.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <loom/core/parallel.h>
#include <loom/ops/conv2d.h>
#include <loom/ops/cpu/conv2d_direct.h>
#include <loom/ops/cpu/gemm.h>
#include <loom/ops/cpu/winograd.h>
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

TEST_CASE("conv2d rejects shapes that do not fit") {
  Tensor x = Tensor::zeros({1, 2, 4, 4});
  // A (2, 1, 3, 3) weight is depthwise: it needs groups = 2.
  CHECK_THROWS_WITH_AS(conv2d(x, Tensor::zeros({2, 1, 3, 3})), doctest::Contains("with groups = 1 expects 1"), Error);
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

namespace {
// Direct convolution loops in f64: y, dx and dw for an upstream gradient dy.
struct DirectConv {
  std::vector<double> y, dx, dw;
};
DirectConv direct_conv(const Tensor& x_in, const Tensor& w_in, const Tensor& dy_in, const Conv2dParams& p) {
  const Tensor x = x_in.to(DType::f64), w = w_in.to(DType::f64), dy = dy_in.to(DType::f64);
  const int64_t n_images = x.size(0), c_in = x.size(1), h = x.size(2), wd = x.size(3);
  const int64_t c_out = w.size(0), kh = w.size(2), kw = w.size(3), oh = dy.size(2), ow = dy.size(3);
  const double* xs = x.data<double>();
  const double* ws = w.data<double>();
  const double* dys = dy.data<double>();
  DirectConv r{std::vector<double>(n_images * c_out * oh * ow), std::vector<double>(x.numel()),
               std::vector<double>(w.numel())};
  for (int64_t n = 0; n < n_images; ++n)
    for (int64_t o = 0; o < c_out; ++o)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          const int64_t out = ((n * c_out + o) * oh + i) * ow + j;
          for (int64_t c = 0; c < c_in; ++c)
            for (int64_t a = 0; a < kh; ++a)
              for (int64_t b = 0; b < kw; ++b) {
                const int64_t yy = i * p.stride[0] - p.padding[0] + a * p.dilation[0];
                const int64_t xx = j * p.stride[1] - p.padding[1] + b * p.dilation[1];
                if (yy < 0 || yy >= h || xx < 0 || xx >= wd) continue;
                const int64_t in = ((n * c_in + c) * h + yy) * wd + xx, k = ((o * c_in + c) * kh + a) * kw + b;
                r.y[out] += xs[in] * ws[k];
                r.dx[in] += dys[out] * ws[k];
                r.dw[k] += dys[out] * xs[in];
              }
        }
  return r;
}
double max_relative_difference(const Tensor& actual, const std::vector<double>& expected) {
  const std::vector<double> got = actual.to(DType::f64).to_vector<double>();
  REQUIRE(got.size() == expected.size());
  double scale = 1e-6, worst = 0;
  for (double e : expected) scale = std::max(scale, std::abs(e));
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - expected[i]) / scale);
  return worst;
}

// Adds bias[k] to every element of channel k of (N, K, P, Q) values whose planes hold `plane` elements.
void add_bias(std::vector<double>& y, const Tensor& bias, int64_t plane) {
  const std::vector<double> b = bias.to(DType::f64).to_vector<double>();
  for (size_t i = 0; i < y.size(); ++i) y[i] += b[(static_cast<int64_t>(i) / plane) % b.size()];
}

// y, dx and dw within `tolerance` (relative) of the direct loops'.
void check_matches_direct(const Tensor& y, const Tensor& dx, const Tensor& dw, const DirectConv& expected,
                          double tolerance) {
  CHECK(max_relative_difference(y, expected.y) < tolerance);
  CHECK(max_relative_difference(dx, expected.dx) < tolerance);
  CHECK(max_relative_difference(dw, expected.dw) < tolerance);
}

enum class Bias { none, random };

// conv2d in `dtype` on a random input and weight (and bias, with Bias::random)
// and backward from a random output gradient, drawn in that order from seeds
// `seed`, `seed` + 1, ...: y, dx and dw against the direct loops'.
void check_conv2d_matches_direct(const Shape& input, const Shape& weight, const Conv2dParams& params, Bias bias,
                                 uint64_t seed, DType dtype, double tolerance) {
  Tensor x = random_tensor(input, seed, -1, 1, dtype).set_requires_grad(true);
  Tensor w = random_tensor(weight, seed + 1, -1, 1, dtype).set_requires_grad(true);
  const Tensor b = bias == Bias::random ? random_tensor({weight[0]}, seed + 2, -1, 1, dtype) : Tensor();
  Tensor y = conv2d(x, w, b, params);
  Tensor dy = random_tensor(y.sizes(), bias == Bias::random ? seed + 3 : seed + 2, -1, 1, dtype);
  y.backward(dy);
  DirectConv expected = direct_conv(x.detach(), w.detach(), dy, params);
  if (bias == Bias::random) add_bias(expected.y, b, y.size(2) * y.size(3));
  check_matches_direct(y, x.grad(), w.grad(), expected, tolerance);
}

// An empty batch (`input` with N = 0) through the CPU kernels: an empty output
// of shape `output`, and a zero weight gradient.
void check_empty_batch(const Shape& input, const Shape& weight, const Conv2dParams& params, const Shape& output,
                       uint64_t seed) {
  const Tensor x = Tensor::zeros(input), w = random_tensor(weight, seed, -1, 1, DType::f32);
  CHECK(ops::cpu::conv2d_forward(x, w, Tensor(), params).sizes() == output);
  const Tensor dw = ops::cpu::conv2d_backward_weight(Tensor::zeros(output), x, w.sizes(), params);
  const std::vector<float> values = dw.to_vector<float>();
  CHECK(std::all_of(values.begin(), values.end(), [](float v) { return v == 0.0f; }));
}
}  // namespace

// The CPU kernels fold several images into one GEMM when the output plane is
// small and spread groups of images over threads; these shapes cover one image
// per GEMM, folds with a ragged last group, whole-batch folds whose GEMMs split
// their rows over the threads, 1x1 kernels (no im2col) in each of them, and
// kernels with taps that read only padding (left out of the GEMMs).
TEST_CASE("conv2d matches direct loops on batches folded into GEMMs, 1 and 2 threads") {
  struct Case {
    const char* name;
    Shape input, weight;
    Conv2dParams params;
  };
  const Case cases[] = {
      // (4 x 3 x 3 = 36 rows of the column matrix: above the direct kernels' 32.)
      {"large plane: one image per GEMM", {5, 4, 24, 24}, {4, 4, 3, 3}, {.padding = {1, 1}}},
      {"plane 49: folds of 5 images, ragged last group", {23, 6, 7, 7}, {5, 6, 3, 3}, {.padding = {1, 1}}},
      {"plane 1: the whole batch in one GEMM", {7, 40, 1, 1}, {30, 40, 3, 3}, {.padding = {1, 1}}},
      {"1x1 kernel, plane 4", {9, 16, 2, 2}, {24, 16, 1, 1}, {}},
      {"1x1 kernel, one image per GEMM", {3, 8, 24, 24}, {6, 8, 1, 1}, {}},
      {"1x1 stride 2", {13, 8, 4, 4}, {12, 8, 1, 1}, {.stride = {2, 2}}},
      // ResNet-50's 8x8 planes at 32x32 inputs: groups of 192 or 256 columns.
      {"1x1 kernel on 8x8 planes, 3 or 4 images per GEMM", {9, 16, 8, 8}, {24, 16, 1, 1}, {}},
      {"3x3 stride 2 onto 8x8 planes, 3 or 4 images per GEMM", {9, 8, 16, 16}, {12, 8, 3, 3},
       {.stride = {2, 2}, .padding = {1, 1}}},
      // f32 im2col by permutes of the input plane held in registers: 64 elements (four registers), 16 (one).
      {"3x3 on 8x8 planes (ResNet-50's layer1 at 32x32), 4 images per GEMM", {9, 8, 8, 8}, {12, 8, 3, 3},
       {.padding = {1, 1}}},
      {"3x3 stride 2 from 8x8 onto 4x4 planes", {9, 8, 8, 8}, {12, 8, 3, 3},
       {.stride = {2, 2}, .padding = {1, 1}}},
      // A column matrix of 256-column rows, stored 272 apart (gemm_b_stride) so the GEMM reads it in place.
      {"3x3 stride 2 onto 16x16 planes (ResNet-50's layer2 at 32x32), one image per GEMM", {3, 8, 32, 32},
       {12, 8, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}},
      {"stride 2 padding 3 7x7", {6, 3, 16, 16}, {8, 3, 7, 7}, {.stride = {2, 2}, .padding = {3, 3}}},
      // f32 im2col / col2im by even-lane permutes under the AVX-512 kernel (rows of 8 or 16 at stride 2):
      // an odd number of 8-wide output rows (the last chunk half stored), a 31-wide input whose last
      // output column reads padding under the right taps, dilation, and a 1x1 kernel onto 16x16.
      {"stride 2 onto 7 rows of 8", {5, 3, 13, 16}, {4, 3, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}},
      {"stride 2 onto rows of 16 from 31 columns", {3, 4, 9, 31}, {5, 4, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}},
      {"stride (1, 2), dilation 2, onto rows of 8", {3, 2, 6, 16}, {3, 2, 3, 3},
       {.stride = {1, 2}, .padding = {2, 2}, .dilation = {2, 2}}},
      {"1x1 stride 2 onto 16x16 planes", {3, 6, 32, 32}, {5, 6, 1, 1}, {.stride = {2, 2}}},
      {"batch 1", {1, 4, 3, 3}, {5, 4, 3, 3}, {.padding = {1, 1}}},
      {"2x2 -> 1x1 with stride 2: 4 of 9 taps read the image", {5, 6, 2, 2}, {7, 6, 3, 3},
       {.stride = {2, 2}, .padding = {1, 1}}},
      {"every output in the padding: no tap reads the image", {3, 2, 1, 1}, {4, 2, 1, 1},
       {.stride = {3, 3}, .padding = {1, 1}}},
      {"f32 rows up to 32 wide by masked loads: 5x5 padding 2 on 14x14", {3, 4, 14, 14}, {5, 4, 5, 5},
       {.padding = {2, 2}}},
      {"masked rows 32 wide, vertical stride 2, dilation 2, padding (1, 3)", {2, 3, 12, 30}, {4, 3, 3, 3},
       {.stride = {2, 1}, .padding = {1, 3}, .dilation = {1, 2}}},
      {"masked rows 3 wide and 30 tall, two images per GEMM", {5, 2, 30, 3}, {3, 2, 3, 3}, {.padding = {1, 1}}},
      {"plane 225 (copied by rows), stride 2, padding 2, dilation 2", {3, 2, 31, 29}, {3, 2, 5, 3},
       {.stride = {2, 2}, .padding = {2, 2}, .dilation = {2, 1}}},
      // Small planes where most (tap, position) pairs read the padding: a GEMM per position class.
      {"position classes: 3x3 on 2x2 planes, four corner classes", {9, 6, 2, 2}, {7, 6, 3, 3}, {.padding = {1, 1}}},
      // One group of images whose GEMM splits over the threads: the copies around it (im2col, the
      // output's scatter, col2im; the classes' gathers) split the group's images over the threads.
      {"3x3 on 4x4 planes, one group of 12 images: copies split over the threads", {12, 64, 4, 4},
       {512, 64, 3, 3}, {.padding = {1, 1}}},
      {"position classes on 2x2 planes, one group of 33 images: copies split over the threads", {33, 256, 2, 2},
       {8, 256, 3, 3}, {.padding = {1, 1}}},
      // 128 x 128 weight rows: the classes' taps gathered and spread in two ranges of rows, one per thread.
      {"position classes on 2x2 planes, 16384 weight rows split over the threads", {3, 128, 2, 2},
       {128, 128, 3, 3}, {.padding = {1, 1}}},
      {"position classes on 2x2 planes, 127 x 68 weight rows split mid-block", {2, 68, 2, 2}, {127, 68, 3, 3},
       {.padding = {1, 1}}},
      // 32 channels x 4 taps: the class weights' 128-float rows are stored 144 apart (gemm_b_stride).
      {"position classes: 3x3 on 2x2 planes, class weights in padded rows", {5, 32, 2, 2}, {9, 32, 3, 3},
       {.padding = {1, 1}}},
      {"3x3 on 4x4 planes: one GEMM over the padded plane (1.44x the true multiply-adds), ragged folds",
       {37, 5, 4, 4}, {6, 5, 3, 3}, {.padding = {1, 1}}},
      {"position classes: 3x3 on 3x3 planes, corners (4 taps), edges (6), centre (9), ragged folds", {37, 5, 3, 3},
       {6, 5, 3, 3}, {.padding = {1, 1}}},
      {"stride 2 onto a 2x2 plane from 4x4: one GEMM (1.44x)", {6, 4, 4, 4}, {5, 4, 3, 3},
       {.stride = {2, 2}, .padding = {1, 1}}},
      {"position classes: stride 2 onto a 2x2 plane from 3x3", {6, 4, 3, 3}, {5, 4, 3, 3},
       {.stride = {2, 2}, .padding = {1, 1}}},
      {"2x3 kernel, a 3x1 plane: one GEMM (1.33x)", {5, 3, 3, 1}, {4, 3, 2, 3}, {.padding = {1, 1}}},
      {"position classes: 2x3 kernel on 1x1 images, a 2x1 plane", {5, 3, 1, 1}, {4, 3, 2, 3}, {.padding = {1, 1}}},
      {"position classes: border outputs read only padding", {3, 2, 2, 2}, {4, 2, 1, 1}, {.padding = {1, 1}}},
  };
  const int saved_threads = get_num_threads();
  uint64_t seed = 300;
  for (const Case& c : cases) {
    for (DType dtype : {DType::f32, DType::f64}) {
      for (int threads : {1, 2}) {
        INFO(c.name << ", " << dtype_name(dtype) << ", " << threads << " threads");
        set_num_threads(threads);
        // Other values at each thread count: the kernels' scratch keeps what
        // the previous run wrote, which would hide a part the next one skips.
        const uint64_t run_seed = seed + 1000 * static_cast<uint64_t>(threads);
        check_conv2d_matches_direct(c.input, c.weight, c.params, Bias::none, run_seed, dtype,
                                    dtype == DType::f32 ? 1e-5 : 1e-12);
      }
    }
    seed += 3;
  }
  set_num_threads(saved_threads);
}

// The position classes' path writes each output once, bias included, also
// where every tap reads the padding (there the output is the bias alone).
TEST_CASE("conv2d on small padded planes adds the bias at every output position") {
  const int saved_threads = get_num_threads();
  for (int threads : {1, 2}) {
    for (const Conv2dParams& params : {Conv2dParams{.padding = {1, 1}}, Conv2dParams{.padding = {2, 2}}}) {
      INFO(threads << " threads, padding " << params.padding[0]);
      set_num_threads(threads);
      const Tensor x = random_tensor({5, 3, 2, 2}, 40, -1, 1, DType::f32);
      const Tensor w = random_tensor({4, 3, params.padding[0] == 1 ? 3 : 1, params.padding[0] == 1 ? 3 : 1}, 41, -1, 1,
                                     DType::f32);
      const Tensor b = random_tensor({4}, 42, -1, 1, DType::f32);
      const Tensor y = conv2d(x, w, b, params);
      const DirectConv expected = direct_conv(x, w, Tensor::zeros(y.sizes()), params);
      std::vector<double> with_bias = expected.y;
      add_bias(with_bias, b, y.size(2) * y.size(3));
      CHECK(max_relative_difference(y, with_bias) < 1e-5);
    }
  }
  set_num_threads(saved_threads);
}

// Winograd F(m x m, r x r) (ops/cpu/winograd.h): every tile size of both
// kernel sizes called directly, and conv2d's f32 dispatch on the shapes it
// picks Winograd for (ragged tiles, padding 0 and uneven padding, chunks of
// images spread over threads), all against the f64 direct loops.
namespace {
struct WinogradCase {
  const char* name;
  Shape input, weight;  // square kernels, stride 1
  Size2 padding;
  ops::cpu::winograd::Problem problem() const {
    const int64_t r = weight[2];
    return {input[0], input[1], input[2], input[3], weight[0], r, padding[0], padding[1],
            input[2] + 2 * padding[0] - r + 1, input[3] + 2 * padding[1] - r + 1};
  }
};

// A case's random f32 input, weight, bias and output gradient from `seed`,
// and the f64 direct loops' results for them (y with the bias added).
struct WinogradData {
  Tensor x, w, b, dy;
  DirectConv expected;
};
WinogradData random_winograd_data(const WinogradCase& c, uint64_t seed) {
  const ops::cpu::winograd::Problem p = c.problem();
  WinogradData d;
  d.x = random_tensor(c.input, seed, -1, 1, DType::f32);
  d.w = random_tensor(c.weight, seed + 1, -1, 1, DType::f32);
  d.b = random_tensor({c.weight[0]}, seed + 2, -1, 1, DType::f32);
  d.dy = random_tensor({p.batch, p.out_channels, p.out_h, p.out_w}, seed + 3, -1, 1, DType::f32);
  d.expected = direct_conv(d.x, d.w, d.dy, {.padding = c.padding});
  add_bias(d.expected.y, d.b, p.out_h * p.out_w);
  return d;
}

// How close (relative) the Winograd paths' y, dx and dw come to the direct loops'.
constexpr double kWinogradTolerance = 2e-5;
}  // namespace

TEST_CASE("Winograd convolution matches direct loops for every tile size") {
  const WinogradCase cases[] = {
      {"5x5, padding 2, 14x14 (the ConvNet's second conv)", {3, 16, 14, 14}, {32, 16, 5, 5}, {2, 2}},
      {"5x5, padding (1, 3), 13x11: ragged tiles", {2, 9, 13, 11}, {10, 9, 5, 5}, {1, 3}},
      {"3x3, padding 1, 9x10", {2, 8, 9, 10}, {11, 8, 3, 3}, {1, 1}},
      {"3x3, no padding, 12x7", {3, 5, 12, 7}, {4, 5, 3, 3}, {0, 0}},
      {"3x3, padding 1, 18x17: rows of 4 tiles and a tail", {2, 8, 18, 17}, {6, 8, 3, 3}, {1, 1}},
  };
  uint64_t seed = 900;
  for (const WinogradCase& c : cases) {
    const int64_t r = c.weight[2];
    const ops::cpu::winograd::Problem p = c.problem();
    const auto [x, w, b, dy, expected] = random_winograd_data(c, seed);
    for (int m = 2; m + r - 1 <= 8; ++m) {
      INFO(c.name << ", F(" << m << ", " << r << ")");
      Tensor y = Tensor::empty(dy.sizes(), DType::f32), dx = Tensor::empty(c.input, DType::f32);
      Tensor dw = Tensor::empty(c.weight, DType::f32);
      ops::cpu::winograd::forward(x.data<float>(), w.data<float>(), b.data<float>(), p, m, y.data<float>());
      ops::cpu::winograd::backward_input(dy.data<float>(), w.data<float>(), p, m, dx.data<float>());
      ops::cpu::winograd::backward_weight(dy.data<float>(), x.data<float>(), p, m, dw.data<float>());
      check_matches_direct(y, dx, dw, expected, kWinogradTolerance);
    }
    seed += 4;
  }
}

TEST_CASE("conv2d uses Winograd for 3x3 and 5x5 f32 convolutions with enough channels, and matches direct loops") {
  const WinogradCase cases[] = {
      {"the ConvNet's second conv, batch 20", {20, 16, 14, 14}, {32, 16, 5, 5}, {2, 2}},
      {"no padding, 12x12 -> 8x8", {3, 8, 12, 12}, {8, 8, 5, 5}, {0, 0}},
      {"odd plane 13x11 with padding (2, 1)", {5, 12, 13, 11}, {9, 12, 5, 5}, {2, 1}},
      {"40 images of 8x8: several chunks", {40, 8, 8, 8}, {8, 8, 5, 5}, {2, 2}},
      {"ResNet's 3x3 on 8x8 planes", {6, 16, 8, 8}, {16, 16, 3, 3}, {1, 1}},
      {"3x3 on 18x17 planes: rows of 4 tiles and a tail", {3, 8, 18, 17}, {12, 8, 3, 3}, {1, 1}},
      {"3x3, no padding, 40 images: several chunks", {40, 8, 10, 10}, {8, 8, 3, 3}, {0, 0}},
      // Below 8x8: F(2x2, 3x3)
      {"ResNet-50's layer4 3x3 on 4x4 planes, 512 channels", {3, 512, 4, 4}, {512, 512, 3, 3}, {1, 1}},
  };
  const bool avx2 = ops::cpu::gemm_kernel_supported(ops::cpu::GemmKernel::avx2_fma);
  // Where im2col + GEMM stays: 4x4 planes with fewer than 512 channels or 5x5 kernels, fewer than 8
  // channels, kernels other than 3x3 and 5x5.
  const ops::cpu::winograd::Problem im2col[] = {
      {32, 256, 4, 4, 256, 3, 1, 1, 4, 4},    {32, 512, 4, 4, 512, 5, 2, 2, 4, 4},
      {32, 512, 2, 2, 512, 3, 1, 1, 2, 2},    {32, 3, 32, 32, 64, 3, 1, 1, 32, 32},
      {32, 64, 8, 8, 64, 1, 0, 0, 8, 8},      {32, 64, 14, 14, 64, 7, 3, 3, 14, 14}};
  for (const ops::cpu::winograd::Problem& p : im2col) CHECK(ops::cpu::winograd::tile_for(p) == 0);
  const int saved_threads = get_num_threads();
  uint64_t seed = 950;
  for (const WinogradCase& c : cases) {
    const int tile = c.input[2] < 8 ? 2 : 4;
    REQUIRE(ops::cpu::winograd::tile_for(c.problem()) == (avx2 ? tile : 0));
    for (int threads : {1, 2}) {
      INFO(c.name << ", " << threads << " threads");
      set_num_threads(threads);
      check_conv2d_matches_direct(c.input, c.weight, {.padding = c.padding}, Bias::none, seed, DType::f32,
                                  kWinogradTolerance);
    }
    seed += 3;
  }
  set_num_threads(saved_threads);
}

// F(4x4, 3x3) and F(4x4, 5x5) with channel counts that are multiples of 16
// (at most 128) run channels-last under the AVX-512 GEMM kernel, tile-major
// otherwise: both paths on the same shapes (ragged tiles, uneven and no
// padding, 16-channel and 32-channel column blocks, plane rows of several
// 16-pixel blocks, several chunks over 1 and 2 threads), against the f64
// direct loops.
TEST_CASE("Winograd's channels-last and tile-major paths both match direct loops") {
  // The channels-last path is compiled by GCC only (winograd.cpp).
#if defined(__x86_64__) && !defined(__clang__)
  constexpr bool kChannelsLastBuilt = true;
#else
  constexpr bool kChannelsLastBuilt = false;
  MESSAGE("not built with GCC on x86-64: the channels-last path is not in this build");
#endif
  const WinogradCase cases[] = {
      {"the ConvNet's second conv, batch 9", {9, 16, 14, 14}, {32, 16, 5, 5}, {2, 2}},
      {"32 -> 48, 3x3 on 11x13, padding (1, 0)", {5, 32, 11, 13}, {48, 32, 3, 3}, {1, 0}},
      {"128 -> 16, 5x5, no padding, 12x12 -> 8x8", {3, 128, 12, 12}, {16, 128, 5, 5}, {0, 0}},
      {"16 -> 16, 3x3 on 8x8, 37 images: several chunks", {37, 16, 8, 8}, {16, 16, 3, 3}, {1, 1}},
      {"16 -> 32, 3x3 on 10x37: rows of 3 blocks of 16 pixels", {2, 16, 10, 37}, {32, 16, 3, 3}, {1, 1}},
      {"64 -> 128, 3x3 on 8x8: weight transforms split over threads", {3, 64, 8, 8}, {128, 64, 3, 3}, {1, 1}},
  };
  const ops::cpu::GemmKernel saved_kernel = ops::cpu::gemm_kernel();
  std::vector<ops::cpu::GemmKernel> kernels;
  for (ops::cpu::GemmKernel k : {ops::cpu::GemmKernel::avx512, ops::cpu::GemmKernel::avx2_fma}) {
    if (ops::cpu::gemm_kernel_supported(k)) kernels.push_back(k);
  }
  if (kernels.empty()) MESSAGE("no AVX2: Winograd is off, these shapes run on im2col + GEMM");
  if (!ops::cpu::gemm_kernel_supported(ops::cpu::GemmKernel::avx512)) {
    MESSAGE("no AVX-512: the channels-last path is not tested here");
  }
  // Where it does not apply: 8 or 144 channels, F(2x2, 3x3).
  CHECK_FALSE(ops::cpu::winograd::channels_last({2, 8, 8, 8, 16, 3, 1, 1, 8, 8}, 4));
  CHECK_FALSE(ops::cpu::winograd::channels_last({2, 144, 8, 8, 16, 3, 1, 1, 8, 8}, 4));
  CHECK_FALSE(ops::cpu::winograd::channels_last({2, 16, 8, 8, 16, 3, 1, 1, 8, 8}, 2));
  const int saved_threads = get_num_threads();
  uint64_t seed = 1200;
  for (ops::cpu::GemmKernel kernel : kernels) {
    ops::cpu::set_gemm_kernel(kernel);
    for (const WinogradCase& c : cases) {
      const ops::cpu::winograd::Problem p = c.problem();
      REQUIRE(ops::cpu::winograd::tile_for(p) == 4);
      CHECK(ops::cpu::winograd::channels_last(p, 4) == (kChannelsLastBuilt && kernel == ops::cpu::GemmKernel::avx512));
      const auto [x, w, b, dy, expected] = random_winograd_data(c, seed);
      for (int threads : {1, 2}) {
        INFO(c.name << ", kernel " << ops::cpu::gemm_kernel_name(kernel) << ", " << threads << " threads");
        set_num_threads(threads);
        Tensor y = Tensor::empty(dy.sizes(), DType::f32), dx = Tensor::empty(c.input, DType::f32);
        Tensor dw = Tensor::empty(c.weight, DType::f32), dx2 = Tensor::empty(c.input, DType::f32);
        Tensor dw2 = Tensor::empty(c.weight, DType::f32);
        ops::cpu::winograd::forward(x.data<float>(), w.data<float>(), b.data<float>(), p, 4, y.data<float>());
        ops::cpu::winograd::backward_input(dy.data<float>(), w.data<float>(), p, 4, dx.data<float>());
        ops::cpu::winograd::backward_weight(dy.data<float>(), x.data<float>(), p, 4, dw.data<float>());
        ops::cpu::winograd::backward(dy.data<float>(), x.data<float>(), w.data<float>(), p, 4, dx2.data<float>(),
                                     dw2.data<float>());
        check_matches_direct(y, dx, dw, expected, kWinogradTolerance);
        CHECK(max_relative_difference(dx2, expected.dx) < kWinogradTolerance);
        CHECK(max_relative_difference(dw2, expected.dw) < kWinogradTolerance);
      }
      seed += 4;
    }
    check_empty_batch({0, 16, 14, 14}, {32, 16, 5, 5}, {.padding = {2, 2}}, {0, 32, 14, 14}, seed);
  }
  ops::cpu::set_gemm_kernel(saved_kernel);
  set_num_threads(saved_threads);
}

// Thin column matrices (C * kh * kw <= 32, unit stride) run on the direct
// kernels under the AVX-512 GEMM kernel: the forward and the weight gradient
// (the input gradient stays im2col + GEMM). Shapes: the ConvNet's first conv,
// the CIFAR stem's, output rows that end inside a 16-float chunk or leave a
// whole chunk empty, kernels wider than a block of 5 columns, output channels
// that do not fill a block of 8 or 4, no padding and uneven padding.
TEST_CASE("conv2d runs thin f32 convolutions on the direct kernels and matches direct loops") {
  struct Case {
    const char* name;
    Shape input, weight;
    Size2 padding;
  };
  const Case cases[] = {
      {"the ConvNet's first conv, batch 7", {7, 1, 28, 28}, {16, 1, 5, 5}, {2, 2}},
      {"the CIFAR stem, 10 output channels", {3, 3, 32, 32}, {10, 3, 3, 3}, {1, 1}},
      {"rows of 17: a second chunk of 1", {4, 2, 9, 17}, {5, 2, 3, 3}, {1, 1}},
      {"rows of 40: three chunks, a fourth empty", {2, 1, 6, 40}, {3, 1, 3, 3}, {1, 1}},
      {"a 2x7 kernel: two blocks of columns, no padding", {3, 2, 8, 20}, {9, 2, 2, 7}, {0, 0}},
      {"padding (0, 3), rows of 8", {5, 1, 5, 8}, {4, 1, 3, 7}, {0, 3}},
  };
  const bool avx512 = ops::cpu::gemm_kernel() == ops::cpu::GemmKernel::avx512;
  if (!avx512) MESSAGE("the GEMM kernel is not AVX-512 (no AVX-512, or LOOM_CPU_GEMM): these shapes run on im2col + GEMM");
  // Where they do not apply: 36 rows of the column matrix, output rows of 7.
  CHECK_FALSE(ops::cpu::direct::applies({2, 4, 24, 24, 4, 3, 3, 1, 1, 24, 24}));
  CHECK_FALSE(ops::cpu::direct::applies({2, 1, 7, 7, 4, 3, 3, 1, 1, 7, 7}));
  // A GEMM kernel other than AVX-512 (LOOM_CPU_GEMM=avx2-fma) keeps them off.
  if (avx512) {
    ops::cpu::set_gemm_kernel(ops::cpu::GemmKernel::avx2_fma);
    CHECK_FALSE(ops::cpu::direct::applies({7, 1, 28, 28, 16, 5, 5, 2, 2, 28, 28}));
    ops::cpu::set_gemm_kernel(ops::cpu::GemmKernel::avx512);
  }
  const int saved_threads = get_num_threads();
  uint64_t seed = 1200;
  for (const Case& c : cases) {
    const ops::cpu::direct::Problem problem{c.input[0], c.input[1], c.input[2], c.input[3], c.weight[0],
                                            c.weight[2], c.weight[3], c.padding[0], c.padding[1],
                                            c.input[2] + 2 * c.padding[0] - c.weight[2] + 1,
                                            c.input[3] + 2 * c.padding[1] - c.weight[3] + 1};
    REQUIRE(ops::cpu::direct::applies(problem) == avx512);
    for (int threads : {1, 2}) {
      INFO(c.name << ", " << threads << " threads");
      set_num_threads(threads);
      check_conv2d_matches_direct(c.input, c.weight, {.padding = c.padding}, Bias::random, seed, DType::f32, 1e-5);
    }
    seed += 4;
  }
  // An empty batch: an empty output and a zero weight gradient.
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    check_empty_batch({0, 1, 28, 28}, {16, 1, 5, 5}, {.padding = {2, 2}}, {0, 16, 28, 28}, seed);
  }
  set_num_threads(saved_threads);
}
