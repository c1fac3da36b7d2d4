// batch_norm: hand-computed forward values and running-stat updates, backward
// against finite differences, the split into SyncBatchNorm's steps, and
// f16 / bf16 inputs with f32 parameters; the fused ops (ReLU, add + ReLU,
// ReLU + 2x2 max pool) against the ops apart.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include <loom/ops/batch_norm.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/pooling.h>
#include "tests/support/gradcheck.h"

using namespace loom;
using loom::testing::check_gradients;
using loom::testing::max_abs_diff;
using loom::testing::random_tensor;
using loom::testing::relative_error;

namespace {
// Within 1e-12 of values computed by hand.
void check_values(const Tensor& t, const std::vector<double>& expected) {
  loom::testing::check_values_near(t, expected, 1e-12);
}
}  // namespace

TEST_CASE("batch_norm forward and running statistics match hand computation") {
  // (N, C, H, W) = (2, 2, 1, 1): channel 0 holds {1, 3}, channel 1 holds {2, 6}.
  Tensor x = Tensor::from_vector<double>({1, 2, 3, 6}, {2, 2, 1, 1});
  Tensor weight = Tensor::from_vector<double>({2, 3}, {2});
  Tensor bias = Tensor::from_vector<double>({0.5, -1}, {2});

  SUBCASE("training: batch statistics, running stats updated") {
    Tensor running_mean = Tensor::zeros({2}, DType::f64);
    Tensor running_var = Tensor::ones({2}, DType::f64);
    // mean (2, 4), biased var (1, 4), so xhat = -1, +1 in both channels (eps = 0).
    Tensor y = batch_norm(x, weight, bias, running_mean, running_var, /*training=*/true, 0.1, 0.0);
    check_values(y, {-1 * 2 + 0.5, -1 * 3 - 1, 1 * 2 + 0.5, 1 * 3 - 1});
    // running_mean = 0.9 * 0 + 0.1 * mean; running_var = 0.9 * 1 + 0.1 * unbiased var (2, 8)
    check_values(running_mean, {0.2, 0.4});
    check_values(running_var, {0.9 + 0.2, 0.9 + 0.8});
  }
  SUBCASE("training without affine or running stats") {
    check_values(batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 0.0), {-1, -1, 1, 1});
  }
  SUBCASE("eval: running statistics, left unchanged") {
    Tensor running_mean = Tensor::from_vector<double>({1, 2}, {2});
    Tensor running_var = Tensor::from_vector<double>({4, 0.25}, {2});  // invstd 0.5, 2
    Tensor y = batch_norm(x, weight, bias, running_mean, running_var, /*training=*/false, 0.1, 0.0);
    // channel 0: (1-1)*0.5, (3-1)*0.5 -> 0, 1; channel 1: (2-2)*2, (6-2)*2 -> 0, 8
    check_values(y, {0 * 2 + 0.5, 0 * 3 - 1, 1 * 2 + 0.5, 8 * 3 - 1});
    check_values(running_mean, {1, 2});
    check_values(running_var, {4, 0.25});
  }
  SUBCASE("an (N, C) input normalises each column") {
    Tensor flat = Tensor::from_vector<double>({1, 2, 3, 6}, {2, 2});
    check_values(batch_norm(flat, weight, bias, Tensor(), Tensor(), true, 0.1, 0.0), {-1.5, -4, 2.5, 2});
  }
}

TEST_CASE("batch_norm rejects inputs it cannot normalise") {
  CHECK_THROWS_WITH_AS(batch_norm(Tensor::zeros({1, 3, 1, 1}), Tensor(), Tensor(), Tensor(), Tensor(), true),
                       doctest::Contains("more than one value per channel"), Error);
  CHECK_THROWS_WITH_AS(batch_norm(Tensor::zeros({2, 3}), Tensor(), Tensor(), Tensor(), Tensor(), false),
                       doctest::Contains("running statistics"), Error);
  CHECK_THROWS_WITH_AS(batch_norm(Tensor::zeros({2, 3}), Tensor::ones({4}), Tensor(), Tensor(), Tensor(), true),
                       doctest::Contains("weight"), Error);
}

