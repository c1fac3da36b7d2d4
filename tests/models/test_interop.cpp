// Interoperability with PyTorch: loom's checkpoints of ResNet-50, VGG,
// MobileNet V2 / V3, EfficientNet-B0, RegNetY-400MF and ConvNeXt-Tiny load
// into torchvision's model of the same name (num_classes=10) with load_state_dict(strict=True) and give loom's
// logits in eval mode; a torchvision state_dict saved as safetensors loads into
// loom and gives torch's logits. Runs tests/models/torch_interop.py with the
// first Python that has torch + torchvision (torch_python()); skipped without.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>

#include <loom/core/autograd.h>
#include <loom/nn/checkpoint.h>
#include <loom/nn/convnext.h>
#include <loom/nn/efficientnet.h>
#include <loom/nn/mobilenet.h>
#include <loom/nn/regnet.h>
#include <loom/nn/resnet.h>
#include <loom/nn/vgg.h>
#include "tests/models/helpers.h"
#include "tests/support/gradcheck.h"

using namespace loom;
using loom::testing::TempDir;

namespace {
Tensor tensor_named(const nn::SafetensorsFile& file, const std::string& name) {
  for (auto& [key, t] : file.tensors) {
    if (key == name) return t;
  }
  FAIL("no tensor '", name, "'");
  return Tensor();
}

using Factory = std::function<std::shared_ptr<nn::Module>()>;

// loom -> torch: writes DIR/loom_NAME.checkpoint (a model whose batch-norm statistics moved) and
// DIR/loom_NAME_io.safetensors (an input and loom's eval-mode logits) for torch_interop.py.
void write_loom_side(const TempDir& dir, const std::string& name, const Factory& make) {
  manual_seed(11);
  std::shared_ptr<nn::Module> model = make();
  {
    // Move the batch-norm statistics off their initial values, so eval mode uses real ones.
    NoGradGuard no_grad;
    for (uint64_t seed = 0; seed < 2; ++seed) (*model)(loom::testing::random_tensor({4, 3, 32, 32}, seed, -2, 2, DType::f32));
  }
  model->eval();
  Tensor input = loom::testing::random_tensor({2, 3, 32, 32}, 21, -2, 2, DType::f32);
  Tensor logits;
  {
    NoGradGuard no_grad;
    logits = (*model)(input);
  }
  nn::TrainingState state;
  state.epoch = 1;
  state.step = 2;
  state.optimizer = {{"0.0.momentum_buffer", Tensor::zeros(model->parameters()[0].sizes())}};
  nn::save_checkpoint(dir / ("loom_" + name + ".checkpoint"), {model->state_dict(), state});
  nn::save_safetensors(dir / ("loom_" + name + "_io.safetensors"), {{"input", input}, {"logits", logits}});
}

// torch -> loom: torchvision's state_dict in a freshly initialised loom model gives torch's logits.
void check_torch_side(const TempDir& dir, const std::string& name, const Factory& make) {
  INFO("model ", name);
  manual_seed(12);
  std::shared_ptr<nn::Module> from_torch = make();
  const std::string file = "torch_" + name + ".safetensors";
  nn::Checkpoint checkpoint = nn::load_checkpoint(dir / file);
  CHECK_FALSE(checkpoint.training.has_value());
  nn::load_model_state(*from_torch, checkpoint.model, file);
  from_torch->eval();
  nn::SafetensorsFile io = nn::load_safetensors(dir / ("torch_" + name + "_io.safetensors"));
  NoGradGuard no_grad;
  Tensor expected = tensor_named(io, "logits");
  Tensor loom_logits = (*from_torch)(tensor_named(io, "input"));
  const double difference = loom::testing::max_abs_diff(loom_logits, expected);
  const double tolerance = 1e-4 * std::max(1.0, loom::testing::max_abs_diff(expected, Tensor::zeros(expected.sizes())));
  MESSAGE(name, ": torch -> loom: max |logits difference| = ", difference);
  CHECK(difference <= tolerance);
}

// convnext_tiny with its layer scales drawn from [0.5, 1): at their initial 1e-6 every block would add next to
// nothing to the logits, and a block's tensors could load wrongly unseen (torch_interop.py draws them too).
std::shared_ptr<nn::Module> convnext_with_layer_scales() {
  auto model = nn::convnext_tiny(nn::ConvNeXtOptions().num_classes(10));
  NoGradGuard no_grad;
  uint64_t seed = 30;
  for (auto& [key, p] : model->named_parameters()) {
    if (key.ends_with("layer_scale")) Tensor(p).copy_(loom::testing::random_tensor(p.sizes(), seed++, 0.5, 1.0));
  }
  return model;
}

// Both directions for each (name, factory); one Python run for all of them.
void check_interop(const std::vector<std::pair<std::string, Factory>>& models) {
  const std::string python = loom::testing::torch_python();
  if (python.empty()) {
    MESSAGE(std::string(loom::testing::kNoTorchMessage));
    return;
  }
  TempDir dir;
  std::string names;
  for (const auto& [name, make] : models) {
    write_loom_side(dir, name, make);
    names += " " + name;
  }
  const std::filesystem::path log = dir / "python.log";
  const int status = loom::testing::run_python(python, "torch_interop.py", dir.path().string() + names, log);
  const std::string output = loom::testing::read_bytes(log);
  MESSAGE(output);
  REQUIRE_MESSAGE(status == 0, "torch_interop.py failed:\n", output);
  for (const auto& [name, make] : models) check_torch_side(dir, name, make);
}
}  // namespace

TEST_SUITE("interop") {
  TEST_CASE("ResNet-50 checkpoints move between loom and torchvision with the same logits") {
    check_interop({{"resnet50", [] { return nn::resnet50(10); }}});
  }

  TEST_CASE("MobileNet V2 / V3 and EfficientNet-B0 checkpoints move between loom and torchvision") {
    check_interop({{"mobilenet_v2", [] { return nn::mobilenet_v2(nn::MobileNetV2Options().num_classes(10)); }},
                   {"mobilenet_v3_small",
                    [] { return nn::mobilenet_v3_small(nn::MobileNetV3Options().num_classes(10)); }},
                   {"mobilenet_v3_large",
                    [] { return nn::mobilenet_v3_large(nn::MobileNetV3Options().num_classes(10)); }},
                   {"efficientnet_b0", [] { return nn::efficientnet_b0(nn::EfficientNetOptions().num_classes(10)); }}});
  }

  TEST_CASE("RegNetY-400MF and ConvNeXt-Tiny checkpoints move between loom and torchvision") {
    check_interop({{"regnet_y_400mf", [] { return nn::regnet_y_400mf(nn::RegNetOptions().num_classes(10)); }},
                   {"convnext_tiny", convnext_with_layer_scales}});
  }
}

// VGG (132M / 138M parameters, half a gigabyte per checkpoint): a suite of its own, left out of the sanitized run.
TEST_SUITE("interop_vgg") {
  TEST_CASE("VGG-11 / VGG-16 with batch norm checkpoints move between loom and torchvision") {
    check_interop({{"vgg11_bn", [] { return nn::vgg11_bn(nn::VGGOptions().num_classes(10)); }},
                   {"vgg16_bn", [] { return nn::vgg16_bn(nn::VGGOptions().num_classes(10)); }}});
  }
}
