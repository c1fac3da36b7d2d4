// ResNets against torchvision: parameter counts, state_dict names and order,
// initialisation, and forward / backward in f64 on fixed inputs against a
// PyTorch fixture (tests/fixtures/make_resnet_fixture.py); conversion to
// SyncBatchNorm, which must reach the blocks' typed members.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include <loom/dist/sync_batch_norm.h>
#include <loom/nn/resnet.h>
#include <loom/ops/loss.h>
#include "tests/support/formula_parameters.h"
#include "tests/support/gradcheck.h"

using namespace loom;

namespace {

const nlohmann::json& fixture() {
  static const nlohmann::json json = [] {
    std::ifstream in(std::string(LOOM_FIXTURES_DIR) + "/resnet_torch.json");
    REQUIRE_MESSAGE(in.good(), "missing fixture resnet_torch.json");
    return nlohmann::json::parse(in);
  }();
  return json;
}

Tensor formula_image(const Shape& shape) {
  std::vector<double> pixels(shape_numel(shape));
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = std::cos(0.011 * i) + 0.5 * std::sin(0.7 * i);
  return Tensor::from_vector(pixels, shape);
}

std::vector<std::string> state_dict_names(const nn::Module& model) {
  std::vector<std::string> names;
  for (auto& [name, t] : model.state_dict()) names.push_back(name);
  return names;
}

// Forward, loss, backward and running statistics against the fixture's case.
void check_against_torch(nn::Module& model, const nlohmann::json& expected) {
  REQUIRE(state_dict_names(model) == expected["state_dict_keys"].get<std::vector<std::string>>());
  model.to(DType::f64);
  loom::testing::set_formula_parameters(model);
  model.train();
  Tensor x = formula_image(expected["input_shape"].get<Shape>());
  auto target_values = expected["targets"].get<std::vector<int64_t>>();
  Tensor targets = Tensor::from_vector(target_values, {static_cast<int64_t>(target_values.size())});

  Tensor logits = model(x);
  auto expected_logits = expected["logits"].get<std::vector<double>>();
  auto actual_logits = logits.to_vector<double>();
  REQUIRE(actual_logits.size() == expected_logits.size());
  for (size_t i = 0; i < actual_logits.size(); ++i) {
    CHECK(actual_logits[i] == doctest::Approx(expected_logits[i]).epsilon(1e-9).scale(1e-3));
  }
  Tensor loss = cross_entropy(logits, targets);
  CHECK(loss.item() == doctest::Approx(expected["loss"].get<double>()).epsilon(1e-10));
  loss.backward();

  using loom::testing::check_each_named;
  check_each_named(model.named_parameters(), "parameter", [&](const std::string& name, const Tensor& p) {
    auto reference = expected["grads"][name].get<std::vector<double>>();  // sum, abs_sum, head...
    auto g = p.grad().to_vector<double>();
    const loom::testing::ValueSums sums = loom::testing::value_sums(g);
    const double scale = reference[1];
    CHECK(std::abs(sums.abs_sum - scale) <= 1e-7 * scale + 1e-12);
    CHECK(std::abs(sums.sum - reference[0]) <= 1e-7 * scale + 1e-12);
    // Head values compared relative to the tensor's mean magnitude.
    const double typical = scale / static_cast<double>(g.size());
    for (size_t i = 2; i < reference.size(); ++i) CHECK(std::abs(g[i - 2] - reference[i]) <= 1e-6 * typical + 1e-14);
  });
  check_each_named(model.named_buffers(), "buffer", [&](const std::string& name, const Tensor& b) {
    if (!expected["buffers"].contains(name)) return;
    auto head = expected["buffers"][name].get<std::vector<double>>();
    auto values = b.to_vector<double>();
    for (size_t i = 0; i < head.size(); ++i) CHECK(values[i] == doctest::Approx(head[i]).epsilon(1e-9).scale(1e-6));
  });
}

}  // namespace

