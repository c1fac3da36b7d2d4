// The closed-form parameter values that the PyTorch fixture scripts
// (tests/fixtures/make_convnet_fixture.py, make_resnet_fixture.py) give a
// model: parameter k (in named_parameters() order), element i, is
// 0.2 * sin(0.37 i + 1.3 k) / sqrt(1 + k); and what comparing a model's
// tensors with a fixture's takes.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <string>
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

// Calls check(name, tensor) on each of `tensors` inside a doctest INFO that
// names it ("parameter conv1.weight").
template <class Check>
void check_each_named(const nn::NamedTensors& tensors, const char* kind, const Check& check) {
  for (const auto& named : tensors) {
    INFO(kind, " ", named.first);
    check(named.first, named.second);
  }
}

// How the fixtures summarise a gradient: the sum of its values and of their magnitudes.
struct ValueSums {
  double sum = 0, abs_sum = 0;
};
inline ValueSums value_sums(const std::vector<double>& values) {
  ValueSums sums;
  for (double v : values) {
    sums.sum += v;
    sums.abs_sum += std::abs(v);
  }
  return sums;
}

}  // namespace loom::testing
