// The tutorials' MNIST ConvNet:
//   layer1 = Sequential(Conv2d(1,16,5,1,2), BatchNorm2d(16), ReLU, MaxPool2d(2,2))
//   layer2 = Sequential(Conv2d(16,32,5,1,2), BatchNorm2d(32), ReLU, MaxPool2d(2,2))
//   fc     = Linear(7*7*32, num_classes)
#pragma once

#include <loom/nn/layers.h>

namespace loom::nn {

class ConvNet : public Module {
 public:
  explicit ConvNet(int64_t num_classes = 10);
  Tensor forward(const Tensor& input) override;  // (N, 1, 28, 28) -> (N, num_classes)
  std::string type_name() const override { return "ConvNet"; }

  std::shared_ptr<Sequential> layer1, layer2;
  std::shared_ptr<Linear> fc;
};

}  // namespace loom::nn