TEST_SUITE("resnet") {
  TEST_CASE("parameter counts equal torchvision's") {
    // The literals are torchvision 0.14's counts at 1000 classes; the fixture
    // records what the installed torchvision reported when it was generated.
    const auto& counts = fixture()["parameter_counts"];
    CHECK(counts["resnet18"] == 11689512);
    CHECK(counts["resnet50"] == 25557032);
    CHECK(nn::count_parameters(*nn::resnet18()) == 11689512);
    CHECK(nn::count_parameters(*nn::resnet34()) == 21797672);
    CHECK(nn::count_parameters(*nn::resnet50()) == 25557032);
    // 10 classes: fc shrinks from 512*1000+1000 to 512*10+10.
    CHECK(nn::count_parameters(*nn::resnet18(10)) == 11689512 - 512 * 990 - 990);
    // The MNIST tutorial's ResNet-101: 10 classes, and conv1 loses 2 * 64 * 7 * 7
    // weights with one input channel. (ResNet-152, 60M parameters, is left out
    // to keep the test quick; it differs from ResNet-101 only in block counts.)
    CHECK(nn::count_parameters(*nn::resnet101(10, 1)) ==
          counts["resnet101"].get<int64_t>() - 2048 * 990 - 990 - 2 * 64 * 49);
  }

  TEST_CASE("module tree and names follow torchvision") {
    auto model = nn::resnet50(10);
    std::vector<std::string> children;
    for (auto& [name, m] : model->named_children()) children.push_back(name + ":" + m->type_name());
    const std::vector<std::string> expected = {"conv1:Conv2d",       "bn1:BatchNorm2d",    "relu:ReLU",
                                               "maxpool:MaxPool2d",  "layer1:Sequential",  "layer2:Sequential",
                                               "layer3:Sequential",  "layer4:Sequential",  "avgpool:AdaptiveAvgPool2d",
                                               "fc:Linear"};
    CHECK(children == expected);
    std::vector<std::string> block;
    for (auto& [name, m] : model->layer2->named_children()[0].second->named_children()) block.push_back(name);
    CHECK(block == std::vector<std::string>{"conv1", "bn1", "conv2", "bn2", "conv3", "bn3", "relu", "downsample"});
    // v1.5: the stride sits on the 3x3 conv.
    auto* first = dynamic_cast<nn::Bottleneck*>(model->layer2->named_children()[0].second);
    REQUIRE(first != nullptr);
    CHECK(first->conv1->options().stride()[0] == 1);
    CHECK(first->conv2->options().stride()[0] == 2);
    CHECK(first->downsample->named_children()[0].second->type_name() == "Conv2d");
    CHECK(model->layer1->size() == 3);
    CHECK(model->layer3->size() == 6);
    auto small = nn::resnet18(10);
    CHECK(dynamic_cast<nn::BasicBlock*>(small->layer1->named_children()[0].second)->downsample == nullptr);
    CHECK(state_dict_names(*nn::resnet18(10, 3, nn::ResNetStem::cifar)) == state_dict_names(*small));
    CHECK(nn::resnet18(10, 3, nn::ResNetStem::cifar)->maxpool == nullptr);
  }

  TEST_CASE("ResNet-18 with the CIFAR stem matches PyTorch forward and backward") {
    check_against_torch(*nn::resnet18(10, 3, nn::ResNetStem::cifar), fixture()["resnet18_cifar"]);
  }

  TEST_CASE("ResNet-50 with the ImageNet stem matches PyTorch forward and backward") {
    check_against_torch(*nn::resnet50(10), fixture()["resnet50_imagenet"]);
  }

  TEST_CASE("initialisation follows torchvision") {
    manual_seed(3);
    auto model = nn::resnet18(nn::ResNetOptions().num_classes(10));
    // kaiming_normal_(fan_out, relu): std = sqrt(2 / (out * kh * kw)).
    auto w = model->layer3->named_parameters()[0].second.to_vector<double>();  // layer3.0.conv1 (256, 128, 3, 3)
    double sum = 0, squares = 0;
    for (double v : w) {
      sum += v;
      squares += v * v;
    }
    const double n = static_cast<double>(w.size());
    const double std_expected = std::sqrt(2.0 / (256 * 9));
    CHECK(std::abs(sum / n) < 0.02 * std_expected);
    CHECK(std::sqrt(squares / n) == doctest::Approx(std_expected).epsilon(0.01));
    CHECK(model->bn1->weight.to_vector<float>() == std::vector<float>(64, 1.0f));
    CHECK(model->bn1->bias.to_vector<float>() == std::vector<float>(64, 0.0f));
    // fc keeps Linear's default: uniform within 1 / sqrt(fan_in).
    const double bound = 1.0 / std::sqrt(512.0);
    CHECK(loom::testing::max_abs(model->fc->weight) <= bound);
    CHECK(loom::testing::max_abs(model->fc->weight) > 0.9 * bound);

    auto zero = nn::resnet50(nn::ResNetOptions().num_classes(10).zero_init_residual(true));
    for (auto& named : zero->named_parameters()) {
      auto& name = named.first;
      auto& t = named.second;
      const bool last_bn = name.find(".bn3.weight") != std::string::npos;
      if (last_bn) CHECK_MESSAGE(loom::testing::max_abs(t) == 0, name);
      if (name == "layer1.0.bn2.weight") CHECK(loom::testing::max_abs(t) == 1);
    }
    auto zero18 = nn::resnet18(nn::ResNetOptions().zero_init_residual(true));
    CHECK(loom::testing::max_abs(dynamic_cast<nn::BasicBlock*>(zero18->layer4->named_children()[1].second)->bn2->weight) == 0);
  }

  TEST_CASE("input sizes, channels and stems") {
    manual_seed(4);
    NoGradGuard no_grad;
    // The MNIST ResNet tutorial: 1-channel 28x28 images with the ImageNet stem.
    auto mnist = nn::resnet18(10, 1);
    CHECK(mnist->conv1->weight.sizes() == Shape{64, 1, 7, 7});
    CHECK(mnist->forward(loom::testing::random_tensor({2, 1, 28, 28}, 1, -1, 1, DType::f32)).sizes() == Shape{2, 10});
    auto cifar = nn::resnet18(nn::ResNetOptions().num_classes(10).stem(nn::ResNetStem::cifar).width(8));
    CHECK(cifar->conv1->weight.sizes() == Shape{8, 3, 3, 3});
    CHECK(cifar->fc->weight.sizes() == Shape{10, 64});
    CHECK(cifar->forward(loom::testing::random_tensor({2, 3, 32, 32}, 2, -1, 1, DType::f32)).sizes() == Shape{2, 10});
    CHECK_THROWS_WITH_AS(mnist->forward(Tensor::zeros({2, 3, 28, 28})),
                         doctest::Contains("ResNet expects (N, 1, H, W) images"), Error);
    CHECK_THROWS_WITH_AS(nn::make_resnet("resnet20"), doctest::Contains("unknown model 'resnet20'"), Error);
    CHECK_THROWS_WITH_AS(nn::parse_resnet_stem("tiny"), doctest::Contains("expected imagenet or cifar"), Error);
    CHECK(nn::make_resnet("resnet34", nn::ResNetOptions().num_classes(7))->fc->weight.sizes() == Shape{7, 512});
  }

  TEST_CASE("convert_sync_batchnorm converts a ResNet: members, names, tensors and outputs") {
    manual_seed(5);
    const auto options = nn::ResNetOptions().num_classes(10).stem(nn::ResNetStem::cifar).width(4);
    auto model = nn::resnet50(options);
    auto plain = nn::resnet50(options);
    plain->load_state_dict(model->state_dict());
    const auto before = model->state_dict();
    auto* block = dynamic_cast<nn::Bottleneck*>(model->layer2->named_children()[0].second);
    REQUIRE(block != nullptr);
    CHECK(dist::convert_sync_batchnorm(model).get() == model.get());

    // Every batch norm, in the tree and in the members forward() calls.
    int sync_layers = 0;
    for (auto& named : model->named_modules()) {
      auto& name = named.first;
      auto& module = named.second;
      CHECK_MESSAGE(module->type_name() != "BatchNorm2d", name);
      sync_layers += module->type_name() == "SyncBatchNorm";
    }
    CHECK(sync_layers == 53);  // 1 + 16 blocks x 3 + 4 downsamples
    CHECK(model->bn1->type_name() == "SyncBatchNorm");
    CHECK(block->bn1->type_name() == "SyncBatchNorm");
    CHECK(block->bn3->type_name() == "SyncBatchNorm");
    CHECK(block->bn2.get() == block->named_children()[3].second);  // the member is the tree's child
    CHECK(block->downsample->named_children()[1].second->type_name() == "SyncBatchNorm");

    // The same names and tensors (an optimizer or checkpoint keeps working) ...
    const auto after = model->state_dict();
    REQUIRE(after.size() == before.size());
    for (size_t i = 0; i < after.size(); ++i) {
      CHECK(after[i].first == before[i].first);
      CHECK(after[i].second.impl() == before[i].second.impl());
    }
    // ... and, without a process group, BatchNorm2d's outputs and statistics.
    Tensor x = loom::testing::random_tensor({3, 3, 8, 8}, 6, -1, 1, DType::f32);
    CHECK(loom::testing::max_abs_diff(model->forward(x), plain->forward(x)) == 0);
    auto* plain_block = dynamic_cast<nn::Bottleneck*>(plain->layer2->named_children()[0].second);
    CHECK(loom::testing::max_abs_diff(block->bn2->running_var, plain_block->bn2->running_var) == 0);
    model->eval();
    plain->eval();
    CHECK(loom::testing::max_abs_diff(model->forward(x), plain->forward(x)) == 0);
  }

  TEST_CASE("replace_module keeps a typed member and refuses a module of another type") {
    auto block = std::make_shared<nn::BasicBlock>(4, 4, 1, nullptr);
    auto replacement = std::make_shared<dist::SyncBatchNorm>(4);
    auto previous = block->replace_module("bn2", replacement);
    CHECK(previous->type_name() == "BatchNorm2d");
    CHECK(block->bn2 == replacement);
    CHECK_THROWS_WITH_AS(block->replace_module("bn1", std::make_shared<nn::ReLU>()),
                         doctest::Contains("child 'bn1' is a BatchNorm2d that BasicBlock::forward() calls through a "
                                           "typed member; a ReLU cannot take its place"),
                         Error);
    CHECK(block->bn1->type_name() == "BatchNorm2d");
    CHECK(block->named_children()[1].second->type_name() == "BatchNorm2d");
  }
}
