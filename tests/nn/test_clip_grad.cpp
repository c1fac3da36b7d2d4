// optim::clip_grad_norm_ and clip_grad_value_ against hand-computed values
// from PyTorch's definitions (torch.nn.utils): total norm of all gradients as
// one vector, clip_coef = max_norm / (total + 1e-6) clamped to 1.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include <loom/core/error.h>
#include <loom/optim/clip_grad.h>

using namespace loom;

namespace {
// A parameter of the given values whose .grad holds `grad` (as dtype).
Tensor parameter_with_grad(const std::vector<double>& grad, DType dtype = DType::f32) {
  Tensor p = Tensor::zeros({static_cast<int64_t>(grad.size())}, dtype).set_requires_grad(true);
  p.set_grad(Tensor::from_vector(grad, {static_cast<int64_t>(grad.size())}).to(dtype));
  return p;
}

std::vector<double> grad_of(const Tensor& p) { return p.grad().to_vector<double>(); }

constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

TEST_SUITE("optim.clip_grad") {
  TEST_CASE("the total norm of several gradients, of order 2, 1, 3 and infinity") {
    // g = (3, -4) and (12): Σg² = 169, Σ|g| = 19, Σ|g|³ = 27 + 64 + 1728, max |g| = 12.
    std::vector<Tensor> params = {parameter_with_grad({3, -4}), parameter_with_grad({12})};
    CHECK(optim::get_total_norm(params) == doctest::Approx(13.0).epsilon(1e-12));
    CHECK(optim::get_total_norm(params, 1.0) == doctest::Approx(19.0).epsilon(1e-12));
    CHECK(optim::get_total_norm(params, 3.0) == doctest::Approx(std::cbrt(1819.0)).epsilon(1e-12));
    CHECK(optim::get_total_norm(params, optim::kInfinityNorm) == 12.0);
    // A parameter without a gradient is skipped; none at all: 0.
    Tensor no_grad = Tensor::zeros({4}).set_requires_grad(true);
    params.push_back(no_grad);
    CHECK(optim::get_total_norm(params) == doctest::Approx(13.0).epsilon(1e-12));
    CHECK(optim::get_total_norm({no_grad}) == 0.0);
    CHECK_THROWS_WITH_AS(static_cast<void>(optim::get_total_norm(params, 0.0)), doctest::Contains("norm_type must be > 0"), Error);
  }

  TEST_CASE("clip_grad_norm_ scales by max_norm / (total + 1e-6) and returns the norm before clipping") {
    std::vector<Tensor> params = {parameter_with_grad({3, -4}, DType::f64), parameter_with_grad({12}, DType::f64)};
    const double total = optim::clip_grad_norm_(params, 6.5);
    CHECK(total == doctest::Approx(13.0).epsilon(1e-14));
    const double coef = 6.5 / (13.0 + 1e-6);
    const std::vector<double> first = grad_of(params[0]), second = grad_of(params[1]);
    CHECK(first[0] == doctest::Approx(3 * coef).epsilon(1e-14));
    CHECK(first[1] == doctest::Approx(-4 * coef).epsilon(1e-14));
    CHECK(second[0] == doctest::Approx(12 * coef).epsilon(1e-14));
    CHECK(optim::get_total_norm(params) < 6.5);
    // Below the bound (coefficient clamped to 1): untouched.
    const double again = optim::clip_grad_norm_(params, 100.0);
    CHECK(again == doctest::Approx(13.0 * coef).epsilon(1e-14));
    CHECK(grad_of(params[0])[0] == first[0]);
    // The infinity norm: max |g| = 12 clipped to 3.
    std::vector<Tensor> inf_params = {parameter_with_grad({3, -4}, DType::f64), parameter_with_grad({12}, DType::f64)};
    CHECK(optim::clip_grad_norm_(inf_params, 3.0, optim::kInfinityNorm) == 12.0);
    CHECK(grad_of(inf_params[1])[0] == doctest::Approx(12 * 3.0 / (12.0 + 1e-6)).epsilon(1e-14));
    CHECK_THROWS_WITH_AS(optim::clip_grad_norm_(params, -1.0), doctest::Contains("max_norm must be >= 0"), Error);
  }

  TEST_CASE("16-bit and large gradients: the norm in f64 over blocks") {
    // 100003 elements of 0.5 (several blocks, a ragged tail): norm = 0.5 sqrt(100003).
    const int64_t n = 100003;
    Tensor big = Tensor::zeros({n}).set_requires_grad(true);
    big.set_grad(Tensor::full({n}, 0.5));
    CHECK(optim::get_total_norm({big}) == doctest::Approx(0.5 * std::sqrt(static_cast<double>(n))).epsilon(1e-12));
    for (DType dtype : {DType::f16, DType::bf16}) {
      std::vector<Tensor> params = {parameter_with_grad({3, -4}, dtype), parameter_with_grad({12}, dtype)};
      CHECK(optim::clip_grad_norm_(params, 1.3) == doctest::Approx(13.0).epsilon(1e-12));
      CHECK(grad_of(params[1])[0] == doctest::Approx(1.2).epsilon(1e-2));  // 12 * 0.1 rounded to 16 bits
    }
  }

  TEST_CASE("non-finite norms: scaled anyway by default (PyTorch's error_if_nonfinite=false), or an error") {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    std::vector<Tensor> with_nan = {parameter_with_grad({1, nan}), parameter_with_grad({2})};
    CHECK(std::isnan(optim::clip_grad_norm_(with_nan, 1.0)));
    CHECK(std::isnan(grad_of(with_nan[1])[0]));  // coefficient NaN
    CHECK(std::isnan(optim::get_total_norm(with_nan, optim::kInfinityNorm)));
    std::vector<Tensor> with_inf = {parameter_with_grad({1, kInf}), parameter_with_grad({2})};
    CHECK(optim::clip_grad_norm_(with_inf, 1.0) == kInf);
    CHECK(grad_of(with_inf[1])[0] == 0.0);                 // coefficient 0
    CHECK(std::isnan(grad_of(with_inf[0])[1]));            // inf * 0
    std::vector<Tensor> kept = {parameter_with_grad({1, kInf})};
    CHECK_THROWS_WITH_AS(optim::clip_grad_norm_(kept, 1.0, 2.0, /*error_if_nonfinite=*/true),
                         doctest::Contains("total norm of order 2 of the gradients is inf"), Error);
    CHECK(grad_of(kept[0])[0] == 1.0);
  }

  TEST_CASE("clip_grad_value_ clamps every element to [-v, v]") {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    std::vector<Tensor> params = {parameter_with_grad({0.5, -3, 2, kInf}), parameter_with_grad({nan, -0.25}, DType::f64)};
    optim::clip_grad_value_(params, 1.0);
    CHECK(grad_of(params[0]) == std::vector<double>{0.5, -1, 1, 1});
    const std::vector<double> second = grad_of(params[1]);
    CHECK(std::isnan(second[0]));
    CHECK(second[1] == -0.25);
    CHECK_THROWS_WITH_AS(optim::clip_grad_value_(params, -0.5), doctest::Contains("clip_value must be >= 0"), Error);
  }
}
