#include <loom/nn/vgg.h>

#include <loom/nn/mobilenet.h>

namespace loom::nn {

namespace {
constexpr int64_t kPool = 0;  // "M" in torchvision's configurations
}  // namespace

VGG::VGG(const std::vector<int64_t>& widths, const VGGOptions& options) : options_(options) {
  LOOM_CHECK(options.num_classes() > 0, "VGG: num_classes must be positive, got ", options.num_classes());
  auto body = std::make_shared<Sequential>();
  int64_t channels = 3;
  for (int64_t width : widths) {
    if (width == kPool) {
      body->push_back(std::make_shared<MaxPool2d>(2, 2));
      continue;
    }
    body->push_back(std::make_shared<Conv2d>(Conv2dOptions(channels, width, 3).padding(1)));
    body->push_back(std::make_shared<BatchNorm2d>(width));
    body->push_back(std::make_shared<ReLU>());
    channels = width;
  }
  register_module("features", features, std::move(body));
  register_module("avgpool", avgpool, std::make_shared<AdaptiveAvgPool2d>(7, 7));
  register_module("classifier", classifier,
                  std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
                      std::make_shared<Linear>(channels * 7 * 7, 4096), std::make_shared<ReLU>(),
                      std::make_shared<Dropout>(options.dropout()), std::make_shared<Linear>(4096, 4096),
                      std::make_shared<ReLU>(), std::make_shared<Dropout>(options.dropout()),
                      std::make_shared<Linear>(4096, options.num_classes())}));
  // torchvision's VGG init: kaiming_normal_(fan_out, relu) convolutions, zero
  // biases, batch norms ones and zeros, normal(0, 0.01) linear weights.
  initialize_torchvision_cnn(*this, 0.01);
}

Tensor VGG::forward(const Tensor& input) {
  LOOM_CHECK(input.dim() == 4 && input.size(1) == 3, "VGG expects (N, 3, H, W) images, got ", input.str());
  return classifier->forward(avgpool->forward(features->forward(input)).flatten(1));
}

std::shared_ptr<VGG> vgg11_bn(const VGGOptions& options) {
  // torchvision's configuration "A".
  return std::make_shared<VGG>(std::vector<int64_t>{64, kPool, 128, kPool, 256, 256, kPool, 512, 512, kPool, 512, 512,
                                                    kPool},
                               options);
}

std::shared_ptr<VGG> vgg16_bn(const VGGOptions& options) {
  // torchvision's configuration "D".
  return std::make_shared<VGG>(std::vector<int64_t>{64, 64, kPool, 128, 128, kPool, 256, 256, 256, kPool, 512, 512,
                                                    512, kPool, 512, 512, 512, kPool},
                               options);
}

}  // namespace loom::nn
