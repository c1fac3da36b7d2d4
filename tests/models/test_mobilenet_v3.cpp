// MobileNetV3 small and large: torchvision's state_dict keys and shapes
// (written out below from torchvision/models/mobilenetv3.py's
// _mobilenet_v3_conf and module tree), parameter counts, the batch norms'
// eps and momentum, squeeze-and-excitation by hand, and a training step on
// CIFAR-size images.
#include <doctest/doctest.h>

#include <utility>

#include <loom/nn/mobilenet.h>
#include <loom/ops/elementwise.h>
#include "tests/models/torchvision_keys.h"
#include "tests/support/gradcheck.h"

using namespace loom;

namespace {
// torchvision.models.mobilenet_v3_large(num_classes=10).state_dict():
// features.0 and the last features entry are Conv2dNormActivation; each
// features.{i}.block is Sequential([expand], depthwise, [SqueezeExcitation
// (fc1, fc2)], project); classifier.0 and .3 are the linear layers.
const loom::testing::TorchvisionKeys kLargeKeys = {
      {"features.0.0.weight", {16, 3, 3, 3}}, {"features.0.1.weight", {16}}, {"features.0.1.bias", {16}},
      {"features.0.1.running_mean", {16}}, {"features.0.1.running_var", {16}},
      {"features.0.1.num_batches_tracked", {}}, {"features.1.block.0.0.weight", {16, 1, 3, 3}},
      {"features.1.block.0.1.weight", {16}}, {"features.1.block.0.1.bias", {16}},
      {"features.1.block.0.1.running_mean", {16}}, {"features.1.block.0.1.running_var", {16}},
      {"features.1.block.0.1.num_batches_tracked", {}}, {"features.1.block.1.0.weight", {16, 16, 1, 1}},
      {"features.1.block.1.1.weight", {16}}, {"features.1.block.1.1.bias", {16}},
      {"features.1.block.1.1.running_mean", {16}}, {"features.1.block.1.1.running_var", {16}},
      {"features.1.block.1.1.num_batches_tracked", {}}, {"features.2.block.0.0.weight", {64, 16, 1, 1}},
      {"features.2.block.0.1.weight", {64}}, {"features.2.block.0.1.bias", {64}},
      {"features.2.block.0.1.running_mean", {64}}, {"features.2.block.0.1.running_var", {64}},
      {"features.2.block.0.1.num_batches_tracked", {}}, {"features.2.block.1.0.weight", {64, 1, 3, 3}},
      {"features.2.block.1.1.weight", {64}}, {"features.2.block.1.1.bias", {64}},
      {"features.2.block.1.1.running_mean", {64}}, {"features.2.block.1.1.running_var", {64}},
      {"features.2.block.1.1.num_batches_tracked", {}}, {"features.2.block.2.0.weight", {24, 64, 1, 1}},
      {"features.2.block.2.1.weight", {24}}, {"features.2.block.2.1.bias", {24}},
      {"features.2.block.2.1.running_mean", {24}}, {"features.2.block.2.1.running_var", {24}},
      {"features.2.block.2.1.num_batches_tracked", {}}, {"features.3.block.0.0.weight", {72, 24, 1, 1}},
      {"features.3.block.0.1.weight", {72}}, {"features.3.block.0.1.bias", {72}},
      {"features.3.block.0.1.running_mean", {72}}, {"features.3.block.0.1.running_var", {72}},
      {"features.3.block.0.1.num_batches_tracked", {}}, {"features.3.block.1.0.weight", {72, 1, 3, 3}},
      {"features.3.block.1.1.weight", {72}}, {"features.3.block.1.1.bias", {72}},
      {"features.3.block.1.1.running_mean", {72}}, {"features.3.block.1.1.running_var", {72}},
      {"features.3.block.1.1.num_batches_tracked", {}}, {"features.3.block.2.0.weight", {24, 72, 1, 1}},
      {"features.3.block.2.1.weight", {24}}, {"features.3.block.2.1.bias", {24}},
      {"features.3.block.2.1.running_mean", {24}}, {"features.3.block.2.1.running_var", {24}},
      {"features.3.block.2.1.num_batches_tracked", {}}, {"features.4.block.0.0.weight", {72, 24, 1, 1}},
      {"features.4.block.0.1.weight", {72}}, {"features.4.block.0.1.bias", {72}},
      {"features.4.block.0.1.running_mean", {72}}, {"features.4.block.0.1.running_var", {72}},
      {"features.4.block.0.1.num_batches_tracked", {}}, {"features.4.block.1.0.weight", {72, 1, 5, 5}},
      {"features.4.block.1.1.weight", {72}}, {"features.4.block.1.1.bias", {72}},
      {"features.4.block.1.1.running_mean", {72}}, {"features.4.block.1.1.running_var", {72}},
      {"features.4.block.1.1.num_batches_tracked", {}}, {"features.4.block.2.fc1.weight", {24, 72, 1, 1}},
      {"features.4.block.2.fc1.bias", {24}}, {"features.4.block.2.fc2.weight", {72, 24, 1, 1}},
      {"features.4.block.2.fc2.bias", {72}}, {"features.4.block.3.0.weight", {40, 72, 1, 1}},
      {"features.4.block.3.1.weight", {40}}, {"features.4.block.3.1.bias", {40}},
      {"features.4.block.3.1.running_mean", {40}}, {"features.4.block.3.1.running_var", {40}},
      {"features.4.block.3.1.num_batches_tracked", {}}, {"features.5.block.0.0.weight", {120, 40, 1, 1}},
      {"features.5.block.0.1.weight", {120}}, {"features.5.block.0.1.bias", {120}},
      {"features.5.block.0.1.running_mean", {120}}, {"features.5.block.0.1.running_var", {120}},
      {"features.5.block.0.1.num_batches_tracked", {}}, {"features.5.block.1.0.weight", {120, 1, 5, 5}},
      {"features.5.block.1.1.weight", {120}}, {"features.5.block.1.1.bias", {120}},
      {"features.5.block.1.1.running_mean", {120}}, {"features.5.block.1.1.running_var", {120}},
      {"features.5.block.1.1.num_batches_tracked", {}}, {"features.5.block.2.fc1.weight", {32, 120, 1, 1}},
      {"features.5.block.2.fc1.bias", {32}}, {"features.5.block.2.fc2.weight", {120, 32, 1, 1}},
      {"features.5.block.2.fc2.bias", {120}}, {"features.5.block.3.0.weight", {40, 120, 1, 1}},
      {"features.5.block.3.1.weight", {40}}, {"features.5.block.3.1.bias", {40}},
      {"features.5.block.3.1.running_mean", {40}}, {"features.5.block.3.1.running_var", {40}},
      {"features.5.block.3.1.num_batches_tracked", {}}, {"features.6.block.0.0.weight", {120, 40, 1, 1}},
      {"features.6.block.0.1.weight", {120}}, {"features.6.block.0.1.bias", {120}},
      {"features.6.block.0.1.running_mean", {120}}, {"features.6.block.0.1.running_var", {120}},
      {"features.6.block.0.1.num_batches_tracked", {}}, {"features.6.block.1.0.weight", {120, 1, 5, 5}},
      {"features.6.block.1.1.weight", {120}}, {"features.6.block.1.1.bias", {120}},
      {"features.6.block.1.1.running_mean", {120}}, {"features.6.block.1.1.running_var", {120}},
      {"features.6.block.1.1.num_batches_tracked", {}}, {"features.6.block.2.fc1.weight", {32, 120, 1, 1}},
      {"features.6.block.2.fc1.bias", {32}}, {"features.6.block.2.fc2.weight", {120, 32, 1, 1}},
      {"features.6.block.2.fc2.bias", {120}}, {"features.6.block.3.0.weight", {40, 120, 1, 1}},
      {"features.6.block.3.1.weight", {40}}, {"features.6.block.3.1.bias", {40}},
      {"features.6.block.3.1.running_mean", {40}}, {"features.6.block.3.1.running_var", {40}},
      {"features.6.block.3.1.num_batches_tracked", {}}, {"features.7.block.0.0.weight", {240, 40, 1, 1}},
      {"features.7.block.0.1.weight", {240}}, {"features.7.block.0.1.bias", {240}},
      {"features.7.block.0.1.running_mean", {240}}, {"features.7.block.0.1.running_var", {240}},
      {"features.7.block.0.1.num_batches_tracked", {}}, {"features.7.block.1.0.weight", {240, 1, 3, 3}},
      {"features.7.block.1.1.weight", {240}}, {"features.7.block.1.1.bias", {240}},
      {"features.7.block.1.1.running_mean", {240}}, {"features.7.block.1.1.running_var", {240}},
      {"features.7.block.1.1.num_batches_tracked", {}}, {"features.7.block.2.0.weight", {80, 240, 1, 1}},
      {"features.7.block.2.1.weight", {80}}, {"features.7.block.2.1.bias", {80}},
      {"features.7.block.2.1.running_mean", {80}}, {"features.7.block.2.1.running_var", {80}},
      {"features.7.block.2.1.num_batches_tracked", {}}, {"features.8.block.0.0.weight", {200, 80, 1, 1}},
      {"features.8.block.0.1.weight", {200}}, {"features.8.block.0.1.bias", {200}},
      {"features.8.block.0.1.running_mean", {200}}, {"features.8.block.0.1.running_var", {200}},
      {"features.8.block.0.1.num_batches_tracked", {}}, {"features.8.block.1.0.weight", {200, 1, 3, 3}},
      {"features.8.block.1.1.weight", {200}}, {"features.8.block.1.1.bias", {200}},
      {"features.8.block.1.1.running_mean", {200}}, {"features.8.block.1.1.running_var", {200}},
      {"features.8.block.1.1.num_batches_tracked", {}}, {"features.8.block.2.0.weight", {80, 200, 1, 1}},
      {"features.8.block.2.1.weight", {80}}, {"features.8.block.2.1.bias", {80}},
      {"features.8.block.2.1.running_mean", {80}}, {"features.8.block.2.1.running_var", {80}},
      {"features.8.block.2.1.num_batches_tracked", {}}, {"features.9.block.0.0.weight", {184, 80, 1, 1}},
      {"features.9.block.0.1.weight", {184}}, {"features.9.block.0.1.bias", {184}},
      {"features.9.block.0.1.running_mean", {184}}, {"features.9.block.0.1.running_var", {184}},
      {"features.9.block.0.1.num_batches_tracked", {}}, {"features.9.block.1.0.weight", {184, 1, 3, 3}},
      {"features.9.block.1.1.weight", {184}}, {"features.9.block.1.1.bias", {184}},
      {"features.9.block.1.1.running_mean", {184}}, {"features.9.block.1.1.running_var", {184}},
      {"features.9.block.1.1.num_batches_tracked", {}}, {"features.9.block.2.0.weight", {80, 184, 1, 1}},
      {"features.9.block.2.1.weight", {80}}, {"features.9.block.2.1.bias", {80}},
      {"features.9.block.2.1.running_mean", {80}}, {"features.9.block.2.1.running_var", {80}},
      {"features.9.block.2.1.num_batches_tracked", {}}, {"features.10.block.0.0.weight", {184, 80, 1, 1}},
      {"features.10.block.0.1.weight", {184}}, {"features.10.block.0.1.bias", {184}},
      {"features.10.block.0.1.running_mean", {184}}, {"features.10.block.0.1.running_var", {184}},
      {"features.10.block.0.1.num_batches_tracked", {}}, {"features.10.block.1.0.weight", {184, 1, 3, 3}},
      {"features.10.block.1.1.weight", {184}}, {"features.10.block.1.1.bias", {184}},
      {"features.10.block.1.1.running_mean", {184}}, {"features.10.block.1.1.running_var", {184}},
      {"features.10.block.1.1.num_batches_tracked", {}}, {"features.10.block.2.0.weight", {80, 184, 1, 1}},
      {"features.10.block.2.1.weight", {80}}, {"features.10.block.2.1.bias", {80}},
      {"features.10.block.2.1.running_mean", {80}}, {"features.10.block.2.1.running_var", {80}},
      {"features.10.block.2.1.num_batches_tracked", {}}, {"features.11.block.0.0.weight", {480, 80, 1, 1}},
      {"features.11.block.0.1.weight", {480}}, {"features.11.block.0.1.bias", {480}},
      {"features.11.block.0.1.running_mean", {480}}, {"features.11.block.0.1.running_var", {480}},
      {"features.11.block.0.1.num_batches_tracked", {}}, {"features.11.block.1.0.weight", {480, 1, 3, 3}},
      {"features.11.block.1.1.weight", {480}}, {"features.11.block.1.1.bias", {480}},
      {"features.11.block.1.1.running_mean", {480}}, {"features.11.block.1.1.running_var", {480}},
      {"features.11.block.1.1.num_batches_tracked", {}}, {"features.11.block.2.fc1.weight", {120, 480, 1, 1}},
      {"features.11.block.2.fc1.bias", {120}}, {"features.11.block.2.fc2.weight", {480, 120, 1, 1}},
      {"features.11.block.2.fc2.bias", {480}}, {"features.11.block.3.0.weight", {112, 480, 1, 1}},
      {"features.11.block.3.1.weight", {112}}, {"features.11.block.3.1.bias", {112}},
      {"features.11.block.3.1.running_mean", {112}}, {"features.11.block.3.1.running_var", {112}},
      {"features.11.block.3.1.num_batches_tracked", {}}, {"features.12.block.0.0.weight", {672, 112, 1, 1}},
      {"features.12.block.0.1.weight", {672}}, {"features.12.block.0.1.bias", {672}},
      {"features.12.block.0.1.running_mean", {672}}, {"features.12.block.0.1.running_var", {672}},
      {"features.12.block.0.1.num_batches_tracked", {}}, {"features.12.block.1.0.weight", {672, 1, 3, 3}},
      {"features.12.block.1.1.weight", {672}}, {"features.12.block.1.1.bias", {672}},
      {"features.12.block.1.1.running_mean", {672}}, {"features.12.block.1.1.running_var", {672}},
      {"features.12.block.1.1.num_batches_tracked", {}}, {"features.12.block.2.fc1.weight", {168, 672, 1, 1}},
      {"features.12.block.2.fc1.bias", {168}}, {"features.12.block.2.fc2.weight", {672, 168, 1, 1}},
      {"features.12.block.2.fc2.bias", {672}}, {"features.12.block.3.0.weight", {112, 672, 1, 1}},
      {"features.12.block.3.1.weight", {112}}, {"features.12.block.3.1.bias", {112}},
      {"features.12.block.3.1.running_mean", {112}}, {"features.12.block.3.1.running_var", {112}},
      {"features.12.block.3.1.num_batches_tracked", {}}, {"features.13.block.0.0.weight", {672, 112, 1, 1}},
      {"features.13.block.0.1.weight", {672}}, {"features.13.block.0.1.bias", {672}},
      {"features.13.block.0.1.running_mean", {672}}, {"features.13.block.0.1.running_var", {672}},
      {"features.13.block.0.1.num_batches_tracked", {}}, {"features.13.block.1.0.weight", {672, 1, 5, 5}},
      {"features.13.block.1.1.weight", {672}}, {"features.13.block.1.1.bias", {672}},
      {"features.13.block.1.1.running_mean", {672}}, {"features.13.block.1.1.running_var", {672}},
      {"features.13.block.1.1.num_batches_tracked", {}}, {"features.13.block.2.fc1.weight", {168, 672, 1, 1}},
      {"features.13.block.2.fc1.bias", {168}}, {"features.13.block.2.fc2.weight", {672, 168, 1, 1}},
      {"features.13.block.2.fc2.bias", {672}}, {"features.13.block.3.0.weight", {160, 672, 1, 1}},
      {"features.13.block.3.1.weight", {160}}, {"features.13.block.3.1.bias", {160}},
      {"features.13.block.3.1.running_mean", {160}}, {"features.13.block.3.1.running_var", {160}},
      {"features.13.block.3.1.num_batches_tracked", {}}, {"features.14.block.0.0.weight", {960, 160, 1, 1}},
      {"features.14.block.0.1.weight", {960}}, {"features.14.block.0.1.bias", {960}},
      {"features.14.block.0.1.running_mean", {960}}, {"features.14.block.0.1.running_var", {960}},
      {"features.14.block.0.1.num_batches_tracked", {}}, {"features.14.block.1.0.weight", {960, 1, 5, 5}},
      {"features.14.block.1.1.weight", {960}}, {"features.14.block.1.1.bias", {960}},
      {"features.14.block.1.1.running_mean", {960}}, {"features.14.block.1.1.running_var", {960}},
      {"features.14.block.1.1.num_batches_tracked", {}}, {"features.14.block.2.fc1.weight", {240, 960, 1, 1}},
      {"features.14.block.2.fc1.bias", {240}}, {"features.14.block.2.fc2.weight", {960, 240, 1, 1}},
      {"features.14.block.2.fc2.bias", {960}}, {"features.14.block.3.0.weight", {160, 960, 1, 1}},
      {"features.14.block.3.1.weight", {160}}, {"features.14.block.3.1.bias", {160}},
      {"features.14.block.3.1.running_mean", {160}}, {"features.14.block.3.1.running_var", {160}},
      {"features.14.block.3.1.num_batches_tracked", {}}, {"features.15.block.0.0.weight", {960, 160, 1, 1}},
      {"features.15.block.0.1.weight", {960}}, {"features.15.block.0.1.bias", {960}},
      {"features.15.block.0.1.running_mean", {960}}, {"features.15.block.0.1.running_var", {960}},
      {"features.15.block.0.1.num_batches_tracked", {}}, {"features.15.block.1.0.weight", {960, 1, 5, 5}},
      {"features.15.block.1.1.weight", {960}}, {"features.15.block.1.1.bias", {960}},
      {"features.15.block.1.1.running_mean", {960}}, {"features.15.block.1.1.running_var", {960}},
      {"features.15.block.1.1.num_batches_tracked", {}}, {"features.15.block.2.fc1.weight", {240, 960, 1, 1}},
      {"features.15.block.2.fc1.bias", {240}}, {"features.15.block.2.fc2.weight", {960, 240, 1, 1}},
      {"features.15.block.2.fc2.bias", {960}}, {"features.15.block.3.0.weight", {160, 960, 1, 1}},
      {"features.15.block.3.1.weight", {160}}, {"features.15.block.3.1.bias", {160}},
      {"features.15.block.3.1.running_mean", {160}}, {"features.15.block.3.1.running_var", {160}},
      {"features.15.block.3.1.num_batches_tracked", {}}, {"features.16.0.weight", {960, 160, 1, 1}},
      {"features.16.1.weight", {960}}, {"features.16.1.bias", {960}}, {"features.16.1.running_mean", {960}},
      {"features.16.1.running_var", {960}}, {"features.16.1.num_batches_tracked", {}},
      {"classifier.0.weight", {1280, 960}}, {"classifier.0.bias", {1280}}, {"classifier.3.weight", {10, 1280}},
      {"classifier.3.bias", {10}},
};

// torchvision.models.mobilenet_v3_small(num_classes=10).state_dict().
const loom::testing::TorchvisionKeys kSmallKeys = {
      {"features.0.0.weight", {16, 3, 3, 3}}, {"features.0.1.weight", {16}}, {"features.0.1.bias", {16}},
      {"features.0.1.running_mean", {16}}, {"features.0.1.running_var", {16}},
      {"features.0.1.num_batches_tracked", {}}, {"features.1.block.0.0.weight", {16, 1, 3, 3}},
      {"features.1.block.0.1.weight", {16}}, {"features.1.block.0.1.bias", {16}},
      {"features.1.block.0.1.running_mean", {16}}, {"features.1.block.0.1.running_var", {16}},
      {"features.1.block.0.1.num_batches_tracked", {}}, {"features.1.block.1.fc1.weight", {8, 16, 1, 1}},
      {"features.1.block.1.fc1.bias", {8}}, {"features.1.block.1.fc2.weight", {16, 8, 1, 1}},
      {"features.1.block.1.fc2.bias", {16}}, {"features.1.block.2.0.weight", {16, 16, 1, 1}},
      {"features.1.block.2.1.weight", {16}}, {"features.1.block.2.1.bias", {16}},
      {"features.1.block.2.1.running_mean", {16}}, {"features.1.block.2.1.running_var", {16}},
      {"features.1.block.2.1.num_batches_tracked", {}}, {"features.2.block.0.0.weight", {72, 16, 1, 1}},
      {"features.2.block.0.1.weight", {72}}, {"features.2.block.0.1.bias", {72}},
      {"features.2.block.0.1.running_mean", {72}}, {"features.2.block.0.1.running_var", {72}},
      {"features.2.block.0.1.num_batches_tracked", {}}, {"features.2.block.1.0.weight", {72, 1, 3, 3}},
      {"features.2.block.1.1.weight", {72}}, {"features.2.block.1.1.bias", {72}},
      {"features.2.block.1.1.running_mean", {72}}, {"features.2.block.1.1.running_var", {72}},
      {"features.2.block.1.1.num_batches_tracked", {}}, {"features.2.block.2.0.weight", {24, 72, 1, 1}},
      {"features.2.block.2.1.weight", {24}}, {"features.2.block.2.1.bias", {24}},
      {"features.2.block.2.1.running_mean", {24}}, {"features.2.block.2.1.running_var", {24}},
      {"features.2.block.2.1.num_batches_tracked", {}}, {"features.3.block.0.0.weight", {88, 24, 1, 1}},
      {"features.3.block.0.1.weight", {88}}, {"features.3.block.0.1.bias", {88}},
      {"features.3.block.0.1.running_mean", {88}}, {"features.3.block.0.1.running_var", {88}},
      {"features.3.block.0.1.num_batches_tracked", {}}, {"features.3.block.1.0.weight", {88, 1, 3, 3}},
      {"features.3.block.1.1.weight", {88}}, {"features.3.block.1.1.bias", {88}},
      {"features.3.block.1.1.running_mean", {88}}, {"features.3.block.1.1.running_var", {88}},
      {"features.3.block.1.1.num_batches_tracked", {}}, {"features.3.block.2.0.weight", {24, 88, 1, 1}},
      {"features.3.block.2.1.weight", {24}}, {"features.3.block.2.1.bias", {24}},
      {"features.3.block.2.1.running_mean", {24}}, {"features.3.block.2.1.running_var", {24}},
      {"features.3.block.2.1.num_batches_tracked", {}}, {"features.4.block.0.0.weight", {96, 24, 1, 1}},
      {"features.4.block.0.1.weight", {96}}, {"features.4.block.0.1.bias", {96}},
      {"features.4.block.0.1.running_mean", {96}}, {"features.4.block.0.1.running_var", {96}},
      {"features.4.block.0.1.num_batches_tracked", {}}, {"features.4.block.1.0.weight", {96, 1, 5, 5}},
      {"features.4.block.1.1.weight", {96}}, {"features.4.block.1.1.bias", {96}},
      {"features.4.block.1.1.running_mean", {96}}, {"features.4.block.1.1.running_var", {96}},
      {"features.4.block.1.1.num_batches_tracked", {}}, {"features.4.block.2.fc1.weight", {24, 96, 1, 1}},
      {"features.4.block.2.fc1.bias", {24}}, {"features.4.block.2.fc2.weight", {96, 24, 1, 1}},
      {"features.4.block.2.fc2.bias", {96}}, {"features.4.block.3.0.weight", {40, 96, 1, 1}},
      {"features.4.block.3.1.weight", {40}}, {"features.4.block.3.1.bias", {40}},
      {"features.4.block.3.1.running_mean", {40}}, {"features.4.block.3.1.running_var", {40}},
      {"features.4.block.3.1.num_batches_tracked", {}}, {"features.5.block.0.0.weight", {240, 40, 1, 1}},
      {"features.5.block.0.1.weight", {240}}, {"features.5.block.0.1.bias", {240}},
      {"features.5.block.0.1.running_mean", {240}}, {"features.5.block.0.1.running_var", {240}},
      {"features.5.block.0.1.num_batches_tracked", {}}, {"features.5.block.1.0.weight", {240, 1, 5, 5}},
      {"features.5.block.1.1.weight", {240}}, {"features.5.block.1.1.bias", {240}},
      {"features.5.block.1.1.running_mean", {240}}, {"features.5.block.1.1.running_var", {240}},
      {"features.5.block.1.1.num_batches_tracked", {}}, {"features.5.block.2.fc1.weight", {64, 240, 1, 1}},
      {"features.5.block.2.fc1.bias", {64}}, {"features.5.block.2.fc2.weight", {240, 64, 1, 1}},
      {"features.5.block.2.fc2.bias", {240}}, {"features.5.block.3.0.weight", {40, 240, 1, 1}},
      {"features.5.block.3.1.weight", {40}}, {"features.5.block.3.1.bias", {40}},
      {"features.5.block.3.1.running_mean", {40}}, {"features.5.block.3.1.running_var", {40}},
      {"features.5.block.3.1.num_batches_tracked", {}}, {"features.6.block.0.0.weight", {240, 40, 1, 1}},
      {"features.6.block.0.1.weight", {240}}, {"features.6.block.0.1.bias", {240}},
      {"features.6.block.0.1.running_mean", {240}}, {"features.6.block.0.1.running_var", {240}},
      {"features.6.block.0.1.num_batches_tracked", {}}, {"features.6.block.1.0.weight", {240, 1, 5, 5}},
      {"features.6.block.1.1.weight", {240}}, {"features.6.block.1.1.bias", {240}},
      {"features.6.block.1.1.running_mean", {240}}, {"features.6.block.1.1.running_var", {240}},
      {"features.6.block.1.1.num_batches_tracked", {}}, {"features.6.block.2.fc1.weight", {64, 240, 1, 1}},
      {"features.6.block.2.fc1.bias", {64}}, {"features.6.block.2.fc2.weight", {240, 64, 1, 1}},
      {"features.6.block.2.fc2.bias", {240}}, {"features.6.block.3.0.weight", {40, 240, 1, 1}},
      {"features.6.block.3.1.weight", {40}}, {"features.6.block.3.1.bias", {40}},
      {"features.6.block.3.1.running_mean", {40}}, {"features.6.block.3.1.running_var", {40}},
      {"features.6.block.3.1.num_batches_tracked", {}}, {"features.7.block.0.0.weight", {120, 40, 1, 1}},
      {"features.7.block.0.1.weight", {120}}, {"features.7.block.0.1.bias", {120}},
      {"features.7.block.0.1.running_mean", {120}}, {"features.7.block.0.1.running_var", {120}},
      {"features.7.block.0.1.num_batches_tracked", {}}, {"features.7.block.1.0.weight", {120, 1, 5, 5}},
      {"features.7.block.1.1.weight", {120}}, {"features.7.block.1.1.bias", {120}},
      {"features.7.block.1.1.running_mean", {120}}, {"features.7.block.1.1.running_var", {120}},
      {"features.7.block.1.1.num_batches_tracked", {}}, {"features.7.block.2.fc1.weight", {32, 120, 1, 1}},
      {"features.7.block.2.fc1.bias", {32}}, {"features.7.block.2.fc2.weight", {120, 32, 1, 1}},
      {"features.7.block.2.fc2.bias", {120}}, {"features.7.block.3.0.weight", {48, 120, 1, 1}},
      {"features.7.block.3.1.weight", {48}}, {"features.7.block.3.1.bias", {48}},
      {"features.7.block.3.1.running_mean", {48}}, {"features.7.block.3.1.running_var", {48}},
      {"features.7.block.3.1.num_batches_tracked", {}}, {"features.8.block.0.0.weight", {144, 48, 1, 1}},
      {"features.8.block.0.1.weight", {144}}, {"features.8.block.0.1.bias", {144}},
      {"features.8.block.0.1.running_mean", {144}}, {"features.8.block.0.1.running_var", {144}},
      {"features.8.block.0.1.num_batches_tracked", {}}, {"features.8.block.1.0.weight", {144, 1, 5, 5}},
      {"features.8.block.1.1.weight", {144}}, {"features.8.block.1.1.bias", {144}},
      {"features.8.block.1.1.running_mean", {144}}, {"features.8.block.1.1.running_var", {144}},
      {"features.8.block.1.1.num_batches_tracked", {}}, {"features.8.block.2.fc1.weight", {40, 144, 1, 1}},
      {"features.8.block.2.fc1.bias", {40}}, {"features.8.block.2.fc2.weight", {144, 40, 1, 1}},
      {"features.8.block.2.fc2.bias", {144}}, {"features.8.block.3.0.weight", {48, 144, 1, 1}},
      {"features.8.block.3.1.weight", {48}}, {"features.8.block.3.1.bias", {48}},
      {"features.8.block.3.1.running_mean", {48}}, {"features.8.block.3.1.running_var", {48}},
      {"features.8.block.3.1.num_batches_tracked", {}}, {"features.9.block.0.0.weight", {288, 48, 1, 1}},
      {"features.9.block.0.1.weight", {288}}, {"features.9.block.0.1.bias", {288}},
      {"features.9.block.0.1.running_mean", {288}}, {"features.9.block.0.1.running_var", {288}},
      {"features.9.block.0.1.num_batches_tracked", {}}, {"features.9.block.1.0.weight", {288, 1, 5, 5}},
      {"features.9.block.1.1.weight", {288}}, {"features.9.block.1.1.bias", {288}},
      {"features.9.block.1.1.running_mean", {288}}, {"features.9.block.1.1.running_var", {288}},
      {"features.9.block.1.1.num_batches_tracked", {}}, {"features.9.block.2.fc1.weight", {72, 288, 1, 1}},
      {"features.9.block.2.fc1.bias", {72}}, {"features.9.block.2.fc2.weight", {288, 72, 1, 1}},
      {"features.9.block.2.fc2.bias", {288}}, {"features.9.block.3.0.weight", {96, 288, 1, 1}},
      {"features.9.block.3.1.weight", {96}}, {"features.9.block.3.1.bias", {96}},
      {"features.9.block.3.1.running_mean", {96}}, {"features.9.block.3.1.running_var", {96}},
      {"features.9.block.3.1.num_batches_tracked", {}}, {"features.10.block.0.0.weight", {576, 96, 1, 1}},
      {"features.10.block.0.1.weight", {576}}, {"features.10.block.0.1.bias", {576}},
      {"features.10.block.0.1.running_mean", {576}}, {"features.10.block.0.1.running_var", {576}},
      {"features.10.block.0.1.num_batches_tracked", {}}, {"features.10.block.1.0.weight", {576, 1, 5, 5}},
      {"features.10.block.1.1.weight", {576}}, {"features.10.block.1.1.bias", {576}},
      {"features.10.block.1.1.running_mean", {576}}, {"features.10.block.1.1.running_var", {576}},
      {"features.10.block.1.1.num_batches_tracked", {}}, {"features.10.block.2.fc1.weight", {144, 576, 1, 1}},
      {"features.10.block.2.fc1.bias", {144}}, {"features.10.block.2.fc2.weight", {576, 144, 1, 1}},
      {"features.10.block.2.fc2.bias", {576}}, {"features.10.block.3.0.weight", {96, 576, 1, 1}},
      {"features.10.block.3.1.weight", {96}}, {"features.10.block.3.1.bias", {96}},
      {"features.10.block.3.1.running_mean", {96}}, {"features.10.block.3.1.running_var", {96}},
      {"features.10.block.3.1.num_batches_tracked", {}}, {"features.11.block.0.0.weight", {576, 96, 1, 1}},
      {"features.11.block.0.1.weight", {576}}, {"features.11.block.0.1.bias", {576}},
      {"features.11.block.0.1.running_mean", {576}}, {"features.11.block.0.1.running_var", {576}},
      {"features.11.block.0.1.num_batches_tracked", {}}, {"features.11.block.1.0.weight", {576, 1, 5, 5}},
      {"features.11.block.1.1.weight", {576}}, {"features.11.block.1.1.bias", {576}},
      {"features.11.block.1.1.running_mean", {576}}, {"features.11.block.1.1.running_var", {576}},
      {"features.11.block.1.1.num_batches_tracked", {}}, {"features.11.block.2.fc1.weight", {144, 576, 1, 1}},
      {"features.11.block.2.fc1.bias", {144}}, {"features.11.block.2.fc2.weight", {576, 144, 1, 1}},
      {"features.11.block.2.fc2.bias", {576}}, {"features.11.block.3.0.weight", {96, 576, 1, 1}},
      {"features.11.block.3.1.weight", {96}}, {"features.11.block.3.1.bias", {96}},
      {"features.11.block.3.1.running_mean", {96}}, {"features.11.block.3.1.running_var", {96}},
      {"features.11.block.3.1.num_batches_tracked", {}}, {"features.12.0.weight", {576, 96, 1, 1}},
      {"features.12.1.weight", {576}}, {"features.12.1.bias", {576}}, {"features.12.1.running_mean", {576}},
      {"features.12.1.running_var", {576}}, {"features.12.1.num_batches_tracked", {}},
      {"classifier.0.weight", {1024, 576}}, {"classifier.0.bias", {1024}}, {"classifier.3.weight", {10, 1024}},
      {"classifier.3.bias", {10}},
};

}  // namespace
TEST_SUITE_BEGIN("mobilenet_v3");