TEST_CASE("batch_norm backward matches finite differences") {
  Tensor weight = random_tensor({3}, 21, 0.5, 1.5).set_requires_grad(true);
  Tensor bias = random_tensor({3}, 22).set_requires_grad(true);
  SUBCASE("training, (N, C, H, W), affine, running stats tracked") {
    Tensor x = random_tensor({4, 3, 3, 5}, 23, -2, 3).set_requires_grad(true);
    Tensor running_mean = Tensor::zeros({3}, DType::f64), running_var = Tensor::ones({3}, DType::f64);
    check_gradients(
        [&](const TensorList& t) { return batch_norm(t[0], t[1], t[2], running_mean, running_var, true); },
        {x, weight, bias});
  }
  SUBCASE("training, (N, C, H, W), no affine") {
    Tensor x = random_tensor({3, 3, 4, 2}, 24).set_requires_grad(true);
    check_gradients([](const TensorList& t) { return batch_norm(t[0], Tensor(), Tensor(), Tensor(), Tensor(), true); },
                    {x});
  }
  SUBCASE("training, (N, C)") {
    Tensor x = random_tensor({6, 3}, 25).set_requires_grad(true);
    check_gradients([](const TensorList& t) { return batch_norm(t[0], t[1], t[2], Tensor(), Tensor(), true); },
                    {x, weight, bias});
  }
  SUBCASE("training, 2x2 planes, 70 channels (two blocks of the short-row reduction), fused relu") {
    Tensor x = random_tensor({3, 70, 2, 2}, 29, -2, 3).set_requires_grad(true);
    Tensor w = random_tensor({70}, 30, 0.5, 1.5).set_requires_grad(true);
    Tensor b = random_tensor({70}, 31).set_requires_grad(true);
    check_gradients(
        [](const TensorList& t) {
          return batch_norm(t[0], t[1], t[2], Tensor(), Tensor(), true, 0.1, 1e-5, Activation::relu);
        },
        {x, w, b});
  }
  SUBCASE("eval") {
    Tensor x = random_tensor({3, 3, 2, 3}, 26).set_requires_grad(true);
    Tensor running_mean = random_tensor({3}, 27), running_var = random_tensor({3}, 28, 0.5, 2.0);
    check_gradients(
        [&](const TensorList& t) { return batch_norm(t[0], t[1], t[2], running_mean, running_var, false); },
        {x, weight, bias});
  }
}

