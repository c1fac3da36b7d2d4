// vgg11_bn and vgg16_bn: torchvision's state_dict keys and shapes (written
// out below from torchvision/models/vgg.py's make_layers(cfg, batch_norm=True)
// and classifier), parameter counts, and a training step on CIFAR-size images.
#include <doctest/doctest.h>

#include <utility>

#include <loom/nn/vgg.h>
#include <loom/ops/elementwise.h>
#include "tests/models/torchvision_keys.h"
#include "tests/support/gradcheck.h"

using namespace loom;

namespace {
// torchvision.models.vgg11_bn(num_classes=10).state_dict(): features.{i} is
// Conv2d, features.{i+1} BatchNorm2d, features.{i+2} ReLU, with MaxPool2d at
// the "M" positions; classifier.0, .3, .6 are the linear layers.
const loom::testing::TorchvisionKeys kVgg11BnKeys = {
      {"features.0.weight", {64, 3, 3, 3}}, {"features.0.bias", {64}}, {"features.1.weight", {64}},
      {"features.1.bias", {64}}, {"features.1.running_mean", {64}}, {"features.1.running_var", {64}},
      {"features.1.num_batches_tracked", {}}, {"features.4.weight", {128, 64, 3, 3}}, {"features.4.bias", {128}},
      {"features.5.weight", {128}}, {"features.5.bias", {128}}, {"features.5.running_mean", {128}},
      {"features.5.running_var", {128}}, {"features.5.num_batches_tracked", {}},
      {"features.8.weight", {256, 128, 3, 3}}, {"features.8.bias", {256}}, {"features.9.weight", {256}},
      {"features.9.bias", {256}}, {"features.9.running_mean", {256}}, {"features.9.running_var", {256}},
      {"features.9.num_batches_tracked", {}}, {"features.11.weight", {256, 256, 3, 3}},
      {"features.11.bias", {256}}, {"features.12.weight", {256}}, {"features.12.bias", {256}},
      {"features.12.running_mean", {256}}, {"features.12.running_var", {256}},
      {"features.12.num_batches_tracked", {}}, {"features.15.weight", {512, 256, 3, 3}},
      {"features.15.bias", {512}}, {"features.16.weight", {512}}, {"features.16.bias", {512}},
      {"features.16.running_mean", {512}}, {"features.16.running_var", {512}},
      {"features.16.num_batches_tracked", {}}, {"features.18.weight", {512, 512, 3, 3}},
      {"features.18.bias", {512}}, {"features.19.weight", {512}}, {"features.19.bias", {512}},
      {"features.19.running_mean", {512}}, {"features.19.running_var", {512}},
      {"features.19.num_batches_tracked", {}}, {"features.22.weight", {512, 512, 3, 3}},
      {"features.22.bias", {512}}, {"features.23.weight", {512}}, {"features.23.bias", {512}},
      {"features.23.running_mean", {512}}, {"features.23.running_var", {512}},
      {"features.23.num_batches_tracked", {}}, {"features.25.weight", {512, 512, 3, 3}},
      {"features.25.bias", {512}}, {"features.26.weight", {512}}, {"features.26.bias", {512}},
      {"features.26.running_mean", {512}}, {"features.26.running_var", {512}},
      {"features.26.num_batches_tracked", {}}, {"classifier.0.weight", {4096, 25088}},
      {"classifier.0.bias", {4096}}, {"classifier.3.weight", {4096, 4096}}, {"classifier.3.bias", {4096}},
      {"classifier.6.weight", {10, 4096}}, {"classifier.6.bias", {10}},
};

// torchvision.models.vgg16_bn(num_classes=10).state_dict().
const loom::testing::TorchvisionKeys kVgg16BnKeys = {
      {"features.0.weight", {64, 3, 3, 3}}, {"features.0.bias", {64}}, {"features.1.weight", {64}},
      {"features.1.bias", {64}}, {"features.1.running_mean", {64}}, {"features.1.running_var", {64}},
      {"features.1.num_batches_tracked", {}}, {"features.3.weight", {64, 64, 3, 3}}, {"features.3.bias", {64}},
      {"features.4.weight", {64}}, {"features.4.bias", {64}}, {"features.4.running_mean", {64}},
      {"features.4.running_var", {64}}, {"features.4.num_batches_tracked", {}},
      {"features.7.weight", {128, 64, 3, 3}}, {"features.7.bias", {128}}, {"features.8.weight", {128}},
      {"features.8.bias", {128}}, {"features.8.running_mean", {128}}, {"features.8.running_var", {128}},
      {"features.8.num_batches_tracked", {}}, {"features.10.weight", {128, 128, 3, 3}},
      {"features.10.bias", {128}}, {"features.11.weight", {128}}, {"features.11.bias", {128}},
      {"features.11.running_mean", {128}}, {"features.11.running_var", {128}},
      {"features.11.num_batches_tracked", {}}, {"features.14.weight", {256, 128, 3, 3}},
      {"features.14.bias", {256}}, {"features.15.weight", {256}}, {"features.15.bias", {256}},
      {"features.15.running_mean", {256}}, {"features.15.running_var", {256}},
      {"features.15.num_batches_tracked", {}}, {"features.17.weight", {256, 256, 3, 3}},
      {"features.17.bias", {256}}, {"features.18.weight", {256}}, {"features.18.bias", {256}},
      {"features.18.running_mean", {256}}, {"features.18.running_var", {256}},
      {"features.18.num_batches_tracked", {}}, {"features.20.weight", {256, 256, 3, 3}},
      {"features.20.bias", {256}}, {"features.21.weight", {256}}, {"features.21.bias", {256}},
      {"features.21.running_mean", {256}}, {"features.21.running_var", {256}},
      {"features.21.num_batches_tracked", {}}, {"features.24.weight", {512, 256, 3, 3}},
      {"features.24.bias", {512}}, {"features.25.weight", {512}}, {"features.25.bias", {512}},
      {"features.25.running_mean", {512}}, {"features.25.running_var", {512}},
      {"features.25.num_batches_tracked", {}}, {"features.27.weight", {512, 512, 3, 3}},
      {"features.27.bias", {512}}, {"features.28.weight", {512}}, {"features.28.bias", {512}},
      {"features.28.running_mean", {512}}, {"features.28.running_var", {512}},
      {"features.28.num_batches_tracked", {}}, {"features.30.weight", {512, 512, 3, 3}},
      {"features.30.bias", {512}}, {"features.31.weight", {512}}, {"features.31.bias", {512}},
      {"features.31.running_mean", {512}}, {"features.31.running_var", {512}},
      {"features.31.num_batches_tracked", {}}, {"features.34.weight", {512, 512, 3, 3}},
      {"features.34.bias", {512}}, {"features.35.weight", {512}}, {"features.35.bias", {512}},
      {"features.35.running_mean", {512}}, {"features.35.running_var", {512}},
      {"features.35.num_batches_tracked", {}}, {"features.37.weight", {512, 512, 3, 3}},
      {"features.37.bias", {512}}, {"features.38.weight", {512}}, {"features.38.bias", {512}},
      {"features.38.running_mean", {512}}, {"features.38.running_var", {512}},
      {"features.38.num_batches_tracked", {}}, {"features.40.weight", {512, 512, 3, 3}},
      {"features.40.bias", {512}}, {"features.41.weight", {512}}, {"features.41.bias", {512}},
      {"features.41.running_mean", {512}}, {"features.41.running_var", {512}},
      {"features.41.num_batches_tracked", {}}, {"classifier.0.weight", {4096, 25088}},
      {"classifier.0.bias", {4096}}, {"classifier.3.weight", {4096, 4096}}, {"classifier.3.bias", {4096}},
      {"classifier.6.weight", {10, 4096}}, {"classifier.6.bias", {10}},
};

}  // namespace
TEST_SUITE_BEGIN("vgg");

// One test, one model of each: the classifier's 100M parameters make building them the cost.
TEST_CASE("vgg11_bn and vgg16_bn have torchvision's state_dict keys, shapes and parameter counts; vgg11_bn trains") {
  manual_seed(3);
  const auto vgg11 = nn::vgg11_bn(nn::VGGOptions().num_classes(10));
  loom::testing::check_torchvision_keys(*vgg11, kVgg11BnKeys);
  // torchvision's 132,868,840 (1000 classes) less 4097 * 990.
  CHECK(nn::count_parameters(*vgg11) == 128812810);
  for (const auto& [name, t] : vgg11->named_parameters()) {
    INFO(name);
    if (name.ends_with("bias")) CHECK(loom::testing::max_abs(t) == 0.0);
  }
  // A training step on CIFAR-size images reaches every parameter.
  loom::testing::check_cifar_training_step(*vgg11, 9);

  const auto vgg16 = nn::vgg16_bn(nn::VGGOptions().num_classes(10));
  loom::testing::check_torchvision_keys(*vgg16, kVgg16BnKeys);
  // torchvision's 138,365,992 less 4097 * 990.
  CHECK(nn::count_parameters(*vgg16) == 134309962);
}

TEST_SUITE_END();
