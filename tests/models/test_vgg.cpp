// vgg11_bn and vgg16_bn: torchvision's state_dict keys and shapes (written
// out below from torchvision/models/vgg.py's cfgs, make_layers(cfg,
// batch_norm=True) and classifier), parameter counts, and a training step on
// CIFAR-size images.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <loom/nn/vgg.h>
#include <loom/ops/elementwise.h>
#include "tests/models/torchvision_keys.h"
#include "tests/support/gradcheck.h"

using namespace loom;

namespace {
// One layer of torchvision's vgg.py cfgs: a 3x3 convolution's output channels, or kMaxPool.
constexpr int64_t kMaxPool = 0;

// torchvision.models.vgg<n>_bn(num_classes=10).state_dict() for the layers
// `cfg`: features.{i} is Conv2d (with bias), features.{i+1} BatchNorm2d,
// features.{i+2} ReLU, with MaxPool2d at the kMaxPool positions; classifier.0,
// .3, .6 are the linear layers, the first on the 512 x 7 x 7 pooled features.
loom::testing::TorchvisionKeys torchvision_keys(const std::vector<int64_t>& cfg) {
  loom::testing::TorchvisionKeys keys;
  int64_t index = 0, in_channels = 3;
  for (int64_t out_channels : cfg) {
    if (out_channels == kMaxPool) {
      index += 1;
      continue;
    }
    const std::string conv = "features." + std::to_string(index) + ".";
    keys.push_back({conv + "weight", {out_channels, in_channels, 3, 3}});
    keys.push_back({conv + "bias", {out_channels}});
    loom::testing::add_batch_norm(keys, "features." + std::to_string(index + 1) + ".", out_channels);
    index += 3;
    in_channels = out_channels;
  }
  loom::testing::add_linear(keys, "classifier.0.", 4096, 512 * 7 * 7);
  loom::testing::add_linear(keys, "classifier.3.", 4096, 4096);
  loom::testing::add_linear(keys, "classifier.6.", 10, 4096);
  return keys;
}

// torchvision's cfgs "A" (vgg11) and "D" (vgg16).
const loom::testing::TorchvisionKeys kVgg11BnKeys =
    torchvision_keys({64, kMaxPool, 128, kMaxPool, 256, 256, kMaxPool, 512, 512, kMaxPool, 512, 512, kMaxPool});
const loom::testing::TorchvisionKeys kVgg16BnKeys = torchvision_keys({64, 64, kMaxPool, 128, 128, kMaxPool, 256, 256,
                                                                      256, kMaxPool, 512, 512, 512, kMaxPool, 512, 512,
                                                                      512, kMaxPool});

}  // namespace
TEST_SUITE_BEGIN("vgg");

// One test, one model of each: the classifier's 100M parameters make building them the cost.
TEST_CASE("vgg11_bn and vgg16_bn have torchvision's state_dict keys, shapes and parameter counts; vgg11_bn trains") {
  manual_seed(3);
  const auto vgg11 = nn::vgg11_bn(nn::VGGOptions().num_classes(10));
  // torchvision's 132,868,840 (1000 classes) less 4097 * 990.
  loom::testing::check_torchvision_state(*vgg11, kVgg11BnKeys, 128812810);
  for (const auto& [name, t] : vgg11->named_parameters()) {
    INFO(name);
    if (name.ends_with("bias")) CHECK(loom::testing::max_abs(t) == 0.0);
  }
  // A training step on CIFAR-size images reaches every parameter.
  loom::testing::check_cifar_training_step(*vgg11, 9);

  const auto vgg16 = nn::vgg16_bn(nn::VGGOptions().num_classes(10));
  // torchvision's 138,365,992 less 4097 * 990.
  loom::testing::check_torchvision_state(*vgg16, kVgg16BnKeys, 134309962);
}

TEST_SUITE_END();
