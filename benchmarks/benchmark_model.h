// The model a benchmark trains, chosen by name, with the shape of its input
// batch: the tutorial's ConvNet on MNIST-sized images, or any other of the
// apps' --model names (10 classes) on CIFAR-sized ones.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <loom/nn/convnet.h>
#include <loom/nn/resnet.h>
#include "apps/training.h"

namespace loom::benchmarks {

struct BenchmarkModel {
  std::shared_ptr<nn::Module> model;
  Shape input_shape;  // (batch, C, H, W)
};

// "convnet": (batch, 1, 28, 28) images; "resnet18" .. "resnet152" (through
// `stem`), "convnext_tiny" and the apps' other names (apps::make_model):
// (batch, 3, 32, 32) images. Parameters come from the global generator.
inline BenchmarkModel make_benchmark_model(const std::string& name, int64_t batch, nn::ResNetStem stem) {
  if (name == "convnet") return {std::make_shared<nn::ConvNet>(), {batch, 1, 28, 28}};
  return {apps::make_model(name, 10, 3, stem), {batch, 3, 32, 32}};
}

}  // namespace loom::benchmarks
