// Elementwise ops and reductions: hand-computed forward values, backward
// against finite differences, and the autograd engine's accumulation rules.
#include <doctest/doctest.h>

#include <loom/core/autograd.h>
#include <loom/core/profiler.h>
#include <loom/ops/dropout.h>
#include <loom/ops/elementwise.h>
#include "tests/support/gradcheck.h"

using namespace loom;
using loom::testing::check_gradients;
using loom::testing::random_tensor;

TEST_CASE("elementwise forward matches hand computation") {
  Tensor a = Tensor::from_vector<float>({1, -2, 3, -4}, {2, 2});
  Tensor b = Tensor::from_vector<float>({0.5f, 0.5f, 2, 2}, {2, 2});
  CHECK(add(a, b).to_vector<float>() == std::vector<float>{1.5f, -1.5f, 5, -2});
  CHECK(sub(a, b).to_vector<float>() == std::vector<float>{0.5f, -2.5f, 1, -6});
  CHECK(mul(a, b).to_vector<float>() == std::vector<float>{0.5f, -1, 6, -8});
  CHECK(relu(a).to_vector<float>() == std::vector<float>{1, 0, 3, 0});
  CHECK(scale(a, 2).to_vector<float>() == std::vector<float>{2, -4, 6, -8});
  CHECK(add_scalar(a, 1).to_vector<float>() == std::vector<float>{2, -1, 4, -3});
  CHECK(sum(a).item() == -2);
  CHECK(mean(a).item() == -0.5);
}

TEST_CASE("elementwise backward matches finite differences") {
  Tensor a = random_tensor({3, 5}, 1).set_requires_grad(true);
  Tensor b = random_tensor({3, 5}, 2).set_requires_grad(true);
  check_gradients([](const TensorList& x) { return add(x[0], x[1]); }, {a, b});
  check_gradients([](const TensorList& x) { return sub(x[0], x[1]); }, {a, b});
  check_gradients([](const TensorList& x) { return mul(x[0], x[1]); }, {a, b});
  check_gradients([](const TensorList& x) { return scale(x[0], -3.5); }, {a});
  check_gradients([](const TensorList& x) { return add_scalar(x[0], 2.0); }, {a});
  check_gradients([](const TensorList& x) { return sum(x[0]); }, {a});
  check_gradients([](const TensorList& x) { return mean(x[0]); }, {a});
  // relu is not differentiable at 0: keep values away from it.
  Tensor c = random_tensor({4, 7}, 3, 0.1, 1.0);
  Tensor d = scale(random_tensor({4, 7}, 4, 0.1, 1.0), -1.0);
  Tensor mixed = Tensor::empty({8, 7}, DType::f64);
  mixed.slice(0, 0, 4).copy_(c);
  mixed.slice(0, 4, 8).copy_(d);
  mixed.set_requires_grad(true);
  check_gradients([](const TensorList& x) { return relu(x[0]); }, {mixed});
}

TEST_CASE("gelu: PyTorch's values (approximate='none') and finite differences") {
  // x * Phi(x), from tables of the standard normal CDF; torch.nn.functional.gelu gives the same.
  const Tensor x = Tensor::from_vector<double>({1.0, -1.0, 0.5, -2.0, 3.0, 0.0}, {6});
  const std::vector<double> expected{0.8413447460685429, -0.15865525393145707, 0.34573123063700656,
                                     -0.04550026389635842, 2.99595030590511, 0.0};
  const std::vector<double> y = gelu(x).to_vector<double>();
  for (size_t i = 0; i < expected.size(); ++i) CHECK(y[i] == doctest::Approx(expected[i]).epsilon(1e-12));
  const std::vector<float> y32 = gelu(x.to(DType::f32)).to_vector<float>();
  for (size_t i = 0; i < expected.size(); ++i) CHECK(y32[i] == doctest::Approx(expected[i]).epsilon(1e-6));
  CHECK(gelu(x.to(DType::bf16)).dtype() == DType::bf16);
  Tensor a = random_tensor({4, 9}, 6, -3.0, 3.0).set_requires_grad(true);
  check_gradients([](const TensorList& t) { return gelu(t[0]); }, {a});
  check_gradients([](const TensorList& t) { return gelu(mul(t[0], t[0])); }, {a});
}

