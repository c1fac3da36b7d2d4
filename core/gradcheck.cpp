#include <loom/core/gradcheck.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include <loom/core/error.h>
#include <loom/core/generator.h>

namespace loom {

namespace {

double max_abs(const std::vector<double>& values) {
  double m = 0;
  for (double v : values) m = std::max(m, std::abs(v));
  return m;
}

double relative_error(const Tensor& analytic, const Tensor& numeric) {
  const std::vector<double> a = analytic.to_vector<double>();
  const std::vector<double> n = numeric.to_vector<double>();
  LOOM_CHECK(a.size() == n.size(), "gradcheck: the gradient has ", a.size(), " elements, the input ", n.size());
  double difference = 0;
  for (size_t i = 0; i < a.size(); ++i) difference = std::max(difference, std::abs(a[i] - n[i]));
  return difference / std::max(max_abs(n), 1e-3);
}

}  // namespace

std::vector<InputGradientCheck> compare_gradients(const DifferentiableFunction& f, const TensorList& inputs,
                                                  const GradcheckOptions& options) {
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& t = inputs[k];
    if (!t.defined() || !t.requires_grad()) continue;
    LOOM_CHECK(t.dtype() == DType::f64 && t.device().is_cpu() && t.is_contiguous(), "gradcheck: input ", k, " is ",
               t.str(), "; finite differences need contiguous f64 CPU tensors");
  }
  Tensor out = f(inputs);
  LOOM_CHECK(out.defined(), "gradcheck: the function returned an undefined tensor");
  Tensor weights = Tensor::empty(out.sizes(), DType::f64);
  Generator(options.seed()).uniform_(weights, -1.0, 1.0);
  for (Tensor t : inputs) {  // a handle: clears the input's own .grad
    if (t.defined() && t.requires_grad()) t.set_grad(Tensor());
  }
  out.backward(weights.to(out.dtype()));

  // sum(f(inputs) * w) without recording a graph.
  auto objective = [&]() {
    NoGradGuard no_grad;
    Tensor y = f(inputs).to(DType::f64).contiguous();
    const double* yp = y.data<double>();
    const double* wp = weights.data<double>();
    double s = 0;
    for (int64_t i = 0; i < y.numel(); ++i) s += yp[i] * wp[i];
    return s;
  };

  std::vector<InputGradientCheck> checks;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    if (!x.defined() || !x.requires_grad()) continue;
    InputGradientCheck check;
    check.input = k;
    check.analytic = x.grad();
    check.numeric = Tensor::zeros(x.sizes(), DType::f64);
    double* xp = x.data<double>();
    double* np = check.numeric.data<double>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double saved = xp[i];
      xp[i] = saved + options.eps();
      const double plus = objective();
      xp[i] = saved - options.eps();
      const double minus = objective();
      xp[i] = saved;
      np[i] = (plus - minus) / (2 * options.eps());
    }
    check.relative_error = check.analytic.defined() ? relative_error(check.analytic, check.numeric)
                                                    : std::numeric_limits<double>::infinity();
    checks.push_back(std::move(check));
  }
  return checks;
}

bool gradcheck(const DifferentiableFunction& f, const TensorList& inputs, const GradcheckOptions& options) {
  std::string failures;
  for (const InputGradientCheck& check : compare_gradients(f, inputs, options)) {
    if (!check.analytic.defined()) {
      failures += str("\n  input ", check.input, " (", inputs[check.input].str(), ") received no gradient");
    } else if (!(check.relative_error <= options.tolerance())) {
      failures += str("\n  input ", check.input, " (", inputs[check.input].str(), "): relative error ",
                      check.relative_error, " exceeds the tolerance ", options.tolerance());
    }
  }
  LOOM_CHECK(failures.empty(), "gradcheck: backward disagrees with finite differences:", failures);
  return true;
}

}  // namespace loom
