// Gradient checking, PyTorch's torch.autograd.gradcheck: the gradients an op's
// backward computes against central finite differences in f64. Every loom op
// is tested this way; a user-defined op (loom::record with its own backward)
// is checked the same way:
//
//   loom::Tensor x = loom::Tensor::zeros({3, 4}, loom::DType::f64);
//   loom::Generator(1).uniform_(x, -1, 1);
//   x.set_requires_grad(true);
//   loom::gradcheck([](const loom::TensorList& in) { return my_op(in[0]); }, {x});  // throws when wrong
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include <loom/core/autograd.h>
#include <loom/core/options.h>
#include <loom/core/tensor.h>

namespace loom {

class GradcheckOptions {
  // The largest accepted relative error (see InputGradientCheck).
  LOOM_OPTION(double, tolerance) = 1e-6;
  // The finite-difference step: each element moves by +-eps.
  LOOM_OPTION(double, eps) = 1e-6;
  // Seed of the random weights w of the checked objective sum(f(inputs) * w).
  LOOM_OPTION(uint64_t, seed) = 99;
};

// The check of one input.
struct InputGradientCheck {
  size_t input = 0;  // its position in `inputs`
  Tensor analytic;   // from backward; undefined when no gradient reached the input
  Tensor numeric;    // from central differences
  // ||analytic - numeric||_inf / max(||numeric||_inf, 1e-3); infinity when
  // analytic is undefined.
  double relative_error = 0;
};

using DifferentiableFunction = std::function<Tensor(const TensorList& inputs)>;

// For every input with requires_grad: d(sum(f(inputs) * w)) / d(input), by
// backward and by central differences, w uniform in [-1, 1) from
// options.seed(). `f` must be deterministic; the inputs must be contiguous f64
// CPU tensors (throws otherwise). Overwrites the inputs' .grad.
std::vector<InputGradientCheck> compare_gradients(const DifferentiableFunction& f, const TensorList& inputs,
                                                  const GradcheckOptions& options = {});

// compare_gradients(), then throws loom::Error naming every input whose
// gradient is missing or off by more than options.tolerance(); returns true
// when all agree.
bool gradcheck(const DifferentiableFunction& f, const TensorList& inputs, const GradcheckOptions& options = {});

}  // namespace loom
