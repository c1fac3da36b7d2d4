// regnet_y_400mf: torchvision's state_dict keys and shapes (written out below
// from torchvision/models/regnet.py's module tree with the stage widths
// torchvision computes), parameter count, the stage computation against
// torchvision's for all fifteen RegNet configurations, initialisation, a
// training step on CIFAR-size images, and a block's backward against finite
// differences.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include <loom/nn/regnet.h>
#include <loom/ops/elementwise.h>
#include "tests/models/torchvision_keys.h"
#include "tests/support/gradcheck.h"

using namespace loom;

namespace {
using loom::testing::add_conv_norm;

// torchvision.models.regnet_y_400mf(num_classes=10).state_dict(): stem
// (Conv2dNormActivation), then per stage i (1, 3, 6, 6 blocks of 48, 104, 208,
// 440 channels, group width 8) blocks trunk_output.block<i>.block<i>-<j> with
// proj (first block only: a 1x1 stride-2 Conv2dNormActivation) and f: a
// (1x1), b (3x3, groups w / 8), se (fc1: w_in / 4 squeeze channels, fc2), c
// (1x1); fc the linear layer. 384 keys.
loom::testing::TorchvisionKeys torchvision_keys() {
  loom::testing::TorchvisionKeys keys;
  add_conv_norm(keys, "stem.", 32, 3, 3);
  const int64_t depths[] = {1, 3, 6, 6}, widths[] = {48, 104, 208, 440};
  int64_t width_in = 32;
  for (int stage = 1; stage <= 4; ++stage) {
    const int64_t w = widths[stage - 1];
    for (int64_t j = 0; j < depths[stage - 1]; ++j) {
      const std::string block =
          "trunk_output.block" + std::to_string(stage) + ".block" + std::to_string(stage) + "-" + std::to_string(j) + ".";
      if (j == 0) add_conv_norm(keys, block + "proj.", w, width_in, 1);
      add_conv_norm(keys, block + "f.a.", w, width_in, 1);
      add_conv_norm(keys, block + "f.b.", w, 8, 3);
      loom::testing::add_squeeze_excitation(keys, block + "f.se.", w, width_in / 4);
      add_conv_norm(keys, block + "f.c.", w, w, 1);
      width_in = w;
    }
  }
  loom::testing::add_linear(keys, "fc.", 10, 440);
  return keys;
}

// torchvision 0.29's BlockParams.from_init_params for every RegNet it builds:
// (depth, w_0, w_a, w_m, group width) -> stage depths, widths, group widths.
struct RegNetCase {
  const char* name;
  int64_t depth, w_0;
  double w_a, w_m;
  int64_t group_width;
  std::vector<int64_t> depths, widths, group_widths;
};
const RegNetCase kRegNetCases[] = {
    {"regnet_y_400mf", 16, 48, 27.89, 2.09, 8, {1, 3, 6, 6}, {48, 104, 208, 440}, {8, 8, 8, 8}},
    {"regnet_y_800mf", 14, 56, 38.84, 2.4, 16, {1, 3, 8, 2}, {64, 144, 320, 784}, {16, 16, 16, 16}},
    {"regnet_y_1_6gf", 27, 48, 20.71, 2.65, 24, {2, 6, 17, 2}, {48, 120, 336, 888}, {24, 24, 24, 24}},
    {"regnet_y_3_2gf", 21, 80, 42.63, 2.66, 24, {2, 5, 13, 1}, {72, 216, 576, 1512}, {24, 24, 24, 24}},
    {"regnet_y_8gf", 17, 192, 76.82, 2.19, 56, {2, 4, 10, 1}, {224, 448, 896, 2016}, {56, 56, 56, 56}},
    {"regnet_y_16gf", 18, 200, 106.23, 2.48, 112, {2, 4, 11, 1}, {224, 448, 1232, 3024}, {112, 112, 112, 112}},
    {"regnet_y_32gf", 20, 232, 115.89, 2.53, 232, {2, 5, 12, 1}, {232, 696, 1392, 3712}, {232, 232, 232, 232}},
    {"regnet_y_128gf", 27, 456, 160.83, 2.52, 264, {2, 7, 17, 1}, {528, 1056, 2904, 7392}, {264, 264, 264, 264}},
    {"regnet_x_400mf", 22, 24, 24.48, 2.54, 16, {1, 2, 7, 12}, {32, 64, 160, 400}, {16, 16, 16, 16}},
    {"regnet_x_800mf", 16, 56, 35.73, 2.28, 16, {1, 3, 7, 5}, {64, 128, 288, 672}, {16, 16, 16, 16}},
    // 80 * 2.25 / 8 = 22.5 rounds to 22 (halves to even, as torch.round): 176, made divisible by 24: 168.
    {"regnet_x_1_6gf", 18, 80, 34.01, 2.25, 24, {2, 4, 10, 2}, {72, 168, 408, 912}, {24, 24, 24, 24}},
    {"regnet_x_3_2gf", 25, 88, 26.31, 2.25, 48, {2, 6, 15, 2}, {96, 192, 432, 1008}, {48, 48, 48, 48}},
    // The first stage's 80 channels are fewer than the group width 120: its group width becomes 80.
    {"regnet_x_8gf", 23, 80, 49.56, 2.88, 120, {2, 5, 15, 1}, {80, 240, 720, 1920}, {80, 120, 120, 120}},
    {"regnet_x_16gf", 22, 216, 55.59, 2.1, 128, {2, 6, 13, 1}, {256, 512, 896, 2048}, {128, 128, 128, 128}},
    {"regnet_x_32gf", 23, 320, 69.86, 2.0, 168, {2, 7, 13, 1}, {336, 672, 1344, 2520}, {168, 168, 168, 168}},
};
}  // namespace