TEST_CASE("batch_norm steps compose across a split batch as SyncBatchNorm will use them") {
  // Two "ranks" holding halves of one batch: summing their stats and gradient
  // sums must reproduce the single-process op on the whole batch.
  namespace cpu = ops::cpu;
  Tensor x = random_tensor({6, 4, 3, 3}, 31, -1, 2);
  Tensor weight = random_tensor({4}, 32, 0.5, 1.5), bias = random_tensor({4}, 33);
  Tensor dy = random_tensor({6, 4, 3, 3}, 34);
  const double eps = 1e-5;

  Tensor whole = x.detach().set_requires_grad(true);
  Tensor expected = batch_norm(whole, weight, bias, Tensor(), Tensor(), true, 0.1, eps);
  expected.backward(dy);

  NoGradGuard no_grad;
  const Tensor halves[2] = {x.slice(0, 0, 3).contiguous(), x.slice(0, 3, 6).contiguous()};
  const Tensor dy_halves[2] = {dy.slice(0, 0, 3).contiguous(), dy.slice(0, 3, 6).contiguous()};
  const int64_t count = 6 * 3 * 3;
  // The total known on the host, and (as SyncBatchNorm passes it) summed in a
  // tensor, with one half's count as the host's lower bound: the kernels
  // must divide by the tensor's.
  const StatisticsCount totals[2] = {count, {count / 2, Tensor::full({1}, static_cast<double>(count), DType::f64)}};
  for (const StatisticsCount& total : totals) {
    INFO("total ", total.total.defined() ? "in a tensor" : "known");
    Tensor stats = cpu::batch_norm_stats(halves[0]);
    stats.add_(cpu::batch_norm_stats(halves[1]));  // the all-reduce
    Tensor mean_var = cpu::batch_norm_gather_stats(stats, total, Tensor(), Tensor(), 0.1);
    Tensor mean = mean_var.slice(0, 0, 1).reshape({4}), var = mean_var.slice(0, 1, 2).reshape({4});
    Tensor sums = cpu::batch_norm_backward_reduce(dy_halves[0], halves[0], mean, var, eps);
    sums.add_(cpu::batch_norm_backward_reduce(dy_halves[1], halves[1], mean, var, eps));  // the all-reduce
    for (int r = 0; r < 2; ++r) {
      Tensor y = cpu::batch_norm_apply(halves[r], mean, var, weight, bias, eps);
      CHECK(max_abs_diff(y, expected.slice(0, 3 * r, 3 * r + 3)) < 1e-12);
      Tensor dx = cpu::batch_norm_backward_apply(dy_halves[r], halves[r], mean, var, weight, sums, total, eps);
      CHECK(max_abs_diff(dx, whole.grad().slice(0, 3 * r, 3 * r + 3)) < 1e-12);
    }
  }
}

TEST_CASE("batch_norm kernels refuse a malformed total count") {
  namespace cpu = ops::cpu;
  const Tensor stats = Tensor::full({2, 3}, 1.0, DType::f64);
  CHECK_THROWS_WITH(cpu::batch_norm_gather_stats(stats, 0, Tensor(), Tensor(), 0.1),
                    doctest::Contains("statistics over 0 elements"));
  CHECK_THROWS_WITH(cpu::batch_norm_gather_stats(stats, {4, Tensor::full({1}, 8.0, DType::f32)}, Tensor(), Tensor(), 0.1),
                    doctest::Contains("the total count must be an f64 tensor of one element"));
  CHECK_THROWS_WITH(cpu::batch_norm_gather_stats(stats, {4, Tensor::full({2}, 8.0, DType::f64)}, Tensor(), Tensor(), 0.1),
                    doctest::Contains("the total count must be an f64 tensor of one element"));
}

TEST_CASE("batch_norm with f16 and bf16 inputs keeps f32 parameters") {
  for (DType low : {DType::f16, DType::bf16}) {
    INFO(dtype_name(low));
    Tensor x = random_tensor({4, 3, 5, 5}, 41, -2, 4, DType::f32).to(low);
    Tensor weight = random_tensor({3}, 42, 0.5, 1.5, DType::f32).set_requires_grad(true);
    Tensor bias = random_tensor({3}, 43, -1, 1, DType::f32).set_requires_grad(true);
    Tensor running_mean = Tensor::zeros({3}), running_var = Tensor::ones({3});
    Tensor reference_mean = Tensor::zeros({3}), reference_var = Tensor::ones({3});
    Tensor reference = batch_norm(x.to(DType::f32), weight, bias, reference_mean, reference_var, true);
    Tensor y = batch_norm(x, weight, bias, running_mean, running_var, true);
    CHECK(y.dtype() == low);
    // Normalised outputs are O(3): f16 rounds to ~2e-3, bf16 to ~2e-2 there.
    CHECK(relative_error(y, reference) < (low == DType::f16 ? 1e-3 : 8e-3));
    // The statistics come from the same (rounded) values, so the buffers agree to f32 precision.
    CHECK(max_abs_diff(running_mean, reference_mean) < 1e-6);
    CHECK(max_abs_diff(running_var, reference_var) < 1e-6);
    weight.set_grad(Tensor());
    sum(y.to(DType::f32)).backward();
    CHECK(weight.grad().dtype() == DType::f32);
    CHECK(bias.grad().dtype() == DType::f32);
  }
}