TEST_CASE("views are differentiable") {
  Tensor a = random_tensor({2, 3, 4}, 5).set_requires_grad(true);
  check_gradients([](const TensorList& x) { return x[0].transpose(0, 2).contiguous(); }, {a});
  check_gradients([](const TensorList& x) { return x[0].reshape({6, 4}); }, {a});
  check_gradients([](const TensorList& x) { return x[0].slice(2, 1, 4, 2); }, {a});
  check_gradients([](const TensorList& x) { return x[0].permute({1, 2, 0}).slice(0, 1, 3).contiguous(); }, {a});
  check_gradients([](const TensorList& x) { return x[0].flatten(1); }, {a});
  // A dtype conversion passes the gradient through, converted back.
  Tensor y = sum(a.to(DType::f32));
  a.set_grad(Tensor());
  y.backward();
  CHECK(a.grad().dtype() == DType::f64);
  CHECK(a.grad().to_vector<double>() == std::vector<double>(24, 1.0));
}

TEST_CASE("gradients accumulate across uses and across backward calls") {
  Tensor x = Tensor::from_vector<double>({1, 2, 3}, {3}).set_requires_grad(true);
  // y = x*x + x: dy/dx = 2x + 1, with x used three times in the graph.
  Tensor y = sum(add(mul(x, x), x));
  y.backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{3, 5, 7});
  Tensor z = sum(scale(x, 2.0));
  z.backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{5, 7, 9});
}

TEST_CASE("post-accumulate hooks run once per backward, after the gradient is complete") {
  Tensor x = Tensor::from_vector<double>({1, 2}, {2}).set_requires_grad(true);
  std::vector<double> seen;
  int calls = 0;
  x.register_post_accumulate_grad_hook([&](Tensor& p) {
    ++calls;
    seen = p.grad().to_vector<double>();
  });
  sum(add(mul(x, x), scale(x, 3.0))).backward();
  CHECK(calls == 1);
  CHECK(seen == std::vector<double>{5, 7});
}

TEST_CASE("no-grad mode records nothing and backward twice needs retain_graph") {
  Tensor x = Tensor::from_vector<double>({1, 2}, {2}).set_requires_grad(true);
  {
    NoGradGuard guard;
    Tensor y = mul(x, x);
    CHECK_FALSE(y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
  }
  Tensor y = sum(mul(x, x));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{4, 8});
  CHECK_THROWS_WITH_AS(y.backward(), doctest::Contains("retain_graph"), Error);
  Tensor v = Tensor::zeros({1});
  CHECK_THROWS_WITH_AS(v.backward(), doctest::Contains("does not require grad"), Error);
}

TEST_CASE("f16 and bf16 round trip and compute through f32") {
  Tensor a = Tensor::from_vector<float>({1.0f, -2.5f, 65504.0f, 1e-7f, 3.14159f}, {5});
  auto half = a.to(DType::f16).to_vector<float>();
  CHECK(half[0] == 1.0f);
  CHECK(half[1] == -2.5f);
  CHECK(half[2] == 65504.0f);
  CHECK(half[3] == doctest::Approx(1.1920929e-7).epsilon(1e-3));  // nearest subnormal: 2 * 2^-24
  CHECK(half[4] == doctest::Approx(3.140625));
  CHECK(static_cast<float>(Half(65520.0f)) == INFINITY);
  CHECK(static_cast<float>(BFloat16(3.14159f)) == 3.140625f);
  CHECK(static_cast<float>(BFloat16(1.0f + 1.0f / 256)) == 1.0f);  // tie rounds to even
  Tensor h = a.slice(0, 0, 2).to(DType::bf16);
  CHECK(relu(h).dtype() == DType::bf16);
  CHECK(relu(h).to_vector<float>() == std::vector<float>{1.0f, 0.0f});
}

TEST_CASE("end-of-backward callbacks run once, after every gradient is accumulated") {
  Tensor x = Tensor::from_vector<double>({1, 2}, {2}).set_requires_grad(true);
  Tensor y = Tensor::from_vector<double>({3, 4}, {2}).set_requires_grad(true);
  std::vector<std::string> events;
  auto hook = [&](const char* name) {
    return [&events, name](Tensor&) {
      events.push_back(name);
      if (events.size() == 1) {
        queue_end_of_backward_callback([&events] { events.push_back("end"); });
      }
    };
  };
  x.register_post_accumulate_grad_hook(hook("x"));
  y.register_post_accumulate_grad_hook(hook("y"));
  sum(mul(x, y)).backward();
  REQUIRE(events.size() == 3);
  CHECK(events.back() == "end");
  CHECK_THROWS_WITH_AS(queue_end_of_backward_callback([] {}), doctest::Contains("outside a backward pass"), Error);
}

