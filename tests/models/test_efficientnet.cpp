// efficientnet_b0: torchvision's state_dict keys and shapes (written out
// below from torchvision/models/efficientnet.py's MBConvConfig settings for
// B0, MBConv and EfficientNet), parameter count, the stochastic-depth
// probabilities, and a training step on CIFAR-size images.
#include <doctest/doctest.h>

#include <loom/nn/efficientnet.h>
#include <loom/ops/elementwise.h>
#include "tests/models/torchvision_keys.h"
#include "tests/support/gradcheck.h"

using namespace loom;

namespace {
// torchvision.models.efficientnet_b0(num_classes=10).state_dict(): features.0
// and features.8 are Conv2dNormActivation; features.1-7 the stages, each
// block's `block` Sequential([expand], depthwise, SqueezeExcitation (fc1,
// fc2), project); classifier.1 the linear layer.
const loom::testing::TorchvisionKeys kTorchvisionKeys = {
      {"features.0.0.weight", {32, 3, 3, 3}}, {"features.0.1.weight", {32}}, {"features.0.1.bias", {32}},
      {"features.0.1.running_mean", {32}}, {"features.0.1.running_var", {32}},
      {"features.0.1.num_batches_tracked", {}}, {"features.1.0.block.0.0.weight", {32, 1, 3, 3}},
      {"features.1.0.block.0.1.weight", {32}}, {"features.1.0.block.0.1.bias", {32}},
      {"features.1.0.block.0.1.running_mean", {32}}, {"features.1.0.block.0.1.running_var", {32}},
      {"features.1.0.block.0.1.num_batches_tracked", {}}, {"features.1.0.block.1.fc1.weight", {8, 32, 1, 1}},
      {"features.1.0.block.1.fc1.bias", {8}}, {"features.1.0.block.1.fc2.weight", {32, 8, 1, 1}},
      {"features.1.0.block.1.fc2.bias", {32}}, {"features.1.0.block.2.0.weight", {16, 32, 1, 1}},
      {"features.1.0.block.2.1.weight", {16}}, {"features.1.0.block.2.1.bias", {16}},
      {"features.1.0.block.2.1.running_mean", {16}}, {"features.1.0.block.2.1.running_var", {16}},
      {"features.1.0.block.2.1.num_batches_tracked", {}}, {"features.2.0.block.0.0.weight", {96, 16, 1, 1}},
      {"features.2.0.block.0.1.weight", {96}}, {"features.2.0.block.0.1.bias", {96}},
      {"features.2.0.block.0.1.running_mean", {96}}, {"features.2.0.block.0.1.running_var", {96}},
      {"features.2.0.block.0.1.num_batches_tracked", {}}, {"features.2.0.block.1.0.weight", {96, 1, 3, 3}},
      {"features.2.0.block.1.1.weight", {96}}, {"features.2.0.block.1.1.bias", {96}},
      {"features.2.0.block.1.1.running_mean", {96}}, {"features.2.0.block.1.1.running_var", {96}},
      {"features.2.0.block.1.1.num_batches_tracked", {}}, {"features.2.0.block.2.fc1.weight", {4, 96, 1, 1}},
      {"features.2.0.block.2.fc1.bias", {4}}, {"features.2.0.block.2.fc2.weight", {96, 4, 1, 1}},
      {"features.2.0.block.2.fc2.bias", {96}}, {"features.2.0.block.3.0.weight", {24, 96, 1, 1}},
      {"features.2.0.block.3.1.weight", {24}}, {"features.2.0.block.3.1.bias", {24}},
      {"features.2.0.block.3.1.running_mean", {24}}, {"features.2.0.block.3.1.running_var", {24}},
      {"features.2.0.block.3.1.num_batches_tracked", {}}, {"features.2.1.block.0.0.weight", {144, 24, 1, 1}},
      {"features.2.1.block.0.1.weight", {144}}, {"features.2.1.block.0.1.bias", {144}},
      {"features.2.1.block.0.1.running_mean", {144}}, {"features.2.1.block.0.1.running_var", {144}},
      {"features.2.1.block.0.1.num_batches_tracked", {}}, {"features.2.1.block.1.0.weight", {144, 1, 3, 3}},
      {"features.2.1.block.1.1.weight", {144}}, {"features.2.1.block.1.1.bias", {144}},
      {"features.2.1.block.1.1.running_mean", {144}}, {"features.2.1.block.1.1.running_var", {144}},
      {"features.2.1.block.1.1.num_batches_tracked", {}}, {"features.2.1.block.2.fc1.weight", {6, 144, 1, 1}},
      {"features.2.1.block.2.fc1.bias", {6}}, {"features.2.1.block.2.fc2.weight", {144, 6, 1, 1}},
      {"features.2.1.block.2.fc2.bias", {144}}, {"features.2.1.block.3.0.weight", {24, 144, 1, 1}},
      {"features.2.1.block.3.1.weight", {24}}, {"features.2.1.block.3.1.bias", {24}},
      {"features.2.1.block.3.1.running_mean", {24}}, {"features.2.1.block.3.1.running_var", {24}},
      {"features.2.1.block.3.1.num_batches_tracked", {}}, {"features.3.0.block.0.0.weight", {144, 24, 1, 1}},
      {"features.3.0.block.0.1.weight", {144}}, {"features.3.0.block.0.1.bias", {144}},
      {"features.3.0.block.0.1.running_mean", {144}}, {"features.3.0.block.0.1.running_var", {144}},
      {"features.3.0.block.0.1.num_batches_tracked", {}}, {"features.3.0.block.1.0.weight", {144, 1, 5, 5}},
      {"features.3.0.block.1.1.weight", {144}}, {"features.3.0.block.1.1.bias", {144}},
      {"features.3.0.block.1.1.running_mean", {144}}, {"features.3.0.block.1.1.running_var", {144}},
      {"features.3.0.block.1.1.num_batches_tracked", {}}, {"features.3.0.block.2.fc1.weight", {6, 144, 1, 1}},
      {"features.3.0.block.2.fc1.bias", {6}}, {"features.3.0.block.2.fc2.weight", {144, 6, 1, 1}},
      {"features.3.0.block.2.fc2.bias", {144}}, {"features.3.0.block.3.0.weight", {40, 144, 1, 1}},
      {"features.3.0.block.3.1.weight", {40}}, {"features.3.0.block.3.1.bias", {40}},
      {"features.3.0.block.3.1.running_mean", {40}}, {"features.3.0.block.3.1.running_var", {40}},
      {"features.3.0.block.3.1.num_batches_tracked", {}}, {"features.3.1.block.0.0.weight", {240, 40, 1, 1}},
      {"features.3.1.block.0.1.weight", {240}}, {"features.3.1.block.0.1.bias", {240}},
      {"features.3.1.block.0.1.running_mean", {240}}, {"features.3.1.block.0.1.running_var", {240}},
      {"features.3.1.block.0.1.num_batches_tracked", {}}, {"features.3.1.block.1.0.weight", {240, 1, 5, 5}},
      {"features.3.1.block.1.1.weight", {240}}, {"features.3.1.block.1.1.bias", {240}},
      {"features.3.1.block.1.1.running_mean", {240}}, {"features.3.1.block.1.1.running_var", {240}},
      {"features.3.1.block.1.1.num_batches_tracked", {}}, {"features.3.1.block.2.fc1.weight", {10, 240, 1, 1}},
      {"features.3.1.block.2.fc1.bias", {10}}, {"features.3.1.block.2.fc2.weight", {240, 10, 1, 1}},
      {"features.3.1.block.2.fc2.bias", {240}}, {"features.3.1.block.3.0.weight", {40, 240, 1, 1}},
      {"features.3.1.block.3.1.weight", {40}}, {"features.3.1.block.3.1.bias", {40}},
      {"features.3.1.block.3.1.running_mean", {40}}, {"features.3.1.block.3.1.running_var", {40}},
      {"features.3.1.block.3.1.num_batches_tracked", {}}, {"features.4.0.block.0.0.weight", {240, 40, 1, 1}},
      {"features.4.0.block.0.1.weight", {240}}, {"features.4.0.block.0.1.bias", {240}},
      {"features.4.0.block.0.1.running_mean", {240}}, {"features.4.0.block.0.1.running_var", {240}},
      {"features.4.0.block.0.1.num_batches_tracked", {}}, {"features.4.0.block.1.0.weight", {240, 1, 3, 3}},
      {"features.4.0.block.1.1.weight", {240}}, {"features.4.0.block.1.1.bias", {240}},
      {"features.4.0.block.1.1.running_mean", {240}}, {"features.4.0.block.1.1.running_var", {240}},
      {"features.4.0.block.1.1.num_batches_tracked", {}}, {"features.4.0.block.2.fc1.weight", {10, 240, 1, 1}},
      {"features.4.0.block.2.fc1.bias", {10}}, {"features.4.0.block.2.fc2.weight", {240, 10, 1, 1}},
      {"features.4.0.block.2.fc2.bias", {240}}, {"features.4.0.block.3.0.weight", {80, 240, 1, 1}},
      {"features.4.0.block.3.1.weight", {80}}, {"features.4.0.block.3.1.bias", {80}},
      {"features.4.0.block.3.1.running_mean", {80}}, {"features.4.0.block.3.1.running_var", {80}},
      {"features.4.0.block.3.1.num_batches_tracked", {}}, {"features.4.1.block.0.0.weight", {480, 80, 1, 1}},
      {"features.4.1.block.0.1.weight", {480}}, {"features.4.1.block.0.1.bias", {480}},
      {"features.4.1.block.0.1.running_mean", {480}}, {"features.4.1.block.0.1.running_var", {480}},
      {"features.4.1.block.0.1.num_batches_tracked", {}}, {"features.4.1.block.1.0.weight", {480, 1, 3, 3}},
      {"features.4.1.block.1.1.weight", {480}}, {"features.4.1.block.1.1.bias", {480}},
      {"features.4.1.block.1.1.running_mean", {480}}, {"features.4.1.block.1.1.running_var", {480}},
      {"features.4.1.block.1.1.num_batches_tracked", {}}, {"features.4.1.block.2.fc1.weight", {20, 480, 1, 1}},
      {"features.4.1.block.2.fc1.bias", {20}}, {"features.4.1.block.2.fc2.weight", {480, 20, 1, 1}},
      {"features.4.1.block.2.fc2.bias", {480}}, {"features.4.1.block.3.0.weight", {80, 480, 1, 1}},
      {"features.4.1.block.3.1.weight", {80}}, {"features.4.1.block.3.1.bias", {80}},
      {"features.4.1.block.3.1.running_mean", {80}}, {"features.4.1.block.3.1.running_var", {80}},
      {"features.4.1.block.3.1.num_batches_tracked", {}}, {"features.4.2.block.0.0.weight", {480, 80, 1, 1}},
      {"features.4.2.block.0.1.weight", {480}}, {"features.4.2.block.0.1.bias", {480}},
      {"features.4.2.block.0.1.running_mean", {480}}, {"features.4.2.block.0.1.running_var", {480}},
      {"features.4.2.block.0.1.num_batches_tracked", {}}, {"features.4.2.block.1.0.weight", {480, 1, 3, 3}},
      {"features.4.2.block.1.1.weight", {480}}, {"features.4.2.block.1.1.bias", {480}},
      {"features.4.2.block.1.1.running_mean", {480}}, {"features.4.2.block.1.1.running_var", {480}},
      {"features.4.2.block.1.1.num_batches_tracked", {}}, {"features.4.2.block.2.fc1.weight", {20, 480, 1, 1}},
      {"features.4.2.block.2.fc1.bias", {20}}, {"features.4.2.block.2.fc2.weight", {480, 20, 1, 1}},
      {"features.4.2.block.2.fc2.bias", {480}}, {"features.4.2.block.3.0.weight", {80, 480, 1, 1}},
      {"features.4.2.block.3.1.weight", {80}}, {"features.4.2.block.3.1.bias", {80}},
      {"features.4.2.block.3.1.running_mean", {80}}, {"features.4.2.block.3.1.running_var", {80}},
      {"features.4.2.block.3.1.num_batches_tracked", {}}, {"features.5.0.block.0.0.weight", {480, 80, 1, 1}},
      {"features.5.0.block.0.1.weight", {480}}, {"features.5.0.block.0.1.bias", {480}},
      {"features.5.0.block.0.1.running_mean", {480}}, {"features.5.0.block.0.1.running_var", {480}},
      {"features.5.0.block.0.1.num_batches_tracked", {}}, {"features.5.0.block.1.0.weight", {480, 1, 5, 5}},
      {"features.5.0.block.1.1.weight", {480}}, {"features.5.0.block.1.1.bias", {480}},
      {"features.5.0.block.1.1.running_mean", {480}}, {"features.5.0.block.1.1.running_var", {480}},
      {"features.5.0.block.1.1.num_batches_tracked", {}}, {"features.5.0.block.2.fc1.weight", {20, 480, 1, 1}},
      {"features.5.0.block.2.fc1.bias", {20}}, {"features.5.0.block.2.fc2.weight", {480, 20, 1, 1}},
      {"features.5.0.block.2.fc2.bias", {480}}, {"features.5.0.block.3.0.weight", {112, 480, 1, 1}},
      {"features.5.0.block.3.1.weight", {112}}, {"features.5.0.block.3.1.bias", {112}},
      {"features.5.0.block.3.1.running_mean", {112}}, {"features.5.0.block.3.1.running_var", {112}},
      {"features.5.0.block.3.1.num_batches_tracked", {}}, {"features.5.1.block.0.0.weight", {672, 112, 1, 1}},
      {"features.5.1.block.0.1.weight", {672}}, {"features.5.1.block.0.1.bias", {672}},
      {"features.5.1.block.0.1.running_mean", {672}}, {"features.5.1.block.0.1.running_var", {672}},
      {"features.5.1.block.0.1.num_batches_tracked", {}}, {"features.5.1.block.1.0.weight", {672, 1, 5, 5}},
      {"features.5.1.block.1.1.weight", {672}}, {"features.5.1.block.1.1.bias", {672}},
      {"features.5.1.block.1.1.running_mean", {672}}, {"features.5.1.block.1.1.running_var", {672}},
      {"features.5.1.block.1.1.num_batches_tracked", {}}, {"features.5.1.block.2.fc1.weight", {28, 672, 1, 1}},
      {"features.5.1.block.2.fc1.bias", {28}}, {"features.5.1.block.2.fc2.weight", {672, 28, 1, 1}},
      {"features.5.1.block.2.fc2.bias", {672}}, {"features.5.1.block.3.0.weight", {112, 672, 1, 1}},
      {"features.5.1.block.3.1.weight", {112}}, {"features.5.1.block.3.1.bias", {112}},
      {"features.5.1.block.3.1.running_mean", {112}}, {"features.5.1.block.3.1.running_var", {112}},
      {"features.5.1.block.3.1.num_batches_tracked", {}}, {"features.5.2.block.0.0.weight", {672, 112, 1, 1}},
      {"features.5.2.block.0.1.weight", {672}}, {"features.5.2.block.0.1.bias", {672}},
      {"features.5.2.block.0.1.running_mean", {672}}, {"features.5.2.block.0.1.running_var", {672}},
      {"features.5.2.block.0.1.num_batches_tracked", {}}, {"features.5.2.block.1.0.weight", {672, 1, 5, 5}},
      {"features.5.2.block.1.1.weight", {672}}, {"features.5.2.block.1.1.bias", {672}},
      {"features.5.2.block.1.1.running_mean", {672}}, {"features.5.2.block.1.1.running_var", {672}},
      {"features.5.2.block.1.1.num_batches_tracked", {}}, {"features.5.2.block.2.fc1.weight", {28, 672, 1, 1}},
      {"features.5.2.block.2.fc1.bias", {28}}, {"features.5.2.block.2.fc2.weight", {672, 28, 1, 1}},
      {"features.5.2.block.2.fc2.bias", {672}}, {"features.5.2.block.3.0.weight", {112, 672, 1, 1}},
      {"features.5.2.block.3.1.weight", {112}}, {"features.5.2.block.3.1.bias", {112}},
      {"features.5.2.block.3.1.running_mean", {112}}, {"features.5.2.block.3.1.running_var", {112}},
      {"features.5.2.block.3.1.num_batches_tracked", {}}, {"features.6.0.block.0.0.weight", {672, 112, 1, 1}},
      {"features.6.0.block.0.1.weight", {672}}, {"features.6.0.block.0.1.bias", {672}},
      {"features.6.0.block.0.1.running_mean", {672}}, {"features.6.0.block.0.1.running_var", {672}},
      {"features.6.0.block.0.1.num_batches_tracked", {}}, {"features.6.0.block.1.0.weight", {672, 1, 5, 5}},
      {"features.6.0.block.1.1.weight", {672}}, {"features.6.0.block.1.1.bias", {672}},
      {"features.6.0.block.1.1.running_mean", {672}}, {"features.6.0.block.1.1.running_var", {672}},
      {"features.6.0.block.1.1.num_batches_tracked", {}}, {"features.6.0.block.2.fc1.weight", {28, 672, 1, 1}},
      {"features.6.0.block.2.fc1.bias", {28}}, {"features.6.0.block.2.fc2.weight", {672, 28, 1, 1}},
      {"features.6.0.block.2.fc2.bias", {672}}, {"features.6.0.block.3.0.weight", {192, 672, 1, 1}},
      {"features.6.0.block.3.1.weight", {192}}, {"features.6.0.block.3.1.bias", {192}},
      {"features.6.0.block.3.1.running_mean", {192}}, {"features.6.0.block.3.1.running_var", {192}},
      {"features.6.0.block.3.1.num_batches_tracked", {}}, {"features.6.1.block.0.0.weight", {1152, 192, 1, 1}},
      {"features.6.1.block.0.1.weight", {1152}}, {"features.6.1.block.0.1.bias", {1152}},
      {"features.6.1.block.0.1.running_mean", {1152}}, {"features.6.1.block.0.1.running_var", {1152}},
      {"features.6.1.block.0.1.num_batches_tracked", {}}, {"features.6.1.block.1.0.weight", {1152, 1, 5, 5}},
      {"features.6.1.block.1.1.weight", {1152}}, {"features.6.1.block.1.1.bias", {1152}},
      {"features.6.1.block.1.1.running_mean", {1152}}, {"features.6.1.block.1.1.running_var", {1152}},
      {"features.6.1.block.1.1.num_batches_tracked", {}}, {"features.6.1.block.2.fc1.weight", {48, 1152, 1, 1}},
      {"features.6.1.block.2.fc1.bias", {48}}, {"features.6.1.block.2.fc2.weight", {1152, 48, 1, 1}},
      {"features.6.1.block.2.fc2.bias", {1152}}, {"features.6.1.block.3.0.weight", {192, 1152, 1, 1}},
      {"features.6.1.block.3.1.weight", {192}}, {"features.6.1.block.3.1.bias", {192}},
      {"features.6.1.block.3.1.running_mean", {192}}, {"features.6.1.block.3.1.running_var", {192}},
      {"features.6.1.block.3.1.num_batches_tracked", {}}, {"features.6.2.block.0.0.weight", {1152, 192, 1, 1}},
      {"features.6.2.block.0.1.weight", {1152}}, {"features.6.2.block.0.1.bias", {1152}},
      {"features.6.2.block.0.1.running_mean", {1152}}, {"features.6.2.block.0.1.running_var", {1152}},
      {"features.6.2.block.0.1.num_batches_tracked", {}}, {"features.6.2.block.1.0.weight", {1152, 1, 5, 5}},
      {"features.6.2.block.1.1.weight", {1152}}, {"features.6.2.block.1.1.bias", {1152}},
      {"features.6.2.block.1.1.running_mean", {1152}}, {"features.6.2.block.1.1.running_var", {1152}},
      {"features.6.2.block.1.1.num_batches_tracked", {}}, {"features.6.2.block.2.fc1.weight", {48, 1152, 1, 1}},
      {"features.6.2.block.2.fc1.bias", {48}}, {"features.6.2.block.2.fc2.weight", {1152, 48, 1, 1}},
      {"features.6.2.block.2.fc2.bias", {1152}}, {"features.6.2.block.3.0.weight", {192, 1152, 1, 1}},
      {"features.6.2.block.3.1.weight", {192}}, {"features.6.2.block.3.1.bias", {192}},
      {"features.6.2.block.3.1.running_mean", {192}}, {"features.6.2.block.3.1.running_var", {192}},
      {"features.6.2.block.3.1.num_batches_tracked", {}}, {"features.6.3.block.0.0.weight", {1152, 192, 1, 1}},
      {"features.6.3.block.0.1.weight", {1152}}, {"features.6.3.block.0.1.bias", {1152}},
      {"features.6.3.block.0.1.running_mean", {1152}}, {"features.6.3.block.0.1.running_var", {1152}},
      {"features.6.3.block.0.1.num_batches_tracked", {}}, {"features.6.3.block.1.0.weight", {1152, 1, 5, 5}},
      {"features.6.3.block.1.1.weight", {1152}}, {"features.6.3.block.1.1.bias", {1152}},
      {"features.6.3.block.1.1.running_mean", {1152}}, {"features.6.3.block.1.1.running_var", {1152}},
      {"features.6.3.block.1.1.num_batches_tracked", {}}, {"features.6.3.block.2.fc1.weight", {48, 1152, 1, 1}},
      {"features.6.3.block.2.fc1.bias", {48}}, {"features.6.3.block.2.fc2.weight", {1152, 48, 1, 1}},
      {"features.6.3.block.2.fc2.bias", {1152}}, {"features.6.3.block.3.0.weight", {192, 1152, 1, 1}},
      {"features.6.3.block.3.1.weight", {192}}, {"features.6.3.block.3.1.bias", {192}},
      {"features.6.3.block.3.1.running_mean", {192}}, {"features.6.3.block.3.1.running_var", {192}},
      {"features.6.3.block.3.1.num_batches_tracked", {}}, {"features.7.0.block.0.0.weight", {1152, 192, 1, 1}},
      {"features.7.0.block.0.1.weight", {1152}}, {"features.7.0.block.0.1.bias", {1152}},
      {"features.7.0.block.0.1.running_mean", {1152}}, {"features.7.0.block.0.1.running_var", {1152}},
      {"features.7.0.block.0.1.num_batches_tracked", {}}, {"features.7.0.block.1.0.weight", {1152, 1, 3, 3}},
      {"features.7.0.block.1.1.weight", {1152}}, {"features.7.0.block.1.1.bias", {1152}},
      {"features.7.0.block.1.1.running_mean", {1152}}, {"features.7.0.block.1.1.running_var", {1152}},
      {"features.7.0.block.1.1.num_batches_tracked", {}}, {"features.7.0.block.2.fc1.weight", {48, 1152, 1, 1}},
      {"features.7.0.block.2.fc1.bias", {48}}, {"features.7.0.block.2.fc2.weight", {1152, 48, 1, 1}},
      {"features.7.0.block.2.fc2.bias", {1152}}, {"features.7.0.block.3.0.weight", {320, 1152, 1, 1}},
      {"features.7.0.block.3.1.weight", {320}}, {"features.7.0.block.3.1.bias", {320}},
      {"features.7.0.block.3.1.running_mean", {320}}, {"features.7.0.block.3.1.running_var", {320}},
      {"features.7.0.block.3.1.num_batches_tracked", {}}, {"features.8.0.weight", {1280, 320, 1, 1}},
      {"features.8.1.weight", {1280}}, {"features.8.1.bias", {1280}}, {"features.8.1.running_mean", {1280}},
      {"features.8.1.running_var", {1280}}, {"features.8.1.num_batches_tracked", {}},
      {"classifier.1.weight", {10, 1280}}, {"classifier.1.bias", {10}},
};
}  // namespace
TEST_SUITE_BEGIN("efficientnet");