TEST_CASE("mobilenet_v3_large and mobilenet_v3_small have torchvision's keys, shapes and parameter counts") {
  const auto large = nn::mobilenet_v3_large(nn::MobileNetV3Options().num_classes(10));
  loom::testing::check_torchvision_keys(*large, kLargeKeys);
  // torchvision's 5,483,032 (1000 classes) less 1281 * 990.
  CHECK(nn::count_parameters(*large) == 4214842);
  CHECK(nn::count_parameters(*nn::mobilenet_v3_large()) == 5483032);
  const auto small = nn::mobilenet_v3_small(nn::MobileNetV3Options().num_classes(10));
  loom::testing::check_torchvision_keys(*small, kSmallKeys);
  // torchvision's 2,542,856 less 1025 * 990.
  CHECK(nn::count_parameters(*small) == 1528106);
  // width_mult scales every layer, the classifier's hidden one too (torchvision
  // 0.29's mobilenet_v3_small / _large(width_mult=0.5): 917,264 and 1,734,576,
  // hidden widths 512 and 640).
  const auto half = nn::MobileNetV3Options().width_mult(0.5);
  CHECK(nn::count_parameters(*nn::mobilenet_v3_small(half)) == 917264);
  CHECK(nn::count_parameters(*nn::mobilenet_v3_large(half)) == 1734576);
  // Batch norms: eps 0.001, momentum 0.01.
  for (auto& [name, module] : small->named_modules()) {
    if (auto* bn = module->batch_norm_to_synchronize()) {
      INFO(name);
      CHECK(bn->options().eps() == 1e-3);
      CHECK(bn->options().momentum() == 0.01);
    }
  }
}

