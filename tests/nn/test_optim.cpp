// Optimizers and schedules against torch.optim (fixture) and closed forms.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include <loom/optim/lr_scheduler.h>
#include <loom/optim/optimizer.h>

using namespace loom;

namespace {
std::vector<double> run(const std::string& name, const nlohmann::json& fixture) {
  Tensor p = Tensor::from_vector(fixture["start"].get<std::vector<double>>(), {3}).set_requires_grad(true);
  std::unique_ptr<optim::Optimizer> opt;
  if (name == "sgd_plain") opt = std::make_unique<optim::SGD>(std::vector<Tensor>{p}, optim::SGDOptions(0.1));
  if (name == "sgd_momentum")
    opt = std::make_unique<optim::SGD>(std::vector<Tensor>{p},
                                       optim::SGDOptions(0.1).momentum(0.9).dampening(0.1).weight_decay(0.01));
  if (name == "sgd_nesterov")
    opt = std::make_unique<optim::SGD>(std::vector<Tensor>{p},
                                       optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(0.01));
  if (name == "adam")
    opt = std::make_unique<optim::Adam>(std::vector<Tensor>{p},
                                        optim::AdamOptions(0.01).betas(0.9, 0.99).weight_decay(0.1));
  if (name == "adamw") opt = optim::make_adamw({p}, 0.01, 0.1);
  REQUIRE(opt != nullptr);
  for (auto& g : fixture["grads"]) {
    p.set_grad(Tensor::from_vector(g.get<std::vector<double>>(), {3}));
    opt->step();
  }
  return p.to_vector<double>();
}
}  // namespace

TEST_CASE("optimizers match torch.optim step for step") {
  std::ifstream in(std::string(LOOM_FIXTURES_DIR) + "/optim_torch.json");
  REQUIRE(in.good());
  auto fixture = nlohmann::json::parse(in);
  for (std::string name : {"sgd_plain", "sgd_momentum", "sgd_nesterov", "adam", "adamw"}) {
    INFO("optimizer ", name);
    auto expected = fixture[name].get<std::vector<double>>();
    auto actual = run(name, fixture);
    for (size_t i = 0; i < expected.size(); ++i) CHECK(actual[i] == doctest::Approx(expected[i]).epsilon(1e-12));
  }
}

namespace {
// Runs an optimizer (make(params)) for 3 steps on a 20011-element f32
// parameter and on the same f64 one: several parallel chunks and a tail
// shorter than a vector. The f64 parameter takes the scalar loop that the
// fixture test above checks against torch.optim; the f32 one takes the AVX2
// loop where the CPU has it. Checks that they agree and that the tail moved.
template <class Make>
void check_f32_follows_f64(Make&& make) {
  const int64_t n = 20011;
  std::vector<double> start(n), grad(n);
  for (int64_t i = 0; i < n; ++i) {
    start[i] = std::sin(0.37 * static_cast<double>(i));
    grad[i] = std::cos(0.11 * static_cast<double>(i)) + 0.25;
  }
  Tensor p32 = Tensor::from_vector_as(start, {n}, DType::f32).set_requires_grad(true);
  Tensor p64 = Tensor::from_vector_as(start, {n}, DType::f64).set_requires_grad(true);
  auto opt32 = make(std::vector<Tensor>{p32}), opt64 = make(std::vector<Tensor>{p64});
  for (int step = 0; step < 3; ++step) {  // the first step fills the optimizer's state, later ones use it
    p32.set_grad(Tensor::from_vector_as(grad, {n}, DType::f32));
    p64.set_grad(Tensor::from_vector_as(grad, {n}, DType::f64));
    opt32.step();
    opt64.step();
  }
  const auto actual = p32.to_vector<double>(), expected = p64.to_vector<double>();
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += std::abs(actual[i] - expected[i]) > 1e-5 * (1 + std::abs(expected[i]));
  CHECK(wrong == 0);
  CHECK(std::abs(actual[n - 1] - start[n - 1]) > 0.01);  // the tail moved
}
}  // namespace