TEST_CASE("efficientnet_b0 has torchvision's state_dict keys, shapes and parameter count") {
  const auto model = nn::efficientnet_b0(nn::EfficientNetOptions().num_classes(10));
  loom::testing::check_torchvision_keys(*model, kTorchvisionKeys);
  // torchvision's 5,288,548 (1000 classes) less 1281 * 990.
  CHECK(nn::count_parameters(*model) == 4020358);
  CHECK(nn::count_parameters(*nn::efficientnet_b0()) == 5288548);
  // Stochastic depth 0.2 * k / 16 for block k: stage 6's last block (k = 14) 0.175.
  auto* stage6 = model->features->named_children()[6].second;
  auto* last = dynamic_cast<nn::MBConv*>(stage6->named_children()[3].second);
  REQUIRE(last != nullptr);
  CHECK(last->stochastic_depth->options().p() == doctest::Approx(0.2 * 14 / 16));
  // The classifier: uniform in +-1 / sqrt(10), zero bias.
  const Tensor fc = model->state_dict()[kTorchvisionKeys.size() - 2].second;
  CHECK(loom::testing::max_abs(fc) <= 1.0 / std::sqrt(10.0));
  CHECK(loom::testing::max_abs(fc) > 0.2);
}

TEST_CASE("efficientnet_b0 takes a training step on CIFAR-size images") {
  manual_seed(6);
  const auto model = nn::efficientnet_b0(nn::EfficientNetOptions().num_classes(10));
  loom::testing::check_cifar_training_step(*model, 8);
}

TEST_CASE("an MBConv block with stochastic depth: backward matches finite differences under a fixed seed") {
  // 16 -> 96 (expand, SiLU) -> depthwise 3x3 -> SE (squeeze 4, SiLU, Sigmoid) -> 16, with the residual.
  nn::MBConv block({6, 3, 1, 16, 16, 1}, 16, 1, 0.5);
  block.to(DType::f64);
  loom::testing::check_block_gradients(block, loom::testing::random_tensor({3, 16, 3, 3}, 13).set_requires_grad(true));
}

TEST_SUITE_END();
