// Interoperability with PyTorch: loom's ResNet-50 checkpoint loads into
// torchvision.models.resnet50(num_classes=10) with load_state_dict and gives
// loom's logits; a torchvision state_dict saved as safetensors loads into loom
// and gives torch's logits. Runs tests/models/torch_interop.py with Debian's
// /usr/bin/python3; skipped when python3-torch is not installed.
#include <doctest/doctest.h>

#include <cstdlib>

#include <loom/core/autograd.h>
#include <loom/nn/checkpoint.h>
#include <loom/nn/resnet.h>
#include "tests/models/helpers.h"
#include "tests/support/gradcheck.h"

using namespace loom;
using loom::testing::TempDir;

namespace {
bool torch_available() {
  return std::system("/usr/bin/python3 -c 'import torch, torchvision, numpy' >/dev/null 2>&1") == 0;
}

Tensor tensor_named(const nn::SafetensorsFile& file, const std::string& name) {
  for (auto& [key, t] : file.tensors) {
    if (key == name) return t;
  }
  FAIL("no tensor '", name, "'");
  return Tensor();
}
}  // namespace

TEST_SUITE("interop") {
  TEST_CASE("ResNet-50 checkpoints move between loom and torchvision with the same logits") {
    if (!torch_available()) {
      MESSAGE("skipped: python3-torch not installed (apt-get install python3-torch python3-torchvision python3-numpy)");
      return;
    }
    TempDir dir;
    manual_seed(11);
    auto model = nn::resnet50(10);
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
    state.optimizer = {{"0.0.momentum_buffer", Tensor::zeros(model->conv1->weight.sizes())}};
    nn::save_checkpoint(dir / "loom_resnet50.checkpoint", {model->state_dict(), state});
    nn::save_safetensors(dir / "loom_io.safetensors", {{"input", input}, {"logits", logits}});

    const std::string script = std::string(LOOM_MODELS_TEST_DIR) + "/torch_interop.py";
    const std::string log = (dir / "python.log").string();
    const int status = std::system(("/usr/bin/python3 " + script + " " + dir.path().string() + " >" + log + " 2>&1").c_str());
    const std::string output = loom::testing::read_bytes(log);
    MESSAGE(output);
    REQUIRE_MESSAGE(status == 0, "torch_interop.py failed:\n", output);

    // torch -> loom: torchvision's state_dict in a freshly initialised loom model.
    manual_seed(12);
    auto from_torch = nn::resnet50(10);
    nn::Checkpoint checkpoint = nn::load_checkpoint(dir / "torch_resnet50.safetensors");
    CHECK_FALSE(checkpoint.training.has_value());
    nn::load_model_state(*from_torch, checkpoint.model, "torch_resnet50.safetensors");
    from_torch->eval();
    nn::SafetensorsFile io = nn::load_safetensors(dir / "torch_io.safetensors");
    NoGradGuard no_grad;
    Tensor loom_logits = (*from_torch)(tensor_named(io, "input"));
    const double difference = loom::testing::max_abs_diff(loom_logits, tensor_named(io, "logits"));
    MESSAGE("torch -> loom: max |logits difference| = ", difference);
    CHECK(difference <= 1e-4);
  }
}