TEST_CASE("SGD on long f32 parameters (the vectorised update) follows the f64 update checked against torch") {
  const std::pair<const char*, optim::SGDOptions> cases[] = {
      {"plain", optim::SGDOptions(0.1)},
      {"weight decay", optim::SGDOptions(0.1).weight_decay(0.01)},
      {"momentum", optim::SGDOptions(0.1).momentum(0.9).dampening(0.1).weight_decay(0.01)},
      {"nesterov", optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(0.01)}};
  for (const auto& [name, options] : cases) {
    INFO("SGD ", name);
    check_f32_follows_f64([&](std::vector<Tensor> params) { return optim::SGD(std::move(params), options); });
  }
}

TEST_CASE("Adam on long f32 parameters (the vectorised update) follows the f64 update checked against torch") {
  const std::pair<const char*, optim::AdamOptions> cases[] = {
      {"plain", optim::AdamOptions(0.01)},
      {"L2 weight decay", optim::AdamOptions(0.01).weight_decay(0.1).betas(0.8, 0.99)},
      {"AdamW", optim::AdamOptions(0.01).weight_decay(0.1).decoupled_weight_decay(true).eps(1e-3)}};
  for (const auto& [name, options] : cases) {
    INFO("Adam ", name);
    check_f32_follows_f64([&](std::vector<Tensor> params) { return optim::Adam(std::move(params), options); });
  }
}

TEST_CASE("parameter groups have their own learning rates; state round-trips") {
  Tensor a = Tensor::ones({2}, DType::f64).set_requires_grad(true);
  Tensor b = Tensor::ones({2}, DType::f64).set_requires_grad(true);
  optim::SGD opt({a}, optim::SGDOptions(0.1).momentum(0.5));
  opt.add_param_group({b}, optim::SGDOptions(1.0).momentum(0.5));
  a.set_grad(Tensor::ones({2}, DType::f64));
  b.set_grad(Tensor::ones({2}, DType::f64));
  opt.step();
  CHECK(a.to_vector<double>()[0] == doctest::Approx(0.9));
  CHECK(b.to_vector<double>()[0] == doctest::Approx(0.0));
  auto state = opt.state();
  REQUIRE(state.size() == 2);
  CHECK(state[0].first == "0.0.momentum_buffer");
  optim::SGD resumed({a}, optim::SGDOptions(0.1).momentum(0.5));
  resumed.add_param_group({b}, optim::SGDOptions(1.0).momentum(0.5));
  resumed.load_state(state);
  // Same next step from the original and the restored optimizer.
  Tensor a2 = a.detach().clone();
  opt.step();
  Tensor after_original = a.detach().clone();
  a.copy_(a2);
  resumed.step();
  CHECK(a.to_vector<double>() == after_original.to_vector<double>());
}

TEST_CASE("step_if_finite skips the whole update when GradScaler's flag is set, and steps as step() otherwise") {
  // Each optimizer twice from the same start: one steps plainly, the other
  // through step_if_finite with an overflow flag at its second step. A
  // skipped step leaves the parameters and every state (momentum, moments,
  // Adam's step count) as they were, so the flagged run ends one step behind
  // with the same values as a plain run of the clean steps only.
  using Make = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;
  const std::vector<std::pair<const char*, Make>> makes = {
      {"SGD momentum", [](std::vector<Tensor> p) {
         return std::make_unique<optim::SGD>(p, optim::SGDOptions(0.1).momentum(0.9).dampening(0.1).weight_decay(0.01));
       }},
      {"Adam", [](std::vector<Tensor> p) { return std::make_unique<optim::Adam>(p, optim::AdamOptions(0.01)); }},
      {"AdamW", [](std::vector<Tensor> p) { return optim::make_adamw(p, 0.01, 0.1); }}};
  const std::vector<std::vector<double>> grads = {{0.5, -1.0, 2.0}, {1e30, 3.0, -0.25}, {-0.75, 0.125, 1.5}};
  const Tensor clean = Tensor::scalar(0, DType::i32), overflow = Tensor::scalar(1, DType::i32);
  for (auto& [name, make] : makes) {
    INFO(name);
    Tensor flagged = Tensor::from_vector<double>({1.0, -2.0, 0.5}, {3}).set_requires_grad(true);
    Tensor plain = flagged.detach().clone().set_requires_grad(true);
    auto flagged_optimizer = make({flagged});
    auto plain_optimizer = make({plain});
    for (size_t step = 0; step < grads.size(); ++step) {
      flagged.set_grad(Tensor::from_vector(grads[step], {3}));
      const std::vector<double> before = flagged.to_vector<double>();
      const nn::NamedTensors state_before = flagged_optimizer->state();
      flagged_optimizer->step_if_finite(step == 1 ? overflow : clean);
      if (step == 1) {
        CHECK(flagged.to_vector<double>() == before);
        const nn::NamedTensors state_after = flagged_optimizer->state();
        REQUIRE(state_after.size() == state_before.size());
        for (size_t k = 0; k < state_after.size(); ++k) {
          INFO(state_after[k].first);
          CHECK(state_after[k].second.to(DType::f64).to_vector<double>() ==
                state_before[k].second.to(DType::f64).to_vector<double>());
        }
        continue;
      }
      plain.set_grad(Tensor::from_vector(grads[step], {3}));
      plain_optimizer->step();
    }
    CHECK(flagged.to_vector<double>() == plain.to_vector<double>());
    // No flag (no loss scaling): a plain step.
    flagged.set_grad(Tensor::from_vector(grads[0], {3}));
    plain.set_grad(Tensor::from_vector(grads[0], {3}));
    flagged_optimizer->step_if_finite(Tensor());
    plain_optimizer->step();
    CHECK(flagged.to_vector<double>() == plain.to_vector<double>());
  }
}

