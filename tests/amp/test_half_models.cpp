// Every op of the ConvNet and the ResNets in f16 and bf16 on the CPU: both
// models run forward and backward with f16 / bf16 weights (batch norm in f32,
// as O2 keeps it, and in f16 too, as O3 does), and their logits, loss and
// gradients are compared with the same model in f32. Also autocast's rules.
#include <doctest/doctest.h>

#include <cmath>
#include <optional>

#include <loom/core/autograd.h>
#include <loom/core/generator.h>
#include <loom/nn/convnet.h>
#include <loom/nn/resnet.h>
#include <loom/ops/autocast.h>
#include <loom/ops/conv2d.h>
#include <loom/ops/linear.h>
#include <loom/ops/loss.h>

using namespace loom;

namespace {

using ModelFactory = std::function<std::shared_ptr<nn::Module>()>;

Tensor random_input(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape);
  Generator(seed).normal_(t, 0.0, 1.0);
  return t;
}

// ||a - b|| / ||b||
double relative_error(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double error = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    error += (x[i] - y[i]) * (x[i] - y[i]);
    norm += y[i] * y[i];
  }
  return std::sqrt(error) / std::max(std::sqrt(norm), 1e-30);
}

bool all_finite(const Tensor& t) {
  for (double v : t.to_vector<double>())
    if (!std::isfinite(v)) return false;
  return true;
}

// Global relative error of the gradients of `a` against those of `b`: ||ga - gb|| / ||gb|| over all parameters.
double gradient_error(nn::Module& a, nn::Module& b) {
  double error = 0, norm = 0;
  auto pa = a.named_parameters(), pb = b.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    std::vector<double> x = pa[i].second.grad().to_vector<double>(), y = pb[i].second.grad().to_vector<double>();
    for (size_t k = 0; k < x.size(); ++k) {
      error += (x[k] - y[k]) * (x[k] - y[k]);
      norm += y[k] * y[k];
    }
  }
  return std::sqrt(error / norm);
}

// Runs `make()` with its weights (batch norm's too when `half_batch_norm`)
// and input in `dtype`, and compares logits, loss and gradients with the
// same model in f64. The yardstick is the error of f32 arithmetic on the same
// rounded weights and input: a small network at initialisation is sensitive
// enough that rounding its weights to f16 alone moves its gradient by several
// percent, so computing in f16 may cost at most about as much again. (Deep
// networks in training mode at initialisation are chaotic through the batch
// statistics -- rounding alone moves a small ResNet-50's gradient by half its
// norm -- so the ResNet-50 is compared in evaluation mode.)
// Batch norm from the batch's statistics, or from the running ones.
enum class Phase { training, evaluation };

void check_against_f32(const ModelFactory& make, const Shape& input_shape, DType dtype, bool half_batch_norm,
                       Phase phase = Phase::training) {
  const std::vector<std::string> keep = half_batch_norm ? std::vector<std::string>{} : std::vector<std::string>{"BatchNorm2d"};
  auto build = [&](std::optional<DType> stored, DType compute) {
    manual_seed(11);
    std::shared_ptr<nn::Module> model = make();
    if (stored) model->to(*stored, keep);
    model->to(compute, keep);
    if (phase == Phase::evaluation) model->eval();
    return model;
  };
  std::shared_ptr<nn::Module> exact = build(std::nullopt, DType::f64);
  std::shared_ptr<nn::Module> rounded = build(dtype, DType::f32);  // f32 arithmetic on the rounded weights
  std::shared_ptr<nn::Module> model = build(std::nullopt, dtype);
  const Tensor x = random_input(input_shape, 12);
  std::vector<int64_t> label_values;
  for (int64_t i = 0; i < input_shape[0]; ++i) label_values.push_back(i % 10);
  const Tensor labels = Tensor::from_vector(label_values, {input_shape[0]});

  Tensor exact_logits = (*exact)(x.to(DType::f64));
  Tensor exact_loss = cross_entropy(exact_logits, labels);
  exact_loss.backward();
  Tensor rounded_logits = (*rounded)(x.to(dtype).to(DType::f32));
  Tensor rounded_loss = cross_entropy(rounded_logits, labels);
  rounded_loss.backward();
  Tensor logits = (*model)(x.to(dtype));
  CHECK(logits.dtype() == dtype);
  Tensor loss = cross_entropy(logits.to(DType::f32), labels);
  loss.backward();

  for (auto& named : model->named_parameters()) {
    // Variables, not structured bindings: clang 14 cannot capture those in doctest's INFO.
    auto& name = named.first;
    auto& parameter = named.second;
    CAPTURE(name);
    REQUIRE(parameter.grad().defined());
    CHECK(parameter.grad().dtype() == parameter.dtype());
    CHECK(all_finite(parameter.grad()));
  }
  for (auto& named : model->named_buffers()) CHECK_MESSAGE(all_finite(named.second), named.first);
  const double rounding_logits = relative_error(rounded_logits, exact_logits);
  const double rounding_gradient = gradient_error(*rounded, *exact);
  const double logits_error = relative_error(logits, exact_logits);
  const double gradient = gradient_error(*model, *exact);
  MESSAGE(std::string(dtype_name(dtype)), ": logits error ", logits_error, " (rounding alone ", rounding_logits, "), gradient error ",
          gradient, " (rounding alone ", rounding_gradient, ")");
  const double unit = dtype == DType::f16 ? 1.0 / 2048 : 1.0 / 256;  // the format's relative precision
  CHECK(logits_error <= 3 * rounding_logits + 8 * unit);
  CHECK(std::abs(loss.item() - exact_loss.item()) <=
        3 * std::abs(rounded_loss.item() - exact_loss.item()) + 8 * unit * exact_loss.item());
  CHECK(gradient <= 2.5 * rounding_gradient + 8 * unit);

  if (phase == Phase::evaluation) return;
  // Evaluation normalises with the running statistics.
  NoGradGuard no_grad;
  exact->eval();
  model->eval();
  CHECK(relative_error((*model)(x.to(dtype)), (*exact)(x.to(DType::f64))) <= 3 * rounding_logits + 8 * unit);
}

