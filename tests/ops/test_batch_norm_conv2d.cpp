// batch_norm_relu_conv2d (ops/batch_norm_conv2d.h): on the CPU it runs the
// ops apart, so its output, statistics, running stats and gradients equal
// conv2d(relu(batch_norm(x)), w)'s bit for bit; in f64 its gradients match
// finite differences; the statistics it hands on equal batch_norm_stats';
// precomputed input statistics (batch_norm_add_relu's too) change nothing;
// misuse is refused by name. The CUDA graphs behind it: tests/gpu.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include <loom/core/memory_format.h>
#include <loom/ops/autocast.h>
#include <loom/ops/batch_norm.h>
#include <loom/ops/batch_norm_conv2d.h>
#include <loom/ops/conv2d.h>
#include <loom/ops/elementwise.h>
#include "tests/support/gradcheck.h"

using namespace loom;
using loom::testing::check_gradients;
using loom::testing::random_tensor;

namespace {

// Whether `a` and `b` hold the same values bit for bit, in logical order.
bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() &&
         std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0;
}

struct Case {
  Shape x;
  Shape w;  // (K, C / groups, R, S)
  Conv2dParams params;
};

// ResNet's shapes, scaled down: a bottleneck's 1x1, its 3x3 with stride 2,
// a 3x3 with padding, and a grouped 3x3 (the composite path takes groups).
const Case kCases[] = {
    {{3, 8, 6, 6}, {12, 8, 1, 1}, {}},
    {{2, 6, 7, 7}, {5, 6, 3, 3}, {{2, 2}, {1, 1}, {1, 1}, 1}},
    {{2, 4, 5, 5}, {4, 4, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 1}},
    {{2, 8, 5, 5}, {6, 4, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 2}},
};

// One forward and backward of the fused op or of the ops apart, from the
// same inputs: the output, the output's statistics, the running stats and
// every gradient.
std::vector<Tensor> run(bool fused, const Case& c, DType dtype, MemoryFormat format, bool training,
                        const Tensor& input_stats = Tensor()) {
  const int64_t channels = c.x[1];
  Tensor x = in_memory_format(random_tensor(c.x, 1, -1, 2, dtype), format).set_requires_grad(true);
  Tensor gamma = random_tensor({channels}, 2, 0.5, 1.5, dtype).set_requires_grad(true);
  Tensor beta = random_tensor({channels}, 3, -0.5, 0.5, dtype).set_requires_grad(true);
  Tensor w = in_memory_format(random_tensor(c.w, 4, -0.5, 0.5, dtype), format).set_requires_grad(true);
  Tensor running_mean = random_tensor({channels}, 5, -0.2, 0.2, dtype);
  Tensor running_var = random_tensor({channels}, 6, 0.5, 1.5, dtype);
  Tensor y, stats;
  if (fused) {
    BatchNormReluConv2d out = batch_norm_relu_conv2d(x, gamma, beta, running_mean, running_var, training, 0.1, 1e-5,
                                                     w, c.params, input_stats, /*want_output_stats=*/true);
    y = out.output;
    stats = out.output_stats;
  } else {
    y = conv2d(relu(batch_norm(x, gamma, beta, running_mean, running_var, training, 0.1, 1e-5)), w, Tensor(),
               c.params);
    if (training) stats = ops::cpu::batch_norm_stats(y.detach());
  }
  y.backward(random_tensor(y.sizes(), 7, -1, 1, dtype));
  return {y, stats, running_mean, running_var, x.grad(), gamma.grad(), beta.grad(), w.grad()};
}

const char* kNames[] = {"output", "output_stats", "running_mean", "running_var", "d input", "d gamma", "d beta", "d w"};

void check_equal(const std::vector<Tensor>& fused, const std::vector<Tensor>& apart) {
  REQUIRE(fused.size() == apart.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    INFO(std::string(kNames[i]));
    CHECK(same_bits(fused[i], apart[i]));
  }
}

}  // namespace