TEST_SUITE_BEGIN("regnet");

TEST_CASE("regnet_stages computes torchvision's stages for every RegNet configuration") {
  for (const RegNetCase& c : kRegNetCases) {
    INFO(c.name);
    const auto stages = nn::regnet_stages(nn::RegNetParams(c.depth, c.w_0, c.w_a, c.w_m, c.group_width));
    REQUIRE(stages.size() == c.depths.size());
    for (size_t i = 0; i < stages.size(); ++i) {
      INFO("stage ", i + 1);
      CHECK(stages[i].depth == c.depths[i]);
      CHECK(stages[i].width == c.widths[i]);
      CHECK(stages[i].group_width == c.group_widths[i]);
      CHECK(stages[i].stride == 2);
      CHECK(stages[i].bottleneck_multiplier == 1.0);
    }
  }
  CHECK_THROWS_WITH_AS(nn::regnet_stages(nn::RegNetParams(16, 44, 27.89, 2.09, 8)),
                       doctest::Contains("invalid settings"), Error);
  CHECK_THROWS_WITH_AS(nn::regnet_stages(nn::RegNetParams(16, 48, 27.89, 1.0, 8)),
                       doctest::Contains("invalid settings"), Error);
}

TEST_CASE("regnet_y_400mf has torchvision's state_dict keys, shapes and parameter count") {
  const auto model = nn::regnet_y_400mf(nn::RegNetOptions().num_classes(10));
  const loom::testing::TorchvisionKeys keys = torchvision_keys();
  CHECK(keys.size() == 384);
  // torchvision's 4,344,144 (1000 classes) less 441 * 990.
  loom::testing::check_torchvision_state(*model, keys, 3907554);
  CHECK(nn::count_parameters(*nn::regnet_y_400mf()) == 4344144);
  // The second stage's first block: a projection, and the squeeze-excitation on the block's input width.
  auto* stage2 = model->trunk_output->named_children()[1].second;
  auto* first = dynamic_cast<nn::ResBottleneckBlock*>(stage2->named_children()[0].second);
  auto* second = dynamic_cast<nn::ResBottleneckBlock*>(stage2->named_children()[1].second);
  REQUIRE((first != nullptr && second != nullptr));
  CHECK(first->proj != nullptr);
  CHECK(second->proj == nullptr);
  CHECK(first->f->type_name() == "BottleneckTransform");
  CHECK(stage2->type_name() == "AnyStage");
}

