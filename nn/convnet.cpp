#include <loom/nn/convnet.h>

namespace loom::nn {

ConvNet::ConvNet(int64_t num_classes) {
  layer1 = register_module("layer1", std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
                                         std::make_shared<Conv2d>(1, 16, 5, 1, 2), std::make_shared<BatchNorm2d>(16),
                                         std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2, 2)}));
  layer2 = register_module("layer2", std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
                                         std::make_shared<Conv2d>(16, 32, 5, 1, 2), std::make_shared<BatchNorm2d>(32),
                                         std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2, 2)}));
  fc = register_module("fc", std::make_shared<Linear>(7 * 7 * 32, num_classes));
}

Tensor ConvNet::forward(const Tensor& input) {
  LOOM_CHECK(input.dim() == 4 && input.size(1) == 1 && input.size(2) == 28 && input.size(3) == 28,
             "ConvNet expects (N, 1, 28, 28) images, got ", input.str());
  Tensor out = layer2->forward(layer1->forward(input));
  return fc->forward(out.reshape({out.size(0), -1}));
}

}  // namespace loom::nn
