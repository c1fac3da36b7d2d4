// The model the GPU tests of the Trainer's --cuda-graph train twice, once
// eagerly and once captured, and compare: the ConvNet at amp O2 under SGD
// (rate 0.05, momentum 0.9, loss scale 1024 to start), seeded, on a GPU.
#pragma once

#include <memory>
#include <vector>

#include <loom/core/generator.h>
#include <loom/nn/convnet.h>
#include <loom/optim/amp.h>
#include <loom/optim/optimizer.h>

namespace loom::gpu_testing {

struct ConvNetO2 {
  std::shared_ptr<nn::ConvNet> model;
  std::shared_ptr<amp::MixedPrecisionOptimizer> optimizer;

  explicit ConvNetO2(Device device) {
    manual_seed(11);
    model = std::make_shared<nn::ConvNet>();
    model->to(device);
    optimizer = amp::initialize(
        *model,
        [](std::vector<Tensor> p) { return std::make_unique<optim::SGD>(p, optim::SGDOptions(0.05).momentum(0.9)); },
        amp::OptLevel::O2, optim::GradScalerOptions().init_scale(1024));
  }

  // Every state_dict entry on the host in f64, then the loss scale.
  std::vector<std::vector<double>> state() const {
    std::vector<std::vector<double>> values;
    for (auto& [name, t] : model->state_dict()) values.push_back(t.detach().to(Device::cpu()).to_vector<double>());
    values.push_back({optimizer->scaler().get_scale()});
    return values;
  }
};

}  // namespace loom::gpu_testing