TEST_CASE("regnet_y_400mf is initialised as torchvision's RegNet") {
  manual_seed(3);
  const auto model = nn::regnet_y_400mf(nn::RegNetOptions().num_classes(10));
  for (const auto& [name, p] : model->named_parameters()) {
    INFO(name);
    const std::vector<double> v = p.to_vector<double>();
    double sum = 0, squares = 0;
    for (double x : v) {
      sum += x;
      squares += x * x;
    }
    const double n = static_cast<double>(v.size()), mean = sum / n, rms = std::sqrt(squares / n);
    if (p.dim() == 4) {
      // normal(0, sqrt(2 / fan_out)), fan_out = out_channels * kh * kw (groups not divided out).
      const double std = std::sqrt(2.0 / static_cast<double>(p.size(0) * p.size(2) * p.size(3)));
      if (v.size() >= 1000) CHECK(rms == doctest::Approx(std).epsilon(0.1));
      CHECK(loom::testing::max_abs(p) < 6 * std);
    } else if (name.ends_with("se.fc1.bias") || name.ends_with("se.fc2.bias")) {
      // The squeeze-excitation's biases keep Conv2d's default, uniform in +-1 / sqrt(fan_in): not zeroed.
      CHECK(rms > 0);
    } else if (name == "fc.weight") {
      CHECK(rms == doctest::Approx(0.01).epsilon(0.1));
      CHECK(std::abs(mean) < 0.002);
    } else if (name.ends_with("weight")) {
      CHECK(mean == 1.0);  // batch norms
      CHECK(rms == 1.0);
    } else {
      CHECK(rms == 0.0);  // batch-norm biases and fc.bias
    }
  }
  // fc1 of the first block: 8 squeeze channels from 48, fan_in 48; fc2: fan_in 8.
  const auto state = model->state_dict();
  for (const auto& [name, t] : state) {
    if (name == "trunk_output.block1.block1-0.f.se.fc1.bias") {
      CHECK(loom::testing::max_abs(t) <= 1.0 / std::sqrt(48.0));
    } else if (name == "trunk_output.block1.block1-0.f.se.fc2.bias") {
      CHECK(loom::testing::max_abs(t) <= 1.0 / std::sqrt(8.0));
      CHECK(loom::testing::max_abs(t) > 0.5 / std::sqrt(8.0));
    }
  }
}

TEST_CASE("regnet_y_400mf takes a training step on CIFAR-size images") {
  manual_seed(7);
  const auto model = nn::regnet_y_400mf(nn::RegNetOptions().num_classes(10));
  loom::testing::check_cifar_training_step(*model, 9);
  CHECK_THROWS_WITH_AS(model->forward(Tensor::zeros({1, 1, 32, 32})), doctest::Contains("(N, 3, H, W)"), Error);
}

TEST_CASE("a RegNetY block (projection, grouped 3x3, squeeze-excitation): backward matches finite differences") {
  // 8 -> 16 channels at stride 2, group width 4 (4 groups), squeeze 2; then one 16 -> 16 block (identity shortcut).
  for (const int64_t stride : {2, 1}) {
    INFO("stride ", stride);
    const int64_t width_in = stride == 2 ? 8 : 16;
    nn::ResBottleneckBlock block(width_in, 16, stride, 4, 1.0, 0.25);
    CHECK((block.proj != nullptr) == (stride == 2));
    block.to(DType::f64);
    loom::testing::check_block_gradients(block,
                                         loom::testing::random_tensor({3, width_in, 4, 4}, 17).set_requires_grad(true));
  }
}

TEST_SUITE_END();