TEST_CASE("learning rates kept on the device follow set_lr; what keeps an optimizer's step from a CUDA graph, said") {
  Tensor p = Tensor::from_vector<float>({1.0f, 2.0f}, {2}).set_requires_grad(true);
  Tensor q = Tensor::from_vector<float>({3.0f}, {1}).set_requires_grad(true);
  optim::SGD sgd({p}, optim::SGDOptions(0.5).momentum(0.9));
  sgd.add_param_group({q}, optim::SGDOptions(0.25));
  CHECK_FALSE(sgd.lr_tensor(0).defined());
  CHECK(sgd.capture_refusal()->find("learning rate on the host") != std::string::npos);
  sgd.keep_lr_on_device(Device::cpu());
  REQUIRE(sgd.lr_tensor(1).defined());
  CHECK(sgd.lr_tensor(0).dtype() == DType::f64);
  CHECK(sgd.lr_tensor(0).item() == 0.5);
  CHECK(sgd.lr_tensor(1).item() == 0.25);
  sgd.set_lr(1, 0.125);
  CHECK(sgd.lr_tensor(1).item() == 0.125);
  CHECK(sgd.lr_tensor(0).item() == 0.5);
  sgd.set_lr(0.0625);
  CHECK(sgd.lr_tensor(0).item() == 0.0625);
  CHECK(sgd.lr_tensor(1).item() == 0.0625);
  // A schedule's rates reach the device copy too.
  optim::StepLR schedule(sgd, 1, 0.5);
  schedule.step();
  CHECK(sgd.lr_tensor(0).item() == sgd.lr(0));
  // On the CPU the rates stay a host copy's: still no capture.
  CHECK(sgd.capture_refusal()->find("learning rate on the host") != std::string::npos);
  optim::Adam adam(std::vector<Tensor>{p}, optim::AdamOptions());
  CHECK(adam.capture_refusal()->find("Adam keeps its learning rate on the host") != std::string::npos);
}

TEST_CASE("StepLR and CosineAnnealingLR follow PyTorch's closed forms") {
  Tensor p = Tensor::ones({1}).set_requires_grad(true);
  optim::SGD opt({p}, optim::SGDOptions(0.1));
  optim::StepLR step(opt, 2, 0.5);
  std::vector<double> seen;
  for (int e = 0; e < 5; ++e) {
    seen.push_back(opt.lr());
    step.step();
  }
  CHECK(seen == std::vector<double>{0.1, 0.1, 0.05, 0.05, 0.025});
  optim::SGD opt2({p}, optim::SGDOptions(1.0));
  optim::CosineAnnealingLR cosine(opt2, 4, 0.0);
  cosine.step();
  CHECK(opt2.lr() == doctest::Approx((1 + std::cos(M_PI / 4)) / 2));
  cosine.step();
  CHECK(opt2.lr() == doctest::Approx(0.5));
  cosine.set_last_epoch(4);
  CHECK(opt2.lr() == doctest::Approx(0.0));
}
