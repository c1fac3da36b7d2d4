// The small f64 problem the DDP tests (CPU, tests/dist/test_ddp.cpp, and
// NCCL, tests/gpu/test_nccl.cpp) train on: a (6 -> 5 -> 3) MLP, a fixed set of
// 8 input and target rows, mean squared error, plain SGD, a check that two
// sets of named tensors (or their gradients) agree, and DDP's steps against
// one process's.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <loom/core/autograd.h>
#include <loom/core/generator.h>
#include <loom/dist/ddp.h>
#include <loom/nn/layers.h>
#include <loom/ops/elementwise.h>
#include "tests/dist/multiprocess.h"

namespace loom::dist::testing {

inline constexpr int64_t kSamples = 8;

// A (6 -> 5 -> 3) MLP in f64 on `device`, initialised from `seed`.
inline std::shared_ptr<nn::Module> tiny_model(uint64_t seed, Device device = Device::cpu()) {
  manual_seed(seed);
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 5), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(5, 3)});
  model->to(DType::f64);
  model->to(device);
  return model;
}

// Rows [first, first + count) of a fixed (8, 6) input set and (8, 3) target set.
inline Tensor inputs(int64_t first, int64_t count, Device device = Device::cpu()) {
  std::vector<double> values;
  for (int64_t row = first; row < first + count; ++row)
    for (int64_t col = 0; col < 6; ++col) values.push_back(std::sin(0.7 * static_cast<double>(row) + 1.3 * col));
  return Tensor::from_vector_as(values, {count, 6}, DType::f64).to(device);
}
inline Tensor targets(int64_t first, int64_t count, Device device = Device::cpu()) {
  std::vector<double> values;
  for (int64_t row = first; row < first + count; ++row)
    for (int64_t col = 0; col < 3; ++col) values.push_back(std::cos(0.3 * static_cast<double>(row) - col));
  return Tensor::from_vector_as(values, {count, 3}, DType::f64).to(device);
}

inline Tensor mse(const Tensor& output, const Tensor& target) {
  Tensor difference = output - target;
  return mean(difference * difference);
}

inline void sgd_step(nn::Module& model, double learning_rate) {
  NoGradGuard no_grad;
  for (auto& [name, parameter] : model.named_parameters()) parameter.add_(parameter.grad(), -learning_rate);
  model.zero_grad();
}

// Every tensor (or its .grad) of `actual` equals `expected`'s to 1e-10, on any device.
inline void expect_close(const nn::NamedTensors& actual, const nn::NamedTensors& expected, const std::string& what,
                         bool gradients = false) {
  expect(actual.size() == expected.size(), what, ": ", actual.size(), " tensors vs ", expected.size());
  for (size_t k = 0; k < actual.size(); ++k) {
    Tensor a = gradients ? actual[k].second.grad() : actual[k].second;
    Tensor b = gradients ? expected[k].second.grad() : expected[k].second;
    expect(a.defined() && b.defined(), what, ": '", actual[k].first, "' has no value");
    std::vector<double> x = a.to(Device::cpu()).to(DType::f64).to_vector<double>();
    std::vector<double> y = b.to(Device::cpu()).to(DType::f64).to_vector<double>();
    for (size_t i = 0; i < x.size(); ++i)
      expect(std::abs(x[i] - y[i]) <= 1e-10 * (1 + std::abs(y[i])), what, ": '", actual[k].first, "'[", i, "] is ",
             x[i], ", expected ", y[i]);
  }
}

// Three SGD steps (learning rate 0.1) of DDP over `group`, each rank on its
// share of the 8 rows on `device`, end with the parameters of one process
// stepping on all 8 rows on the CPU. `after_backward` runs after each step's
// backward, before the update (checks of the DDP object).
inline void expect_ddp_steps_equal_one_process(
    const std::shared_ptr<ProcessGroup>& group, Device device, const DistributedDataParallelOptions& options = {},
    const std::function<void(DistributedDataParallel&)>& after_backward = [](DistributedDataParallel&) {}) {
  const int rank = group->rank();
  auto model = tiny_model(100 + rank, device);  // different on every rank until DDP broadcasts rank 0's
  DistributedDataParallel ddp(model, group, options);
  const int64_t share = kSamples / group->size();
  for (int step = 0; step < 3; ++step) {
    // No wait_for_gradients(): backward() returns with averaged gradients.
    mse(ddp.forward(inputs(rank * share, share, device)), targets(rank * share, share, device)).backward();
    after_backward(ddp);
    sgd_step(*model, 0.1);
  }
  auto reference = tiny_model(100);
  for (int step = 0; step < 3; ++step) {
    mse(reference->forward(inputs(0, kSamples)), targets(0, kSamples)).backward();
    sgd_step(*reference, 0.1);
  }
  expect_close(model->named_parameters(), reference->named_parameters(), str("parameters after 3 steps, rank ", rank));
}

}  // namespace loom::dist::testing
