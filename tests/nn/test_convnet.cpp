// The ConvNet and the module tree: PyTorch's names and parameter counts,
// state_dict round trips, and forward/backward against a PyTorch fixture.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include <loom/nn/convnet.h>
#include <loom/ops/loss.h>
#include "tests/support/formula_parameters.h"
#include "tests/support/gradcheck.h"

using namespace loom;

namespace {
nlohmann::json load_fixture(const std::string& name) {
  std::ifstream in(std::string(LOOM_FIXTURES_DIR) + "/" + name);
  REQUIRE_MESSAGE(in.good(), "missing fixture ", name);
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("ConvNet has PyTorch's structure, names and parameter count") {
  nn::ConvNet model;
  std::vector<std::string> names;
  for (auto& [name, t] : model.state_dict()) names.push_back(name);
  const std::vector<std::string> expected = {
      "layer1.0.weight", "layer1.0.bias", "layer1.1.weight", "layer1.1.bias", "layer1.1.running_mean",
      "layer1.1.running_var", "layer1.1.num_batches_tracked", "layer2.0.weight", "layer2.0.bias", "layer2.1.weight",
      "layer2.1.bias", "layer2.1.running_mean", "layer2.1.running_var", "layer2.1.num_batches_tracked", "fc.weight",
      "fc.bias"};
  CHECK(names == expected);
  // 16*25+16 + 2*16 + 32*16*25+32 + 2*32 + 10*1568+10
  CHECK(nn::count_parameters(model) == 29034);
  CHECK(model.named_parameters().size() == 10);
}

TEST_CASE("default initialisation follows PyTorch's bounds") {
  manual_seed(1);
  nn::ConvNet model;
  // kaiming_uniform(a = sqrt(5)) on conv1: bound = 1 / sqrt(fan_in) = 1/5.
  const double bound = 1.0 / 5.0;
  double max_seen = loom::testing::max_abs(model.layer1->named_parameters()[0].second);
  CHECK(max_seen <= bound);
  CHECK(max_seen > 0.9 * bound);
  auto bn = model.state_dict();
  CHECK(bn[2].second.to_vector<float>() == std::vector<float>(16, 1.0f));  // BN weight
  CHECK(bn[3].second.to_vector<float>() == std::vector<float>(16, 0.0f));  // BN bias
}

TEST_CASE("forward and gradients match PyTorch on a fixed input") {
  auto fixture = load_fixture("convnet_torch.json");
  nn::ConvNet model;
  model.to(DType::f64);
  loom::testing::set_formula_parameters(model);
  const int64_t n = 4;
  std::vector<double> pixels(n * 28 * 28);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = std::cos(0.011 * i) + 0.5 * std::sin(0.7 * i);
  Tensor x = Tensor::from_vector(pixels, {n, 1, 28, 28});
  Tensor targets = Tensor::from_vector<int64_t>(fixture["targets"].get<std::vector<int64_t>>(), {n});

  Tensor logits = model(x);
  auto expected_logits = fixture["logits"].get<std::vector<double>>();
  auto actual_logits = logits.to_vector<double>();
  REQUIRE(actual_logits.size() == expected_logits.size());
  for (size_t i = 0; i < actual_logits.size(); ++i) CHECK(actual_logits[i] == doctest::Approx(expected_logits[i]).epsilon(1e-9));

  Tensor loss = cross_entropy(logits, targets);
  CHECK(loss.item() == doctest::Approx(fixture["loss"].get<double>()).epsilon(1e-10));
  loss.backward();
  using loom::testing::check_each_named;
  check_each_named(model.named_parameters(), "parameter", [&](const std::string& name, const Tensor& p) {
    const auto& expected = fixture["grads"][name];
    auto g = p.grad().to_vector<double>();
    const loom::testing::ValueSums sums = loom::testing::value_sums(g);
    // Conv biases ahead of batch norm get gradients that cancel to rounding
    // noise (~1e-16): compare with a tolerance relative to the gradient's size.
    const double expected_abs = expected["abs_sum"].get<double>();
    CHECK(std::abs(sums.abs_sum - expected_abs) <= 1e-8 * expected_abs + 1e-12);
    CHECK(std::abs(sums.sum - expected["sum"].get<double>()) <= 1e-8 * expected_abs + 1e-12);
    auto head = expected["head"].get<std::vector<double>>();
    for (size_t i = 0; i < head.size(); ++i) CHECK(g[i] == doctest::Approx(head[i]).scale(1e-6).epsilon(1e-7));
  });
  check_each_named(model.named_buffers(), "buffer", [&](const std::string& name, const Tensor& b) {
    if (!fixture["buffers"].contains(name)) return;
    auto head = fixture["buffers"][name].get<std::vector<double>>();
    auto values = b.to_vector<double>();
    for (size_t i = 0; i < head.size(); ++i) CHECK(values[i] == doctest::Approx(head[i]).epsilon(1e-9));
  });
}

TEST_CASE("state_dict round trip and mismatches reported by name") {
  manual_seed(3);
  nn::ConvNet a;
  manual_seed(4);
  nn::ConvNet b;
  b.load_state_dict(a.state_dict());
  auto sa = a.state_dict(), sb = b.state_dict();
  for (size_t i = 0; i < sa.size(); ++i) CHECK(loom::testing::max_abs_diff(sa[i].second, sb[i].second) == 0);

  auto wrong_shape = a.state_dict();
  wrong_shape[14].second = Tensor::zeros({10, 100});
  CHECK_THROWS_WITH_AS(b.load_state_dict(wrong_shape), doctest::Contains("'fc.weight' has shape [10, 100]"), Error);
  auto missing = a.state_dict();
  missing.pop_back();
  missing.emplace_back("fc.extra", Tensor::zeros({1}));
  CHECK_THROWS_WITH_AS(b.load_state_dict(missing), doctest::Contains("missing 'fc.bias'"), Error);
  CHECK_THROWS_WITH_AS(b.load_state_dict(missing), doctest::Contains("unexpected 'fc.extra'"), Error);
}

// Sequential runs BatchNorm2d, ReLU, MaxPool2d(2) as batch_norm_relu_max_pool2d
// and other pools after BatchNorm2d + ReLU as batch_norm (fused ReLU) and
// max_pool2d; each the same outputs, gradients and running statistics as the
// modules called one by one.
TEST_CASE("Sequential fuses BatchNorm2d, ReLU and MaxPool2d(2), and no other pool") {
  struct Pool {
    int64_t kernel, stride;
    const char* op;
  };
  for (const Pool& pool : {Pool{2, 2, "batch_norm_relu_max_pool2d"}, Pool{2, 1, "max_pool2d"}, Pool{3, 2, "max_pool2d"}}) {
    INFO("MaxPool2d(", pool.kernel, ", ", pool.stride, ")");
    auto make = [&]() {
      auto bn = std::make_shared<nn::BatchNorm2d>(3);
      bn->weight.copy_(Tensor::from_vector<float>({0.5f, -1.25f, 2.0f}, {3}));
      bn->bias.copy_(Tensor::from_vector<float>({0.1f, 0.2f, -0.3f}, {3}));
      return nn::Sequential{bn, std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(pool.kernel, pool.stride)};
    };
    nn::Sequential fused = make(), apart = make();
    const Tensor x = loom::testing::random_tensor({2, 3, 9, 10}, 12, -1, 1, DType::f32);
    Tensor x_fused = x.clone().set_requires_grad(true), x_apart = x.clone().set_requires_grad(true);
    Tensor y_fused = fused.forward(x_fused);
    Tensor y_apart = x_apart;
    for (const auto& [name, module] : apart.named_children()) y_apart = module->forward(y_apart);
    REQUIRE(y_fused.grad_fn() != nullptr);
    CHECK(y_fused.grad_fn()->name() == pool.op);
    CHECK(loom::testing::max_abs_diff(y_fused, y_apart) == 0);
    const Tensor dy = loom::testing::random_tensor(y_fused.sizes(), 13, -1, 1, DType::f32);
    y_fused.backward(dy);
    y_apart.backward(dy);
    CHECK(loom::testing::max_abs_diff(x_fused.grad(), x_apart.grad()) == 0);
    for (size_t i = 0; i < 4; ++i) {  // weight, bias gradients; running mean and variance
      const Tensor a = i < 2 ? fused.parameters()[i].grad() : fused.named_buffers()[i - 2].second;
      const Tensor b = i < 2 ? apart.parameters()[i].grad() : apart.named_buffers()[i - 2].second;
      CHECK(loom::testing::max_abs_diff(a, b) == 0);
    }
  }
}

TEST_CASE("train and eval modes: running statistics only move in training") {
  manual_seed(5);
  nn::ConvNet model;
  Tensor x = loom::testing::random_tensor({2, 1, 28, 28}, 11, -1, 1, DType::f32);
  auto running_mean = [&]() { return model.state_dict()[4].second.to_vector<float>(); };
  model.eval();
  CHECK_FALSE(model.layer1->is_training());
  model(x);
  CHECK(running_mean() == std::vector<float>(16, 0.0f));
  model.train();
  model(x);
  CHECK(running_mean() != std::vector<float>(16, 0.0f));
  CHECK(model.state_dict()[6].second.item() == 1);  // num_batches_tracked
}

TEST_CASE("zero_grad drops gradients by default; set_to_none = false keeps their storage") {
  manual_seed(6);
  nn::ConvNet model;
  Tensor x = loom::testing::random_tensor({2, 1, 28, 28}, 12, -1, 1, DType::f32);
  cross_entropy(model(x), Tensor::from_vector<int64_t>({1, 2}, {2})).backward();
  Tensor w = model.fc->weight;
  void* storage = w.grad().raw_data();
  model.zero_grad(false);
  CHECK(w.grad().raw_data() == storage);
  CHECK(loom::testing::max_abs(w.grad()) == 0);
  model.zero_grad();
  CHECK_FALSE(w.grad().defined());
}

TEST_CASE("to() converts in place: handles taken before see the new dtype, values and gradients") {
  manual_seed(7);
  nn::ConvNet model;
  Tensor x = loom::testing::random_tensor({2, 1, 28, 28}, 13, -1, 1, DType::f32);
  cross_entropy(model(x), Tensor::from_vector<int64_t>({1, 2}, {2})).backward();
  Tensor w = model.fc->weight;  // what an optimizer built before the conversion holds
  Tensor mean = model.state_dict()[4].second;  // layer1.1.running_mean, a buffer
  const std::vector<float> values = w.to_vector<float>(), grads = w.grad().to_vector<float>();
  model.to(DType::f64);
  CHECK(w.is_same(model.fc->weight));
  CHECK(w.dtype() == DType::f64);
  CHECK(w.requires_grad());
  CHECK(w.is_leaf());
  CHECK(mean.dtype() == DType::f64);
  const std::vector<double> now = w.to_vector<double>(), now_grads = w.grad().to_vector<double>();
  REQUIRE(now.size() == values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    CHECK(now[i] == static_cast<double>(values[i]));
    CHECK(now_grads[i] == static_cast<double>(grads[i]));
  }
  // Training goes on in the new dtype through the same handles.
  model.zero_grad();
  cross_entropy(model(x.to(DType::f64)), Tensor::from_vector<int64_t>({1, 2}, {2})).backward();
  CHECK(w.grad().dtype() == DType::f64);
  // Batch norm kept by name keeps its dtype.
  model.to(DType::f32, {"BatchNorm2d"});
  CHECK(w.dtype() == DType::f32);
  CHECK(mean.dtype() == DType::f64);
  CHECK(model.state_dict()[4].second.is_same(mean));
}