// The f32 statistics (vectorised row sums: 16 lanes, then 8, then a scalar
// tail) against the f64 ones of the same values: rows of 25 (a block of
// channels at a time), 64, 81, 100 and 784 elements.
TEST_CASE("batch_norm statistics of f32 inputs equal the f64 ones to f32 precision") {
  for (const Shape& shape : {Shape{3, 4, 5, 5}, Shape{2, 3, 8, 8}, Shape{3, 2, 9, 9}, Shape{2, 3, 10, 10},
                             Shape{2, 2, 28, 28}}) {
    INFO(shape_str(shape));
    const int64_t channels = shape[1];
    Tensor x = random_tensor(shape, 44, 1, 3, DType::f32);  // a mean of 2: the sums of squares are large
    Tensor mean32 = Tensor::zeros({channels}), var32 = Tensor::ones({channels});
    Tensor mean64 = Tensor::zeros({channels}, DType::f64), var64 = Tensor::ones({channels}, DType::f64);
    batch_norm(x, Tensor(), Tensor(), mean32, var32, true, 1.0, 0.0);
    batch_norm(x.to(DType::f64), Tensor(), Tensor(), mean64, var64, true, 1.0, 0.0);
    // momentum 1: the buffers hold this batch's mean and unbiased variance (about 2 and 1/3).
    CHECK(max_abs_diff(mean32.to(DType::f64), mean64) < 2e-6);
    CHECK(max_abs_diff(var32.to(DType::f64), var64) < 2e-5);
  }
}

TEST_CASE("batch_norm with a fused relu equals relu(batch_norm) and its gradients match finite differences") {
  using loom::testing::check_gradients;
  using loom::testing::random_tensor;
  Tensor x = random_tensor({3, 4, 5, 6}, 41).set_requires_grad(true);
  Tensor w = random_tensor({4}, 42, 0.5, 1.5).set_requires_grad(true);
  Tensor b = random_tensor({4}, 43).set_requires_grad(true);
  for (bool training : {true, false}) {
    INFO("training ", training);
    Tensor rm = random_tensor({4}, 44), rv = random_tensor({4}, 45, 0.5, 2.0);
    Tensor fused = batch_norm(x, w, b, rm.clone(), rv.clone(), training, 0.1, 1e-5, Activation::relu);
    Tensor composed = relu(batch_norm(x, w, b, rm.clone(), rv.clone(), training, 0.1, 1e-5));
    CHECK(loom::testing::max_abs_diff(fused, composed) == 0);
    check_gradients(
        [&](const TensorList& t) {
          return batch_norm(t[0], t[1], t[2], rm.clone(), rv.clone(), training, 0.1, 1e-5, Activation::relu);
        },
        {x, w, b});
  }
}

// f32 takes the vectorised backward reduction (AVX2 where the CPU has it):
// rows of 35 and 81 elements cover its 16- and 8-wide steps and the scalar
// tail; fused and composed must agree on the mask everywhere and on the
// gradients up to f32 summation order.
TEST_CASE("batch_norm with a fused relu in f32: gradients equal relu(batch_norm)'s") {
  using loom::testing::random_tensor;
  for (const Shape& shape : {Shape{4, 3, 5, 7}, Shape{2, 5, 9, 9}}) {
    const int64_t channels = shape[1];
    Tensor x = random_tensor(shape, 51, -1, 1, DType::f32);
    Tensor w = random_tensor({channels}, 52, 0.5, 1.5, DType::f32);
    Tensor b = random_tensor({channels}, 53, -0.5, 0.5, DType::f32);
    Tensor dy = random_tensor(shape, 54, -1, 1, DType::f32);
    auto gradients = [&](bool fused) {
      Tensor xi = x.clone().set_requires_grad(true), wi = w.clone().set_requires_grad(true);
      Tensor bi = b.clone().set_requires_grad(true);
      Tensor rm = Tensor::zeros({channels}), rv = Tensor::ones({channels});
      Tensor y = fused ? batch_norm(xi, wi, bi, rm, rv, true, 0.1, 1e-5, Activation::relu)
                       : relu(batch_norm(xi, wi, bi, rm, rv, true, 0.1, 1e-5));
      y.backward(dy);
      return std::vector<Tensor>{y, xi.grad(), wi.grad(), bi.grad()};
    };
    const auto fused = gradients(true), composed = gradients(false);
    CHECK(loom::testing::max_abs_diff(fused[0], composed[0]) == 0);
    for (size_t i = 1; i < fused.size(); ++i) {
      INFO("gradient ", i);
      CHECK(loom::testing::max_abs_diff(fused[i], composed[i]) < 2e-5);
    }
  }
}

