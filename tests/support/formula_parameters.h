// The closed-form parameter values that the PyTorch fixture scripts
// (tests/fixtures/make_convnet_fixture.py, make_resnet_fixture.py) give a
// model: parameter k (in named_parameters() order), element i, is
// 0.2 * sin(0.37 i + 1.3 k) / sqrt(1 + k).
#pragma once

#include <cmath>
#include <vector>

#include <loom/core/autograd.h>
#include <loom/core/tensor.h>
#include <loom/nn/module.h>

namespace loom::testing {

inline void set_formula_parameters(nn::Module& model) {
  NoGradGuard no_grad;
  int k = 0;
  for (auto& [name, p] : model.named_parameters()) {
    std::vector<double> values(p.numel());
    for (size_t i = 0; i < values.size(); ++i) values[i] = 0.2 * std::sin(0.37 * i + 1.3 * k) / std::sqrt(1.0 + k);
    Tensor(p).copy_(Tensor::from_vector(values, p.sizes()));
    ++k;
  }
}

}  // namespace loom::testing
