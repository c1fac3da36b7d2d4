// GradScaler: the schedule (skip and back off on overflow, grow after the
// interval, stay within the bounds), the fused unscale-and-check pass against
// hand-computed values, and the scaled loss's gradient against the unscaled one.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <limits>

#include <loom/core/autograd.h>
#include <loom/core/error.h>
#include <loom/ops/loss.h>
#include <loom/optim/grad_scaler.h>

using namespace loom;
using optim::GradScaler;
using optim::GradScalerOptions;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
// The flags unscale() returns: an i32 scalar, 1 on overflow.
Tensor no_inf() { return Tensor::scalar(0, DType::i32); }
Tensor found_inf() { return Tensor::scalar(1, DType::i32); }
bool overflowed(const Tensor& flag) {
  REQUIRE(flag.defined());
  CHECK(flag.dtype() == DType::i32);
  CHECK(flag.numel() == 1);
  return flag.item() != 0;
}
}

TEST_SUITE("grad_scaler") {
  TEST_CASE("defaults are apex's and PyTorch's") {
    GradScaler scaler;
    CHECK(scaler.get_scale() == 65536.0);
    CHECK(scaler.options().growth_interval() == 2000);
    CHECK(scaler.options().growth_factor() == 2.0);
    CHECK(scaler.options().backoff_factor() == 0.5);
    CHECK(scaler.options().min_scale() == 1.0);
    CHECK(scaler.options().max_scale() == 16777216.0);
    CHECK(scaler.growth_tracker() == 0);
  }

  TEST_CASE("overflow halves the scale and restarts the count; 2000 clean steps double it") {
    GradScaler scaler;
    for (int i = 0; i < 1999; ++i) scaler.update(no_inf());
    CHECK(scaler.get_scale() == 65536.0);
    CHECK(scaler.growth_tracker() == 1999);
    scaler.update(found_inf());  // one overflow just before the interval: back off, count again from zero
    CHECK(scaler.get_scale() == 32768.0);
    CHECK(scaler.growth_tracker() == 0);
    CHECK(scaler.skipped_steps() == 1);
    for (int i = 0; i < 1999; ++i) scaler.update(no_inf());
    CHECK(scaler.get_scale() == 32768.0);
    scaler.update(no_inf());  // the 2000th clean step in a row
    CHECK(scaler.get_scale() == 65536.0);
    CHECK(scaler.growth_tracker() == 0);
    scaler.update(found_inf());
    scaler.update(found_inf());
    CHECK(scaler.get_scale() == 16384.0);
    CHECK(scaler.skipped_steps() == 3);
  }

  TEST_CASE("the scale stays within [min_scale, max_scale]") {
    GradScaler low(GradScalerOptions().init_scale(2).min_scale(1));
    low.update(found_inf());
    CHECK(low.get_scale() == 1.0);
    low.update(found_inf());  // at the floor: the step is still skipped, the scale stays
    CHECK(low.get_scale() == 1.0);
    CHECK(low.skipped_steps() == 2);

    GradScaler high(GradScalerOptions().init_scale(16777216.0).growth_interval(2));
    for (int i = 0; i < 6; ++i) high.update(no_inf());
    CHECK(high.get_scale() == 16777216.0);
    CHECK(high.growth_tracker() == 0);

    GradScaler custom(GradScalerOptions().init_scale(8).growth_interval(3).growth_factor(4).backoff_factor(0.25)
                          .min_scale(0.5).max_scale(64));
    for (int i = 0; i < 3; ++i) custom.update(no_inf());
    CHECK(custom.get_scale() == 32.0);
    for (int i = 0; i < 3; ++i) custom.update(no_inf());
    CHECK(custom.get_scale() == 64.0);  // 128 clamped
    custom.update(found_inf());
    CHECK(custom.get_scale() == 16.0);
    custom.update(found_inf());
    custom.update(found_inf());
    CHECK(custom.get_scale() == 1.0);
    custom.update(found_inf());
    CHECK(custom.get_scale() == 0.5);  // 0.25 clamped
  }

  TEST_CASE("bad options are refused with the reason") {
    CHECK_THROWS_WITH_AS(GradScaler(GradScalerOptions().init_scale(1e9)), doctest::Contains("outside [min_scale, max_scale]"),
                         loom::Error);
    CHECK_THROWS_WITH_AS(GradScaler(GradScalerOptions().growth_factor(1)), doctest::Contains("growth_factor"), loom::Error);
    CHECK_THROWS_WITH_AS(GradScaler(GradScalerOptions().backoff_factor(1)), doctest::Contains("backoff_factor"), loom::Error);
    CHECK_THROWS_WITH_AS(GradScaler(GradScalerOptions().growth_interval(0)), doctest::Contains("growth_interval"),
                         loom::Error);
  }

  TEST_CASE("a disabled scaler scales by one and never skips") {
    GradScaler scaler(GradScalerOptions().enabled(false));
    CHECK(scaler.get_scale() == 1.0);
    Tensor loss = Tensor::scalar(2.5);
    CHECK(scaler.scale(loss).is_same(loss));
    Tensor g = Tensor::from_vector<float>({1.0f, std::numeric_limits<float>::infinity()}, {2});
    Tensor out = Tensor::zeros({2});
    CHECK_FALSE(scaler.unscale({g}, {out}).defined());  // nothing looked for: no flag
    CHECK(out.to_vector<float>()[0] == 1.0f);
    Tensor half = Tensor::from_vector<float>({1.5f, -0.25f}, {2}).to(DType::f16);
    // Converted into f32; an undefined gradient is skipped.
    CHECK_FALSE(scaler.unscale({half, Tensor()}, {out, Tensor::zeros({1})}).defined());
    CHECK(out.to_vector<float>() == std::vector<float>{1.5f, -0.25f});
    scaler.update(found_inf());
    CHECK(scaler.get_scale() == 1.0);
    CHECK(scaler.skipped_steps() == 0);
  }

  TEST_CASE("unscale: f16 / bf16 / f32 gradients divided into f32, hand values") {
    GradScaler scaler(GradScalerOptions().init_scale(4));
    Tensor half = Tensor::from_vector_as({2.0, -4.0, 65504.0, 6.103515625e-05}, {4}, DType::f16);
    Tensor bf = Tensor::from_vector_as({1.0, 3.0e38}, {2}, DType::bf16);
    Tensor single = Tensor::from_vector<float>({8.0f, -0.5f}, {2});
    Tensor to_half = Tensor::zeros({4}), to_bf = Tensor::zeros({2});
    CHECK_FALSE(overflowed(scaler.unscale({half, bf, single, Tensor()}, {to_half, to_bf, single, Tensor()})));
    CHECK(to_half.to_vector<float>() == std::vector<float>{0.5f, -1.0f, 16376.0f, 1.52587890625e-05f});
    const float bf_big = static_cast<float>(BFloat16(3.0e38f)) / 4;
    CHECK(to_bf.to_vector<float>() == std::vector<float>{0.25f, bf_big});
    CHECK(single.to_vector<float>() == std::vector<float>{2.0f, -0.125f});  // in place
  }

  TEST_CASE("unscale finds one inf or NaN anywhere, also in a large tensor split across threads") {
    GradScaler scaler(GradScalerOptions().init_scale(1024));
    for (double bad : {kInf, -kInf, std::nan("")}) {
      for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
        Tensor clean = Tensor::full({300}, 0.25, dtype);
        Tensor big = Tensor::full({1 << 18}, 1.0, dtype);
        std::vector<Tensor> outs = {Tensor::zeros({300}), Tensor::zeros({1 << 18})};
        CHECK_FALSE(overflowed(scaler.unscale({clean, big}, outs)));
        for (int64_t position : {int64_t{0}, int64_t{(1 << 17) + 3}, int64_t{(1 << 18) - 1}}) {
          Tensor poisoned = big.clone();
          make_view(poisoned, {1}, {1}, position).fill_(bad);
          CHECK_MESSAGE(overflowed(scaler.unscale({clean, poisoned}, outs)), dtype_name(dtype), " ", bad, " at ", position);
        }
      }
    }
    // A finite f16 value times a factor <= 1 stays finite: 65504 at scale 1 is no overflow.
    GradScaler one(GradScalerOptions().init_scale(1));
    Tensor largest = Tensor::full({4}, 65504.0, DType::f16);
    Tensor out = Tensor::zeros({4});
    CHECK_FALSE(overflowed(one.unscale({largest}, {out})));
  }

  TEST_CASE("the scaled loss's gradient is the loss's gradient times the scale, f16 logits included") {
    // The loss scale is applied in f32: an f16 loss times 2^16 would overflow.
    GradScaler scaler;  // 65536
    Tensor logits32 = Tensor::from_vector<float>({0.5f, -1.0f, 2.0f, 0.25f, 0.0f, -0.75f}, {2, 3});
    Tensor targets = Tensor::from_vector<int64_t>({2, 0}, {2});
    Tensor reference = logits32.clone().set_requires_grad(true);
    cross_entropy(reference, targets).backward();

    Tensor logits = logits32.to(DType::f16).set_requires_grad(true);
    Tensor loss = cross_entropy(logits.to(DType::f32), targets);  // the model's output cast to f32, as apex does
    Tensor scaled = scaler.scale(loss);
    CHECK(scaled.dtype() == DType::f32);
    CHECK(scaled.item() == doctest::Approx(loss.item() * 65536.0).epsilon(1e-6));
    scaled.backward();
    REQUIRE(logits.grad().dtype() == DType::f16);
    std::vector<float> expected = reference.grad().to_vector<float>();
    std::vector<float> got = logits.grad().to_vector<float>();
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] / 65536.0f == doctest::Approx(expected[i]).epsilon(2e-3));
  }

  TEST_CASE("state round trip") {
    GradScaler a(GradScalerOptions().init_scale(512).growth_interval(5));
    a.update(no_inf());
    a.update(no_inf());
    a.update(found_inf());
    a.update(no_inf());
    GradScaler b(GradScalerOptions().growth_interval(5));
    b.load_state(a.state());
    CHECK(b.get_scale() == a.get_scale());
    CHECK(b.growth_tracker() == 1);
    CHECK(b.skipped_steps() == 1);
    CHECK_THROWS_WITH_AS(b.load_state({}), doctest::Contains("no 'scale' entry"), loom::Error);
  }

  TEST_CASE("the flag, the scale and the counters are tensors where the scaler lives, read only when asked") {
    GradScaler scaler(GradScalerOptions().init_scale(8).growth_interval(2));
    CHECK(scaler.device() == Device::cpu());
    scaler.to(Device::cpu());  // already there: nothing changes
    // The loss is multiplied by the scale the schedule reached, update after update.
    const Tensor loss = Tensor::scalar(0.75);
    CHECK(scaler.scale(loss).item() == 6.0);
    scaler.update(no_inf());
    scaler.update(no_inf());
    CHECK(scaler.scale(loss).item() == 12.0);
    const nn::NamedTensors saved = scaler.state();  // a copy, not the live state
    scaler.update(found_inf());
    CHECK(scaler.scale(loss).item() == 6.0);
    CHECK(saved[0].second.item() == 16.0);
    CHECK(saved[1].second.item() == 0.0);
    CHECK(saved[2].second.item() == 0.0);
    // The flag unscale() returns is what update() advances by.
    Tensor out = Tensor::zeros({1});
    const Tensor flag = scaler.unscale({Tensor::full({1}, kInf)}, {out});
    CHECK(overflowed(flag));
    scaler.update(flag);
    CHECK(scaler.get_scale() == 4.0);
    CHECK(scaler.skipped_steps() == 2);
    // Anything but an i32 scalar flag is refused, naming what it got.
    CHECK_THROWS_WITH_AS(scaler.update(Tensor()), doctest::Contains("found_inf must be the i32 flag"), loom::Error);
    CHECK_THROWS_WITH_AS(scaler.update(Tensor::scalar(1.0)), doctest::Contains("f32[]"), loom::Error);
    CHECK_THROWS_WITH_AS(scaler.update(Tensor::zeros({2}, DType::i32)), doctest::Contains("found_inf"), loom::Error);
    CHECK(scaler.get_scale() == 4.0);
  }

  TEST_CASE("LOOM_CUDA_LOSS_SCALE chooses where a GPU run keeps the loss scale") {
    using optim::LossScaleState;
    const char* name = "LOOM_CUDA_LOSS_SCALE";
    unsetenv(name);
    CHECK(optim::loss_scale_state_from_environment() == LossScaleState::host);
    setenv(name, "", 1);
    CHECK(optim::loss_scale_state_from_environment() == LossScaleState::host);
    setenv(name, "host", 1);
    CHECK(optim::loss_scale_state_from_environment() == LossScaleState::host);
    setenv(name, "device", 1);
    CHECK(optim::loss_scale_state_from_environment() == LossScaleState::device);
    setenv(name, "gpu", 1);
    CHECK_THROWS_WITH_AS(optim::loss_scale_state_from_environment(),
                         doctest::Contains("LOOM_CUDA_LOSS_SCALE must be host"), loom::Error);
    unsetenv(name);
  }
}