// The ResNet block's tail, relu(batch_norm(x) + residual), as one op: the same
// output and running statistics as the three ops, and gradients for the input,
// the residual and both parameters against finite differences.
TEST_CASE("batch_norm_add_relu equals relu(batch_norm + residual) and its gradients match finite differences") {
  using loom::testing::check_gradients;
  using loom::testing::random_tensor;
  Tensor x = random_tensor({3, 4, 5, 6}, 61).set_requires_grad(true);
  Tensor r = random_tensor({3, 4, 5, 6}, 62).set_requires_grad(true);
  Tensor w = random_tensor({4}, 63, 0.5, 1.5).set_requires_grad(true);
  Tensor b = random_tensor({4}, 64).set_requires_grad(true);
  for (bool training : {true, false}) {
    INFO("training ", training);
    const Tensor rm = random_tensor({4}, 65), rv = random_tensor({4}, 66, 0.5, 2.0);
    Tensor fused_mean = rm.clone(), fused_var = rv.clone(), composed_mean = rm.clone(), composed_var = rv.clone();
    Tensor fused = batch_norm_add_relu(x, r, w, b, fused_mean, fused_var, training, 0.1, 1e-5);
    Tensor composed = relu(add(batch_norm(x, w, b, composed_mean, composed_var, training, 0.1, 1e-5), r));
    CHECK(loom::testing::max_abs_diff(fused, composed) == 0);
    CHECK(loom::testing::max_abs_diff(fused_mean, composed_mean) == 0);
    CHECK(loom::testing::max_abs_diff(fused_var, composed_var) == 0);
    check_gradients(
        [&](const TensorList& t) {
          return batch_norm_add_relu(t[0], t[1], t[2], t[3], rm.clone(), rv.clone(), training, 0.1, 1e-5);
        },
        {x, r, w, b});
  }
  // No affine parameters, and a residual that needs no gradient.
  check_gradients(
      [&](const TensorList& t) {
        return batch_norm_add_relu(t[0], r.detach(), Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5);
      },
      {x});
  CHECK_THROWS_WITH_AS(batch_norm_add_relu(x, random_tensor({3, 4, 5, 5}, 67), w, b, Tensor(), Tensor(), true),
                       doctest::Contains("must have the input's shape"), loom::Error);
}