TEST_SUITE("batch_norm_relu_conv2d") {
  TEST_CASE("on the CPU it equals conv2d(relu(batch_norm(x))) bit for bit, forward, statistics and backward") {
    for (const Case& c : kCases) {
      for (DType dtype : {DType::f32, DType::f64}) {
        for (MemoryFormat format : {MemoryFormat::nchw, MemoryFormat::nhwc}) {
          for (bool training : {true, false}) {
            INFO("x ", shape_str(c.x), " w ", shape_str(c.w), " ", std::string(dtype_name(dtype)),
                 std::string(format == MemoryFormat::nhwc ? " channels-last" : " NCHW"),
                 std::string(training ? " training" : " eval"));
            const auto fused = run(true, c, dtype, format, training), apart = run(false, c, dtype, format, training);
            check_equal(fused, apart);
            CHECK(fused[1].defined() == training);  // statistics are handed on in training only
          }
        }
      }
    }
  }

  TEST_CASE("given the input's statistics it computes what it computes without them") {
    for (const Case& c : kCases) {
      INFO("x ", shape_str(c.x));
      const Tensor x = random_tensor(c.x, 1, -1, 2, DType::f32);  // run()'s input
      const Tensor stats = ops::cpu::batch_norm_stats(x);
      const Tensor stats_before = stats.clone();
      check_equal(run(true, c, DType::f32, MemoryFormat::nchw, true, stats),
                  run(true, c, DType::f32, MemoryFormat::nchw, true));
      CHECK(same_bits(stats, stats_before));  // read, not consumed
    }
  }

  TEST_CASE("batch_norm_add_relu given its input's statistics equals it without them") {
    const Shape shape{3, 5, 4, 4};
    auto run_tail = [&](bool with_stats) {
      Tensor x = random_tensor(shape, 11, -1, 1, DType::f32).set_requires_grad(true);
      Tensor r = random_tensor(shape, 12, -1, 1, DType::f32).set_requires_grad(true);
      Tensor w = random_tensor({5}, 13, 0.5, 1.5, DType::f32).set_requires_grad(true);
      Tensor b = random_tensor({5}, 14, -0.5, 0.5, DType::f32).set_requires_grad(true);
      Tensor rm = Tensor::zeros({5}), rv = Tensor::ones({5});
      const Tensor stats = with_stats ? ops::cpu::batch_norm_stats(x.detach()) : Tensor();
      Tensor y = batch_norm_add_relu(x, r, w, b, rm, rv, true, 0.1, 1e-5, stats);
      y.backward(random_tensor(shape, 15, -1, 1, DType::f32));
      return std::vector<Tensor>{y, rm, rv, x.grad(), r.grad(), w.grad(), b.grad()};
    };
    const auto with = run_tail(true), without = run_tail(false);
    for (size_t i = 0; i < with.size(); ++i) {
      INFO("tensor ", i);
      CHECK(same_bits(with[i], without[i]));
    }
  }

  TEST_CASE("its gradients match finite differences in f64") {
    const Case c{{3, 4, 5, 5}, {3, 4, 3, 3}, {{2, 2}, {1, 1}, {1, 1}, 1}};
    Tensor x = random_tensor(c.x, 21, -1, 2).set_requires_grad(true);
    Tensor gamma = random_tensor({4}, 22, 0.5, 1.5).set_requires_grad(true);
    Tensor beta = random_tensor({4}, 23, -0.5, 0.5).set_requires_grad(true);
    Tensor w = random_tensor(c.w, 24, -0.5, 0.5).set_requires_grad(true);
    SUBCASE("training, affine, running stats tracked") {
      Tensor rm = Tensor::zeros({4}, DType::f64), rv = Tensor::ones({4}, DType::f64);
      check_gradients(
          [&](const TensorList& t) {
            return batch_norm_relu_conv2d(t[0], t[1], t[2], rm, rv, true, 0.1, 1e-5, t[3], c.params).output;
          },
          {x, gamma, beta, w});
    }
    SUBCASE("training without affine parameters or running stats") {
      check_gradients(
          [&](const TensorList& t) {
            return batch_norm_relu_conv2d(t[0], Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5, t[1],
                                          c.params)
                .output;
          },
          {x, w});
    }
    SUBCASE("eval: the running statistics") {
      Tensor rm = random_tensor({4}, 25, -0.2, 0.2), rv = random_tensor({4}, 26, 0.5, 1.5);
      check_gradients(
          [&](const TensorList& t) {
            return batch_norm_relu_conv2d(t[0], t[1], t[2], rm, rv, false, 0.1, 1e-5, t[3], c.params).output;
          },
          {x, gamma, beta, w});
    }
  }

  TEST_CASE("misuse is refused by name") {
    const Tensor x = random_tensor({2, 4, 5, 5}, 31, -1, 1, DType::f32);
    const Tensor w = random_tensor({3, 4, 1, 1}, 32, -1, 1, DType::f32);
    const Tensor w_for_5_channels = random_tensor({3, 5, 1, 1}, 33, -1, 1, DType::f32);
    CHECK_THROWS_WITH_AS(batch_norm_relu_conv2d(x, {}, {}, {}, {}, true, 0.1, 1e-5, w_for_5_channels, {}),
                         doctest::Contains("batch_norm_relu_conv2d: the convolution weight"), Error);
    CHECK_THROWS_WITH_AS(batch_norm_relu_conv2d(x, {}, {}, {}, {}, true, 0.1, 1e-5, w.to(DType::f64), {}),
                         doctest::Contains("batch_norm_relu_conv2d"), Error);
    CHECK_THROWS_WITH_AS(
        batch_norm_relu_conv2d(x, {}, {}, {}, {}, true, 0.1, 1e-5, w, {}, Tensor::zeros({2, 3}, DType::f64)),
        doctest::Contains("the input's statistics must be an f64 (2, 4) tensor"), Error);
    {
      ops::AutocastGuard autocast(true, DType::bf16);
      CHECK_THROWS_WITH_AS(batch_norm_relu_conv2d(x, {}, {}, {}, {}, true, 0.1, 1e-5, w, {}),
                           doctest::Contains("not under autocast"), Error);
    }
  }

  TEST_CASE("the fusion switch: off on the CPU unless a FuseBatchNormConv scope is open, restored after it") {
    CHECK_FALSE(ops::batch_norm_conv_fusion(Device::cpu()));
    {
      ops::FuseBatchNormConv fuse;
      CHECK(ops::batch_norm_conv_fusion(Device::cpu()));
      {
        ops::FuseBatchNormConv nested;
        CHECK(ops::batch_norm_conv_fusion(Device::cpu()));
      }
      CHECK(ops::batch_norm_conv_fusion(Device::cpu()));
    }
    CHECK_FALSE(ops::batch_norm_conv_fusion(Device::cpu()));
  }
}
