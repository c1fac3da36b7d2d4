// Shared by the amp tests: deterministic batches, optimizer factories and one
// training step written the way the apps write it.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include <loom/core/generator.h>
#include <loom/ops/loss.h>
#include <loom/optim/amp.h>

namespace loom::amp_test {

// n images (n, 1, 28, 28) of standard normal pixels and labels in [0, 10):
// the same for the same seed.
inline std::pair<Tensor, Tensor> random_batch(uint64_t seed, DType dtype, int64_t n = 8) {
  Generator generator(seed);
  std::vector<float> pixels(static_cast<size_t>(n * 28 * 28));
  for (auto& p : pixels) p = static_cast<float>(generator.normal());
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (auto& label : labels) label = static_cast<int64_t>(generator.below(10));
  return {Tensor::from_vector(pixels, {n, 1, 28, 28}).to(dtype), Tensor::from_vector(labels, {n})};
}

inline amp::OptimizerFactory sgd(double lr, double momentum = 0.9) {
  return [=](std::vector<Tensor> params) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions(lr).momentum(momentum));
  };
}

inline amp::OptimizerFactory adam(double lr) {
  return [=](std::vector<Tensor> params) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::Adam>(std::move(params), optim::AdamOptions(lr));
  };
}

// forward and loss under autocast, scaled backward, step; whether it stepped.
inline bool train_step(nn::Module& model, amp::MixedPrecisionOptimizer& optimizer, const Tensor& images,
                       const Tensor& labels) {
  Tensor loss;
  {
    auto autocast = optimizer.autocast();
    loss = cross_entropy(model(images), labels);
  }
  optimizer.zero_grad();
  optimizer.scale_loss(loss).backward();
  optimizer.step();
  return !optimizer.last_step_skipped();
}

inline bool train_step(nn::Module& model, amp::MixedPrecisionOptimizer& optimizer, uint64_t seed) {
  auto [images, labels] = random_batch(seed, amp::input_dtype(optimizer.level()));
  return train_step(model, optimizer, images, labels);
}

}  // namespace loom::amp_test