TEST_CASE("batch_norm_add_relu in f32: output and gradients equal the three ops'") {
  using loom::testing::random_tensor;
  // Backward masks and sums in one pass (batch_norm_backward_reduce_relu_output);
  // the three ops mask, then sum: the same arithmetic in the same order. Planes
  // of 2x2 (ResNet's layer3 at 32x32, summed image by image), 7x7 (rows under
  // 64, summed a block of channels at a time) and 9x11 (rows of 99: 16-wide
  // steps, an 8-wide step and a scalar tail), with 70 channels: two blocks of
  // channels, the second ragged.
  for (const Shape& shape : {Shape{4, 6, 2, 2}, Shape{3, 6, 7, 7}, Shape{2, 6, 9, 11}, Shape{2, 70, 9, 11}}) {
    INFO("shape ", shape_str(shape));
    const int64_t channels = shape[1];
    Tensor x = random_tensor(shape, 71, -1, 1, DType::f32), r = random_tensor(shape, 72, -1, 1, DType::f32);
    Tensor w = random_tensor({channels}, 73, 0.5, 1.5, DType::f32);
    Tensor b = random_tensor({channels}, 74, -0.5, 0.5, DType::f32);
    Tensor dy = random_tensor(shape, 75, -1, 1, DType::f32);
    auto gradients = [&](bool fused) {
      Tensor xi = x.clone().set_requires_grad(true), ri = r.clone().set_requires_grad(true);
      Tensor wi = w.clone().set_requires_grad(true), bi = b.clone().set_requires_grad(true);
      Tensor rm = Tensor::zeros({channels}), rv = Tensor::ones({channels});
      Tensor y = fused ? batch_norm_add_relu(xi, ri, wi, bi, rm, rv, true)
                       : relu(add(batch_norm(xi, wi, bi, rm, rv, true), ri));
      y.backward(dy);
      return std::vector<Tensor>{y, xi.grad(), ri.grad(), wi.grad(), bi.grad()};
    };
    const auto fused = gradients(true), composed = gradients(false);
    for (size_t i = 0; i < fused.size(); ++i) {
      INFO("tensor ", i);
      CHECK(loom::testing::max_abs_diff(fused[i], composed[i]) == 0);
    }
  }
}

// The ConvNet's block tail, max_pool2d(relu(batch_norm(x)), 2), as one op.
// In f64: the output and running statistics of the three ops, and gradients
// against finite differences, with even and odd planes (the row and column
// no window covers; 2x4, which batch norm sums by its flat path), in training
// and eval, with and without parameters.
TEST_CASE("batch_norm_relu_max_pool2d equals max_pool2d(relu(batch_norm)) and its gradients match finite differences") {
  using loom::testing::check_gradients;
  using loom::testing::random_tensor;
  for (const Shape& shape : {Shape{3, 4, 6, 8}, Shape{2, 3, 5, 7}, Shape{4, 3, 2, 4}}) {
    INFO("shape ", shape_str(shape));
    const int64_t channels = shape[1];
    Tensor x = random_tensor(shape, 81).set_requires_grad(true);
    Tensor w = random_tensor({channels}, 82, 0.5, 1.5).set_requires_grad(true);
    Tensor b = random_tensor({channels}, 83).set_requires_grad(true);
    for (bool training : {true, false}) {
      INFO("training ", training);
      const Tensor rm = random_tensor({channels}, 84), rv = random_tensor({channels}, 85, 0.5, 2.0);
      Tensor fused_mean = rm.clone(), fused_var = rv.clone(), composed_mean = rm.clone(), composed_var = rv.clone();
      Tensor fused = batch_norm_relu_max_pool2d(x, w, b, fused_mean, fused_var, training);
      Tensor composed = max_pool2d(
          batch_norm(x, w, b, composed_mean, composed_var, training, 0.1, 1e-5, Activation::relu), {2, 2});
      CHECK(fused.sizes() == Shape{shape[0], channels, shape[2] / 2, shape[3] / 2});
      CHECK(loom::testing::max_abs_diff(fused, composed) == 0);
      CHECK(loom::testing::max_abs_diff(fused_mean, composed_mean) == 0);
      CHECK(loom::testing::max_abs_diff(fused_var, composed_var) == 0);
      check_gradients(
          [&](const TensorList& t) {
            return batch_norm_relu_max_pool2d(t[0], t[1], t[2], rm.clone(), rv.clone(), training);
          },
          {x, w, b});
    }
    check_gradients(
        [&](const TensorList& t) {
          return batch_norm_relu_max_pool2d(t[0], Tensor(), Tensor(), Tensor(), Tensor(), true);
        },
        {x});
  }
  Tensor narrow = random_tensor({2, 3, 1, 4}, 86);
  CHECK_THROWS_WITH_AS(batch_norm_relu_max_pool2d(narrow, Tensor(), Tensor(), Tensor(), Tensor(), true),
                       doctest::Contains("H, W >= 2"), loom::Error);
}

