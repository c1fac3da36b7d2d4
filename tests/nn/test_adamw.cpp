// optim::AdamW with PyTorch's defaults, against its documented algorithm
// (torch.optim.AdamW) written out here for three steps in f64.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include <loom/optim/optimizer.h>

using namespace loom;

namespace {
// PyTorch's AdamW algorithm (docs, maximize=False, amsgrad=False) on one
// parameter vector, step by step.
std::vector<double> documented_adamw(std::vector<double> theta, const std::vector<std::vector<double>>& grads,
                                     double lr, double beta1, double beta2, double eps, double weight_decay) {
  std::vector<double> m(theta.size(), 0.0), v(theta.size(), 0.0);
  for (size_t t = 1; t <= grads.size(); ++t) {
    for (size_t i = 0; i < theta.size(); ++i) {
      const double g = grads[t - 1][i];
      theta[i] -= lr * weight_decay * theta[i];
      m[i] = beta1 * m[i] + (1 - beta1) * g;
      v[i] = beta2 * v[i] + (1 - beta2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(beta1, static_cast<double>(t)));
      const double v_hat = v[i] / (1 - std::pow(beta2, static_cast<double>(t)));
      theta[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
  return theta;
}

const std::vector<double> kStart = {1.0, -2.0, 0.5, 3.0};
const std::vector<std::vector<double>> kGrads = {{0.1, -0.3, 0.7, 0.0}, {0.2, 0.2, -0.5, 1e-3}, {-0.4, 0.1, 0.3, -2.0}};

std::vector<double> run(optim::Optimizer& optimizer, Tensor& p) {
  for (const auto& g : kGrads) {
    p.set_grad(Tensor::from_vector(g, {static_cast<int64_t>(g.size())}));
    optimizer.step();
  }
  return p.to_vector<double>();
}
}  // namespace

TEST_CASE("AdamWOptions has torch.optim.AdamW's defaults") {
  const optim::AdamWOptions options;
  CHECK(options.lr() == 1e-3);
  CHECK(options.beta1() == 0.9);
  CHECK(options.beta2() == 0.999);
  CHECK(options.eps() == 1e-8);
  CHECK(options.weight_decay() == 1e-2);
  CHECK(options.decoupled_weight_decay());
}

TEST_CASE("AdamW follows PyTorch's documented algorithm for three steps") {
  SUBCASE("the defaults") {
    Tensor p = Tensor::from_vector(kStart, {4}).set_requires_grad(true);
    optim::AdamW adamw({p});
    const std::vector<double> expected = documented_adamw(kStart, kGrads, 1e-3, 0.9, 0.999, 1e-8, 1e-2);
    const std::vector<double> actual = run(adamw, p);
    for (size_t i = 0; i < expected.size(); ++i) CHECK(actual[i] == doctest::Approx(expected[i]).epsilon(1e-14));
  }
  SUBCASE("other hyper-parameters, chained on AdamWOptions") {
    Tensor p = Tensor::from_vector(kStart, {4}).set_requires_grad(true);
    optim::AdamW adamw({p}, optim::AdamWOptions(0.05).betas(0.8, 0.99).eps(1e-6).weight_decay(0.3));
    const std::vector<double> expected = documented_adamw(kStart, kGrads, 0.05, 0.8, 0.99, 1e-6, 0.3);
    const std::vector<double> actual = run(adamw, p);
    for (size_t i = 0; i < expected.size(); ++i) CHECK(actual[i] == doctest::Approx(expected[i]).epsilon(1e-14));
  }
  SUBCASE("AdamW decouples even when handed plain AdamOptions; Adam with L2 differs") {
    Tensor p = Tensor::from_vector(kStart, {4}).set_requires_grad(true);
    optim::AdamW adamw({p}, optim::AdamOptions(0.05).weight_decay(0.3));
    const std::vector<double> expected = documented_adamw(kStart, kGrads, 0.05, 0.9, 0.999, 1e-8, 0.3);
    const std::vector<double> decoupled = run(adamw, p);
    for (size_t i = 0; i < expected.size(); ++i) CHECK(decoupled[i] == doctest::Approx(expected[i]).epsilon(1e-14));
    Tensor q = Tensor::from_vector(kStart, {4}).set_requires_grad(true);
    optim::Adam adam({q}, optim::AdamOptions(0.05).weight_decay(0.3));
    CHECK(run(adam, q)[3] != doctest::Approx(decoupled[3]).epsilon(1e-6));
  }
}
