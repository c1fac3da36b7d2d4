// Channels-last models (nn::Module::to(MemoryFormat), PyTorch's
// model.to(memory_format=torch.channels_last)) on the CPU: the parameters are
// re-laid in place, a ResNet-18 training step equals the NCHW one bit for
// bit, gradients and optimizer state keep the parameters' layout, checkpoints
// are the same bytes in either format, and changing the format after the
// optimizer made its state is refused. (DDP: tests/dist, suite ddp.)
#include <doctest/doctest.h>

#include <cstring>

#include <loom/core/generator.h>
#include <loom/core/memory_format.h>
#include <loom/nn/checkpoint.h>
#include <loom/nn/layers.h>
#include <loom/nn/resnet.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/loss.h>
#include <loom/optim/amp.h>
#include <loom/optim/optimizer.h>
#include "tests/models/helpers.h"

using namespace loom;
using loom::testing::TempDir;

namespace {

// ResNet-18 with the CIFAR stem (3x3 convolutions throughout but the 1x1 downsamples), 10 classes.
std::shared_ptr<nn::ResNet> cifar_resnet18(uint64_t seed) {
  manual_seed(seed);
  return nn::resnet18(nn::ResNetOptions().num_classes(10).stem(nn::ResNetStem::cifar));
}

// (4, 3, 16, 16) standard-normal images and their labels.
Tensor batch_images() {
  Generator generator(5);
  Tensor images = Tensor::empty({4, 3, 16, 16});
  generator.normal_(images, 0.0, 1.0);
  return images;
}
Tensor batch_labels() { return Tensor::from_vector<int64_t>({3, 7, 0, 9}, {4}); }

// The values of `t` in logical (N, C, H, W) order, whatever its layout.
std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

// Whether `a` and `b` hold the same floats bit for bit (NaNs included).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The 4-d parameters whose NCHW and channels-last layouts differ (not the
// 1x1 convolutions', whose two orders agree).
std::vector<std::pair<std::string, Tensor>> relaid_parameters(nn::Module& model) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, parameter] : model.named_parameters()) {
    if (parameter.dim() == 4 && parameter.size(1) > 1 && parameter.size(2) * parameter.size(3) > 1)
      out.emplace_back(name, parameter);
  }
  return out;
}

// `steps` SGD steps (momentum, weight decay: the momentum buffers are read
// from the second step on) of `model` on the batch in `format`; the losses,
// and the optimizer's state into `optimizer_state` when given.
std::vector<float> train_steps(nn::Module& model, MemoryFormat format, int steps,
                               nn::NamedTensors* optimizer_state = nullptr) {
  optim::SGD sgd(model.parameters(), optim::SGDOptions(0.05).momentum(0.9).weight_decay(5e-4));
  const Tensor images = in_memory_format(batch_images(), format), labels = batch_labels();
  std::vector<float> losses;
  for (int step = 0; step < steps; ++step) {
    sgd.zero_grad();
    Tensor loss = cross_entropy(model(images), labels);
    loss.backward();
    sgd.step();
    losses.push_back(static_cast<float>(loss.item()));
  }
  if (optimizer_state != nullptr) *optimizer_state = sgd.state();
  return losses;
}

}  // namespace