// In f32 the pool's choice and the gradient's rebuild run vectorised (AVX2
// where the CPU has it); the results must be the three ops' to the bit:
// rows of 7, 3 and 1 windows (masked loads, whole stores that run into the
// next rows; 14x14 is the ConvNet's layer2),
// 10 and 17 windows (a last group of eight that overlaps the one before),
// odd sizes, values from a few levels (ties between windows' elements, the
// first maximum wins) and mostly negative ones (windows the ReLU zeroes).
// And eval mode, and the f64 kernels (scalar). Planes of more than 16
// elements: batch norm sums smaller ones by another path (flat_rows), in
// another order, where only the forward is the same to the bit.
TEST_CASE("batch_norm_relu_max_pool2d in f32 and f64: output and gradients equal the three ops' exactly") {
  using loom::testing::random_tensor;
  struct Case {
    Shape shape;
    bool levels, training;
    DType dtype;
  };
  const Case cases[] = {{{4, 3, 14, 14}, false, true, DType::f32}, {{3, 5, 7, 7}, false, true, DType::f32},
                        {{2, 3, 20, 20}, false, true, DType::f32}, {{2, 2, 9, 35}, false, true, DType::f32},
                        {{3, 4, 28, 28}, true, true, DType::f32},  {{2, 3, 11, 16}, true, false, DType::f32},
                        {{3, 4, 13, 18}, true, true, DType::f64},  {{2, 3, 6, 6}, false, false, DType::f64},
                        {{3, 2, 5, 3}, false, true, DType::f32},   {{3, 2, 9, 2}, true, true, DType::f32}};
  for (const Case& c : cases) {
    INFO("shape ", shape_str(c.shape), " levels ", c.levels, " training ", c.training, " ", dtype_name(c.dtype));
    const int64_t channels = c.shape[1];
    Tensor x = random_tensor(c.shape, 91, -1, 1, c.dtype);
    if (c.levels) {  // the integers -2 .. 2
      std::vector<double> values = x.to_vector<double>();
      for (double& v : values) v = std::floor(v * 2.5);
      x = Tensor::from_vector<double>(values, c.shape).to(c.dtype);
    }
    Tensor w = random_tensor({channels}, 92, -1.5, 1.5, c.dtype);  // negative scales flip the pool's choice
    Tensor b = random_tensor({channels}, 93, -0.7, 0.3, c.dtype);
    const Shape pooled{c.shape[0], channels, c.shape[2] / 2, c.shape[3] / 2};
    Tensor dy = random_tensor(pooled, 94, -1, 1, c.dtype);
    auto run = [&](bool fused) {
      Tensor xi = x.clone().set_requires_grad(true), wi = w.clone().set_requires_grad(true);
      Tensor bi = b.clone().set_requires_grad(true);
      Tensor rm = random_tensor({channels}, 95, -0.2, 0.2, c.dtype), rv = random_tensor({channels}, 96, 0.5, 2, c.dtype);
      Tensor y = fused ? batch_norm_relu_max_pool2d(xi, wi, bi, rm, rv, c.training)
                       : max_pool2d(batch_norm(xi, wi, bi, rm, rv, c.training, 0.1, 1e-5, Activation::relu), {2, 2});
      y.backward(dy);
      return std::vector<Tensor>{y, xi.grad(), wi.grad(), bi.grad(), rm, rv};
    };
    const auto fused = run(true), composed = run(false);
    for (size_t i = 0; i < fused.size(); ++i) {
      INFO("tensor ", i);
      REQUIRE(fused[i].sizes() == composed[i].sizes());
      CHECK(loom::testing::max_abs_diff(fused[i], composed[i]) == 0);
    }
    // Not all zero: the gradient reached the input.
    CHECK(loom::testing::max_abs_diff(fused[1], Tensor::zeros(c.shape, c.dtype)) > 0);
  }
}

