// clip_grad_norm under mixed precision (apex / GradScaler.unscale_ order):
// the gradients are unscaled once, the norm is of the unscaled gradients the
// optimizer steps (the f32 masters at O2), step() does not unscale again, and
// an overflowed step is still skipped. Hand-computed values: gradients
// (3, -4) and (12) of norm 13, multiplied by the loss scale.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include <loom/nn/layers.h>
#include <loom/optim/amp.h>
#include <loom/optim/clip_grad.h>
#include "tests/amp/helpers.h"

using namespace loom;

namespace {
constexpr double kScale = 1024;

struct ClipSetup {
  std::shared_ptr<nn::Linear> model = std::make_shared<nn::Linear>(2, 1);  // weight (1, 2), bias (1)
  std::unique_ptr<amp::MixedPrecisionOptimizer> optimizer;

  explicit ClipSetup(amp::OptLevel level) {
    model->weight.set_data(Tensor::from_vector(std::vector<float>{1, 2}, {1, 2}));
    model->bias.set_data(Tensor::from_vector(std::vector<float>{3}, {1}));
    optimizer = amp::initialize(*model, amp_test::sgd(1.0, 0.0), level,
                                optim::GradScalerOptions().init_scale(kScale));
  }
  // The gradients backward of the scaled loss would leave: scale * (3, -4) and scale * (12).
  void set_scaled_gradients(double inf_at_bias = 1.0) {
    const DType dtype = model->weight.dtype();
    model->weight.set_grad(Tensor::from_vector(std::vector<double>{3 * kScale, -4 * kScale}, {1, 2}).to(dtype));
    model->bias.set_grad(Tensor::from_vector(std::vector<double>{12 * kScale * inf_at_bias}, {1}).to(dtype));
  }
  std::vector<double> weights() const {
    std::vector<double> w = model->weight.to_vector<double>();
    w.push_back(model->bias.to_vector<double>()[0]);
    return w;
  }
};
}  // namespace

TEST_SUITE("clip_grad") {
  TEST_CASE("O1 and O2: unscale once, clip the unscaled gradients, step with them") {
    for (amp::OptLevel level : {amp::OptLevel::O1, amp::OptLevel::O2}) {
      INFO("level ", amp::opt_level_name(level));
      ClipSetup s(level);
      s.set_scaled_gradients();
      const double total = s.optimizer->clip_grad_norm(6.5);
      CHECK(total == doctest::Approx(13.0).epsilon(1e-12));
      CHECK(optim::get_total_norm(s.optimizer->stepped_parameters()) == doctest::Approx(6.5).epsilon(1e-6));
      CHECK(s.optimizer->unscale_gradients() == false);  // already done: nothing more happens
      s.optimizer->step();
      REQUIRE_FALSE(s.optimizer->last_step_skipped());
      // SGD with lr 1: w -= clipped g = g * 6.5 / (13 + 1e-6) (O2: the masters, rounded into f16 weights).
      const double coef = 6.5 / (13.0 + 1e-6);
      const std::vector<double> expected = {1 - 3 * coef, 2 + 4 * coef, 3 - 12 * coef};
      const std::vector<double> w = s.weights();
      const double tolerance = level == amp::OptLevel::O2 ? 1e-3 : 1e-6;
      for (size_t i = 0; i < 3; ++i) CHECK(w[i] == doctest::Approx(expected[i]).epsilon(tolerance));
      CHECK(s.optimizer->scaler().get_scale() == kScale);
    }
  }

  TEST_CASE("an overflowed gradient: a non-finite norm, nothing clipped, the step skipped") {
    for (amp::OptLevel level : {amp::OptLevel::O1, amp::OptLevel::O2}) {
      INFO("level ", amp::opt_level_name(level));
      ClipSetup s(level);
      const std::vector<double> before = s.weights();
      s.set_scaled_gradients(std::numeric_limits<double>::infinity());
      CHECK_FALSE(std::isfinite(s.optimizer->clip_grad_norm(1.0)));
      s.optimizer->step();
      CHECK(s.optimizer->last_step_skipped());
      CHECK(s.optimizer->scaler().get_scale() == kScale / 2);
      CHECK(s.weights() == before);
      // The next step unscales afresh with the halved scale.
      s.set_scaled_gradients();
      CHECK(s.optimizer->clip_grad_norm(100.0) == doctest::Approx(26.0).epsilon(1e-12));
    }
  }
}