// A gradient that nothing else holds becomes .grad as it is (no copy): with
// zero_grad's default (set_to_none) this is every parameter's first
// accumulation, e.g. 100 MB per step for ResNet-50.
TEST_CASE("AccumulateGrad takes over a gradient nothing else holds, with the profiler off and on") {
  for (bool profiling : {false, true}) {
    INFO("profiling ", profiling);
    profiler::set_enabled(profiling);
    Tensor x = Tensor::from_vector<double>({1, 2, 3}, {3}).set_requires_grad(true);
    Tensor y = x.detach().clone();
    const void* produced = nullptr;
    record("probe", {x}, {&y}, [&produced](const TensorList& g, const Node&) {
      Tensor dx = scale(g[0], 2.0);  // a fresh tensor that only the engine will hold
      produced = dx.raw_data();
      return TensorList{dx};
    });
    sum(y).backward();
    profiler::set_enabled(false);
    CHECK(x.grad().to_vector<double>() == std::vector<double>{2, 2, 2});
    CHECK(x.grad().raw_data() == produced);
  }
  profiler::reset();
}

TEST_CASE("a gradient summed over two uses is added to in place only when nothing else holds it") {
  // Two probes feed one sum: one returns a fresh gradient, the other a tensor
  // the caller keeps. Whichever arrives first, `held` must stay as it was; a
  // fresh first one is added to in place and then taken over by x.grad.
  for (bool held_first : {false, true}) {
    INFO("held first ", held_first);
    Tensor x = Tensor::from_vector<double>({1, 2, 3}, {3}).set_requires_grad(true);
    Tensor held = Tensor::from_vector<double>({10, 20, 30}, {3});
    const void* produced = nullptr;
    auto fresh = [&produced](const TensorList& g, const Node&) {
      Tensor dx = scale(g[0], 1.0);
      produced = dx.raw_data();
      return TensorList{dx};
    };
    auto kept = [&held](const TensorList&, const Node&) { return TensorList{held}; };
    // The node recorded last runs first.
    Tensor a = x.detach().clone(), b = x.detach().clone();
    record("first recorded", {x}, {&a}, held_first ? BackwardFunction(fresh) : BackwardFunction(kept));
    record("second recorded", {x}, {&b}, held_first ? BackwardFunction(kept) : BackwardFunction(fresh));
    sum(add(a, b)).backward();
    CHECK(held.to_vector<double>() == std::vector<double>{10, 20, 30});
    CHECK(x.grad().to_vector<double>() == std::vector<double>{11, 21, 31});
    if (!held_first) CHECK(x.grad().raw_data() == produced);
  }
}

TEST_CASE("mul broadcasts (N, C, 1, 1) and (N, 1, 1, 1) over (N, C, H, W): values and finite differences") {
  // x[n, c, h, w] = 1 + h * 2 + w (2x2 planes), scale[n, c] = 10 * n + c + 1.
  std::vector<double> x_values, expected;
  for (int n = 0; n < 2; ++n) {
    for (int c = 0; c < 3; ++c) {
      for (int i = 0; i < 4; ++i) {
        x_values.push_back(1 + i);
        expected.push_back((1 + i) * (10.0 * n + c + 1));
      }
    }
  }
  const Tensor x = Tensor::from_vector<double>(x_values, {2, 3, 2, 2});
  const Tensor s = Tensor::from_vector<double>({1, 2, 3, 11, 12, 13}, {2, 3, 1, 1});
  CHECK(mul(x, s).to_vector<double>() == expected);
  CHECK(mul(s, x).to_vector<double>() == expected);
  CHECK(mul(x, s).sizes() == Shape{2, 3, 2, 2});
  // The scale's gradient of sum(x * s) is the sum of its plane: 1 + 2 + 3 + 4.
  Tensor s_leaf = s.clone().set_requires_grad(true);
  sum(mul(x, s_leaf)).backward();
  CHECK(s_leaf.grad().to_vector<double>() == std::vector<double>(6, 10.0));
  CHECK(s_leaf.grad().sizes() == Shape{2, 3, 1, 1});

  Tensor a = random_tensor({2, 3, 4, 5}, 21).set_requires_grad(true);
  Tensor channels = random_tensor({2, 3, 1, 1}, 22).set_requires_grad(true);
  Tensor samples = random_tensor({2, 1, 1, 1}, 23).set_requires_grad(true);
  check_gradients([](const TensorList& t) { return mul(t[0], t[1]); }, {a, channels});
  check_gradients([](const TensorList& t) { return mul(t[1], t[0]); }, {a, samples});
  CHECK(mul(a.to(DType::f32), channels.to(DType::f32)).dtype() == DType::f32);
  // (2, 1, 4, 5): the dims that are not 1 are not one run of the other's.
  CHECK_THROWS_WITH_AS(mul(a, random_tensor({2, 1, 4, 5}, 24)), doctest::Contains("neither match nor broadcast"),
                       Error);
  CHECK_THROWS_WITH_AS(mul(a, random_tensor({3, 1, 5}, 25)), doctest::Contains("neither match nor broadcast"), Error);
  // An empty batch broadcasts as a full one does (stochastic depth on no rows).
  const Tensor empty = Tensor::zeros({0, 3, 4, 5}, DType::f64);
  CHECK(mul(empty, Tensor::zeros({0, 3, 1, 1}, DType::f64)).sizes() == Shape{0, 3, 4, 5});
  CHECK(stochastic_depth(empty, 0.5, StochasticDepthMode::row, true).sizes() == Shape{0, 3, 4, 5});
}