TEST_SUITE("channels_last") {
  TEST_CASE("Module::to(MemoryFormat) re-lays the 4-d parameters in place, values unchanged") {
    auto model = cifar_resnet18(1);
    const std::vector<Tensor> before = model->parameters();
    std::vector<std::vector<float>> old_values;
    for (const Tensor& p : before) old_values.push_back(values(p));
    const auto relaid = relaid_parameters(*model);
    CHECK(relaid.size() == 17);  // the stem's and the 16 block convolutions' 3x3 weights

    model->to(MemoryFormat::nhwc);
    const std::vector<Tensor> after = model->parameters();
    REQUIRE(after.size() == before.size());
    for (size_t i = 0; i < after.size(); ++i) {
      CHECK(after[i].is_same(before[i]));  // the same tensors: handles taken before see the new layout
      CHECK(same_bits(values(after[i]), old_values[i]));
      CHECK(in_a_memory_format(after[i]));
    }
    for (auto& [name, parameter] : relaid) {
      CHECK_MESSAGE(memory_format_of(parameter) == MemoryFormat::nhwc, name);
      CHECK_MESSAGE(parameter.requires_grad(), name);
    }
    // Converting the dtype keeps the format (PyTorch's preserve_format); NCHW again undoes it.
    model->to(DType::f64);
    for (auto& [name, parameter] : relaid) CHECK_MESSAGE(memory_format_of(parameter) == MemoryFormat::nhwc, name);
    model->to(MemoryFormat::nchw);
    for (const Tensor& p : model->parameters()) CHECK(p.is_contiguous());
  }

  TEST_CASE("a channels-last ResNet-18 SGD step equals the NCHW one bit for bit") {
    // The CPU kernels take their inputs contiguous, so both models compute the
    // same sums in the same order; only where the values lie differs.
    auto nchw = cifar_resnet18(2);
    auto nhwc = cifar_resnet18(2);
    nhwc->to(MemoryFormat::nhwc);
    const std::vector<float> nchw_losses = train_steps(*nchw, MemoryFormat::nchw, 2);
    const std::vector<float> nhwc_losses = train_steps(*nhwc, MemoryFormat::nhwc, 2);
    CHECK(same_bits(nhwc_losses, nchw_losses));
    const nn::NamedTensors expected = nchw->state_dict(), actual = nhwc->state_dict();
    REQUIRE(actual.size() == expected.size());
    for (size_t k = 0; k < actual.size(); ++k)
      CHECK_MESSAGE(same_bits(values(actual[k].second), values(expected[k].second)), actual[k].first);
    const auto nchw_parameters = nchw->named_parameters(), nhwc_parameters = nhwc->named_parameters();
    for (size_t k = 0; k < nhwc_parameters.size(); ++k) {
      const Tensor& parameter = nhwc_parameters[k].second;
      CHECK_MESSAGE(same_bits(values(parameter.grad()), values(nchw_parameters[k].second.grad())),
                    nhwc_parameters[k].first);
      // PyTorch's gradient layout contract: .grad lies as its parameter does.
      CHECK_MESSAGE(same_dense_layout(parameter.grad(), parameter), nhwc_parameters[k].first);
    }
    for (auto& [name, parameter] : relaid_parameters(*nhwc))
      CHECK_MESSAGE(memory_format_of(parameter) == MemoryFormat::nhwc, name);
  }

  TEST_CASE("amp O2 (f16 weights but batch norm, f32 masters): a channels-last step equals the NCHW one bit for bit") {
    // Losses, then every state_dict value in logical order, after 2 steps.
    const auto run = [](MemoryFormat format) {
      auto model = cifar_resnet18(7);
      model->to(format);
      auto optimizer = amp::initialize(
          *model,
          [](std::vector<Tensor> parameters) -> std::unique_ptr<optim::Optimizer> {
            return std::make_unique<optim::SGD>(std::move(parameters), optim::SGDOptions(0.05).momentum(0.9));
          },
          amp::OptLevel::O2, optim::GradScalerOptions().init_scale(128));  // no step skipped
      for (auto& [name, parameter] : relaid_parameters(*model))
        CHECK_MESSAGE(memory_format_of(parameter) == format, name);  // kept through the conversion to f16
      const Tensor images = in_memory_format(batch_images().to(DType::f16), format), labels = batch_labels();
      std::vector<float> out;
      for (int step = 0; step < 2; ++step) {
        optimizer->zero_grad();
        Tensor loss;
        {
          auto autocast = optimizer->autocast();
          loss = cross_entropy((*model)(images), labels);
        }
        optimizer->scale_loss(loss).backward();
        optimizer->step();
        out.push_back(static_cast<float>(loss.item()));
      }
      CHECK(optimizer->scaler().skipped_steps() == 0);
      for (auto& [name, t] : model->state_dict())
        for (float v : values(t)) out.push_back(v);
      return out;
    };
    CHECK(same_bits(run(MemoryFormat::nhwc), run(MemoryFormat::nchw)));
  }

  TEST_CASE("gradients accumulate into a channels-last .grad") {
    for (bool channels_last : {false, true}) {
      manual_seed(3);
      nn::Conv2d conv(3, 4, 3);
      if (channels_last) conv.to(MemoryFormat::nhwc);
      const Tensor x = batch_images();
      for (int pass = 0; pass < 2; ++pass) sum(conv(x) * conv(x)).backward();  // no zero_grad: .grad adds
      manual_seed(3);
      nn::Conv2d once(3, 4, 3);
      sum(once(x) * once(x)).backward();
      const std::vector<float> twice = values(conv.weight.grad()), single = values(once.weight.grad());
      REQUIRE(twice.size() == single.size());
      for (size_t i = 0; i < twice.size(); ++i) CHECK(twice[i] == 2 * single[i]);  // x + x is exact
      CHECK(memory_format_of(conv.weight.grad()) == (channels_last ? MemoryFormat::nhwc : MemoryFormat::nchw));
    }
  }

  TEST_CASE("checkpoints are the same bytes from either format and load into either") {
    TempDir dir;
    auto nchw = cifar_resnet18(4);
    auto nhwc = cifar_resnet18(4);
    nhwc->to(MemoryFormat::nhwc);
    // The optimizer's momentum buffers (channels-last for the channels-last model) are written too.
    nn::NamedTensors nchw_momentum, nhwc_momentum;
    train_steps(*nchw, MemoryFormat::nchw, 1, &nchw_momentum);
    train_steps(*nhwc, MemoryFormat::nhwc, 1, &nhwc_momentum);
    int channels_last_buffers = 0;
    for (auto& [name, buffer] : nhwc_momentum) channels_last_buffers += memory_format_of(buffer) == MemoryFormat::nhwc;
    CHECK(channels_last_buffers == 17);
    nn::save_safetensors(dir.path() / "nchw.safetensors", nchw->state_dict());
    nn::save_safetensors(dir.path() / "nhwc.safetensors", nhwc->state_dict());
    nn::save_safetensors(dir.path() / "nchw_sgd.safetensors", nchw_momentum);
    nn::save_safetensors(dir.path() / "nhwc_sgd.safetensors", nhwc_momentum);
    CHECK(loom::testing::read_bytes(dir.path() / "nhwc.safetensors") ==
          loom::testing::read_bytes(dir.path() / "nchw.safetensors"));
    CHECK(loom::testing::read_bytes(dir.path() / "nhwc_sgd.safetensors") ==
          loom::testing::read_bytes(dir.path() / "nchw_sgd.safetensors"));

    // NCHW file into a channels-last model, and back: values equal, layouts kept.
    auto into_nhwc = cifar_resnet18(5);
    into_nhwc->to(MemoryFormat::nhwc);
    into_nhwc->load_state_dict(nn::load_safetensors(dir.path() / "nchw.safetensors").tensors);
    auto into_nchw = cifar_resnet18(5);
    into_nchw->load_state_dict(nn::load_safetensors(dir.path() / "nhwc.safetensors").tensors);
    const nn::NamedTensors expected = nchw->state_dict();
    const nn::NamedTensors from_nchw = into_nhwc->state_dict(), from_nhwc = into_nchw->state_dict();
    for (size_t k = 0; k < expected.size(); ++k) {
      CHECK_MESSAGE(same_bits(values(from_nchw[k].second), values(expected[k].second)), expected[k].first);
      CHECK_MESSAGE(same_bits(values(from_nhwc[k].second), values(expected[k].second)), expected[k].first);
    }
    for (auto& [name, parameter] : relaid_parameters(*into_nhwc))
      CHECK_MESSAGE(memory_format_of(parameter) == MemoryFormat::nhwc, name);
    for (const Tensor& p : into_nchw->parameters()) CHECK(p.is_contiguous());
  }

  TEST_CASE("changing the format after the optimizer made its state is refused at the next step") {
    auto model = cifar_resnet18(6);
    optim::SGD sgd(model->parameters(), optim::SGDOptions(0.05).momentum(0.9));
    const Tensor images = batch_images(), labels = batch_labels();
    cross_entropy((*model)(images), labels).backward();
    sgd.step();  // momentum buffers made, NCHW
    model->to(MemoryFormat::nhwc);
    sgd.zero_grad();
    cross_entropy((*model)(images), labels).backward();
    CHECK_THROWS_WITH_AS(sgd.step(), doctest::Contains("before building the optimizer"), Error);
  }
}