ModelFactory convnet() {
  return [] { return std::make_shared<nn::ConvNet>(); };
}
ModelFactory small_resnet18() {  // basic blocks, CIFAR stem
  return [] { return nn::resnet18(nn::ResNetOptions().num_classes(10).stem(nn::ResNetStem::cifar).width(8)); };
}
ModelFactory small_resnet50() {  // bottlenecks, ImageNet stem (max pooling with padding)
  return [] { return nn::resnet50(nn::ResNetOptions().num_classes(10).width(8)); };
}

}  // namespace

TEST_SUITE("half_models") {
  // f16 keeps 11 significant bits, bf16 8: the tolerances are a few units of
  // each format's rounding, grown through the depth of the network.
  TEST_CASE("ConvNet in f16 and bf16") {
    check_against_f32(convnet(), {8, 1, 28, 28}, DType::f16, false);
    check_against_f32(convnet(), {8, 1, 28, 28}, DType::bf16, false);
  }
  TEST_CASE("ConvNet with f16 batch norm (O3)") { check_against_f32(convnet(), {8, 1, 28, 28}, DType::f16, true); }
  TEST_CASE("ResNet-18 (basic blocks) in f16 and bf16") {
    check_against_f32(small_resnet18(), {4, 3, 16, 16}, DType::f16, false);
    check_against_f32(small_resnet18(), {4, 3, 16, 16}, DType::bf16, false);
  }
  TEST_CASE("ResNet-50 (bottlenecks, max pooling) in f16 and bf16") {
    check_against_f32(small_resnet50(), {4, 3, 32, 32}, DType::f16, false, Phase::evaluation);
    check_against_f32(small_resnet50(), {4, 3, 32, 32}, DType::bf16, false, Phase::evaluation);
  }

  TEST_CASE("autocast: conv2d and linear in the lower precision, losses in f32, f64 untouched") {
    Tensor x = random_input({2, 3, 8, 8}, 1);
    Tensor w = random_input({4, 3, 3, 3}, 2).set_requires_grad(true);
    Tensor b = random_input({4}, 3).set_requires_grad(true);
    CHECK_FALSE(ops::autocast_enabled());
    {
      ops::AutocastGuard autocast(true, DType::bf16);
      CHECK(ops::autocast_enabled());
      CHECK(ops::autocast_dtype() == DType::bf16);
      Tensor y = conv2d(x, w, b, {.padding = {1, 1}});
      CHECK(y.dtype() == DType::bf16);
      Tensor z = linear(y.reshape({2, -1}), random_input({10, 256}, 4));
      CHECK(z.dtype() == DType::bf16);
      Tensor loss = cross_entropy(z, Tensor::from_vector<int64_t>({1, 7}, {2}));
      CHECK(loss.dtype() == DType::f32);
      CHECK(log_softmax(z).dtype() == DType::f32);
      loss.backward();
      CHECK(w.grad().dtype() == DType::f32);  // through the cast back to the weight's dtype
      CHECK(b.grad().dtype() == DType::f32);
      {
        ops::AutocastGuard off(false);
        CHECK(conv2d(x, w.detach()).dtype() == DType::f32);
      }
      CHECK(ops::autocast_enabled());
      Tensor x64 = x.to(DType::f64);
      CHECK(conv2d(x64, w.detach().to(DType::f64)).dtype() == DType::f64);  // gradient checks keep f64
    }
    CHECK_FALSE(ops::autocast_enabled());
    CHECK(conv2d(x, w.detach()).dtype() == DType::f32);
    CHECK_THROWS_AS(ops::AutocastGuard(true, DType::f32), loom::Error);
  }
}