TEST_CASE("SqueezeExcitation scales each channel by hardsigmoid(fc2(relu(fc1(mean))))") {
  nn::SqueezeExcitation se(2, 1, std::make_shared<nn::ReLU>(), std::make_shared<nn::Hardsigmoid>());
  // fc1: squeeze = 1 * mean0 + 2 * mean1 - 1; fc2: channel c gets w_c * relu(squeeze) + b_c.
  se.fc1->weight.copy_(Tensor::from_vector<float>({1, 2}, {1, 2, 1, 1}));
  se.fc1->bias.fill_(-1);
  se.fc2->weight.copy_(Tensor::from_vector<float>({0.5f, -1}, {2, 1, 1, 1}));
  se.fc2->bias.copy_(Tensor::from_vector<float>({0, 1}, {2}));
  // Channel means 1 and 2: squeeze = 1 + 4 - 1 = 4; fc2 = (2, -3); hardsigmoid = ((2 + 3) / 6, 0).
  const Tensor x = Tensor::from_vector<float>({0, 2, 1, 3}, {1, 2, 1, 2});
  const std::vector<float> y = se.forward(x).to_vector<float>();
  CHECK(y[0] == 0.0f);
  CHECK(y[1] == doctest::Approx(2.0 * 5 / 6));
  CHECK(y[2] == 0.0f);
  CHECK(y[3] == 0.0f);
}

TEST_CASE("mobilenet_v3_small takes a training step on CIFAR-size images") {
  manual_seed(2);
  const auto model = nn::mobilenet_v3_small(nn::MobileNetV3Options().num_classes(10));
  loom::testing::check_cifar_training_step(*model, 4);
}

TEST_CASE("a MobileNetV3 block with squeeze-and-excitation: backward matches finite differences") {
  // 8 -> 16 (expand, Hardswish) -> depthwise 3x3 -> SE (squeeze 8) -> 8, with the residual.
  nn::InvertedResidualV3 block({8, 3, 16, 8, true, true, 1}, 1.0);
  block.to(DType::f64);
  loom::testing::check_block_gradients(block, loom::testing::random_tensor({2, 8, 4, 4}, 12).set_requires_grad(true));
}

TEST_SUITE_END();