TEST_CASE("mul broadcasts (C, 1, 1), (1, C, 1, 1) and (C) over the batch too: values and finite differences") {
  // ConvNeXt's layer scale: (C, 1, 1) over (N, C, H, W); x[n, c, i] = 100 n + 10 c + i, scale[c] = c + 2.
  std::vector<double> x_values, expected;
  for (int n = 0; n < 2; ++n) {
    for (int c = 0; c < 3; ++c) {
      for (int i = 0; i < 4; ++i) {
        x_values.push_back(100 * n + 10 * c + i);
        expected.push_back((100 * n + 10 * c + i) * (c + 2.0));
      }
    }
  }
  const Tensor x = Tensor::from_vector<double>(x_values, {2, 3, 2, 2});
  const Tensor s = Tensor::from_vector<double>({2, 3, 4}, {3, 1, 1});
  CHECK(mul(x, s).to_vector<double>() == expected);
  CHECK(mul(s, x).to_vector<double>() == expected);
  CHECK(mul(x, s.reshape({1, 3, 1, 1})).to_vector<double>() == expected);
  CHECK(mul(s, x).sizes() == Shape{2, 3, 2, 2});
  // d/ds[c] of sum(x * s): the sum of channel c over the batch and the plane.
  Tensor s_leaf = s.clone().set_requires_grad(true);
  sum(mul(s_leaf, x)).backward();
  CHECK(s_leaf.grad().to_vector<double>() == std::vector<double>{(0 + 1 + 2 + 3) * 2 + 400, (40 + 6) * 2 + 400,
                                                                 (80 + 6) * 2 + 400});
  CHECK(s_leaf.grad().sizes() == Shape{3, 1, 1});

  Tensor a = random_tensor({2, 3, 4, 5}, 31).set_requires_grad(true);
  Tensor layer_scale = random_tensor({3, 1, 1}, 32).set_requires_grad(true);
  Tensor middle = random_tensor({1, 3, 4, 1}, 33).set_requires_grad(true);
  Tensor last = random_tensor({5}, 34).set_requires_grad(true);  // (C) over channels-last (N, H, W, C)
  check_gradients([](const TensorList& t) { return mul(t[0], t[1]); }, {a, layer_scale});
  check_gradients([](const TensorList& t) { return mul(t[1], t[0]); }, {a, middle});
  check_gradients([](const TensorList& t) { return mul(t[0], t[1]); }, {a, last});
  CHECK(mul(a.to(DType::f32), layer_scale.to(DType::f32)).dtype() == DType::f32);
  // A scale of ones everywhere multiplies everything; an empty batch still broadcasts.
  CHECK(mul(x, Tensor::full({1, 1}, 2.0, DType::f64)).to_vector<double>() == scale(x, 2.0).to_vector<double>());
  const Tensor empty = Tensor::zeros({0, 3, 4, 5}, DType::f64);
  CHECK(mul(Tensor::zeros({3, 1, 1}, DType::f64), empty).sizes() == Shape{0, 3, 4, 5});
  CHECK(mul(Tensor::zeros({0, 3, 1, 1}, DType::f64), empty).sizes() == Shape{0, 3, 4, 5});
}
