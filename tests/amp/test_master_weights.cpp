// Master weights and the opt levels: which dtypes each level leaves in the
// model, masters stay f32 and the model is their rounding bit for bit (checked
// against the compiler's _Float16 conversion, or F16C's, and a hand-written
// bf16 rounding), small updates accumulate in the masters (and are lost at
// O3), an overflowed step changes nothing, and O1's gradients match f32 ones.
#include <doctest/doctest.h>
#if !defined(__FLT16_MANT_DIG__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include <loom/core/autograd.h>
#include <loom/core/generator.h>
#include <loom/nn/convnet.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/loss.h>
#include <loom/optim/amp.h>
#include <loom/optim/master_weights.h>
#include "tests/amp/helpers.h"

using namespace loom;
using namespace loom::amp_test;

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

#if defined(__FLT16_MANT_DIG__)
// f32 -> f16 bits by the compiler's own conversion (libgcc / F16C), not loom's.
uint16_t reference_f16_bits(float x) {
  _Float16 h = static_cast<_Float16>(x);
  uint16_t out;
  std::memcpy(&out, &h, 2);
  return out;
}
#else
// A compiler without _Float16 on x86 (clang before 15): the processor's own
// conversion (F16C's vcvtps2ph, round to nearest even), not loom's.
__attribute__((target("f16c"))) uint16_t reference_f16_bits(float x) {
  return static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}
#endif

// f32 -> bf16 bits: of the two bf16 neighbours of x pick the nearer, the one
// with an even last bit on a tie (finite x only).
uint16_t reference_bf16_bits(float x) {
  const uint32_t toward_zero = bits_of(x) & 0xffff0000u;
  const uint32_t away = toward_zero + 0x10000u;
  const double below = std::abs(static_cast<double>(x) - float_of(toward_zero));
  const double above = std::abs(static_cast<double>(float_of(away)) - x);
  uint32_t chosen = below < above ? toward_zero : above < below ? away : ((toward_zero >> 16) & 1u) ? away : toward_zero;
  return static_cast<uint16_t>(chosen >> 16);
}

std::vector<uint16_t> raw_bits(const Tensor& t) {
  Tensor c = t.contiguous();
  const uint16_t* p = static_cast<const uint16_t*>(c.raw_data());
  return std::vector<uint16_t>(p, p + c.numel());
}

// Every model parameter is its master rounded to the parameter's dtype, bit for bit.
void check_model_is_rounded_masters(const amp::MixedPrecisionOptimizer& optimizer) {
  const optim::MasterWeights* masters = optimizer.master_weights();
  REQUIRE(masters != nullptr);
  int64_t more_precise = 0;
  for (size_t i = 0; i < masters->masters().size(); ++i) {
    const Tensor& master = masters->masters()[i];
    const Tensor& parameter = masters->model_parameters()[i];
    REQUIRE(master.dtype() == DType::f32);
    std::vector<float> m = master.to_vector<float>();
    if (parameter.dtype() == DType::f32) {
      CHECK_MESSAGE(parameter.to_vector<float>() == m, masters->names()[i]);
      continue;
    }
    std::vector<uint16_t> got = raw_bits(parameter);
    int64_t mismatches = 0;
    for (size_t k = 0; k < m.size(); ++k) {
      uint16_t expected = parameter.dtype() == DType::f16 ? reference_f16_bits(m[k]) : reference_bf16_bits(m[k]);
      mismatches += got[k] != expected;
    }
    CHECK_MESSAGE(mismatches == 0, masters->names()[i], ": ", mismatches, " elements are not round(master)");
    std::vector<float> model_values = parameter.to_vector<float>();
    for (size_t k = 0; k < m.size(); ++k) more_precise += model_values[k] != m[k];
  }
  CHECK_MESSAGE(more_precise > 0, "the masters hold nothing the model does not: they are not masters");
}

}  // namespace

TEST_SUITE("master_weights") {
  TEST_CASE("opt levels: parameter and buffer dtypes of the ConvNet") {
    struct Expected {
      amp::OptLevel level;
      DType weights, batch_norm;
      bool masters, scaling;
    };
    for (const Expected& e : {Expected{amp::OptLevel::O0, DType::f32, DType::f32, false, false},
                              Expected{amp::OptLevel::O1, DType::f32, DType::f32, false, true},
                              Expected{amp::OptLevel::O2, DType::f16, DType::f32, true, true},
                              Expected{amp::OptLevel::O3, DType::f16, DType::f16, true, false},
                              Expected{amp::OptLevel::bf16, DType::bf16, DType::f32, true, false}}) {
      CAPTURE(amp::opt_level_name(e.level));
      nn::ConvNet model;
      auto optimizer = amp::initialize(model, sgd(0.01), e.level);
      for (auto& named_module : model.named_modules()) {
        // Variables, not structured bindings: clang 14 cannot capture those in doctest's INFO.
        auto& prefix = named_module.first;
        auto& module = named_module.second;
        const bool batch_norm = module->type_name() == "BatchNorm2d";
        const nn::NamedTensors own = module->named_children().empty() ? module->state_dict() : nn::NamedTensors{};
        for (auto& named : own) {
          auto& name = named.first;
          auto& t = named.second;
          CAPTURE(prefix + "." + name);
          if (name == "num_batches_tracked") {
            CHECK(t.dtype() == DType::i64);
          } else {
            CHECK(t.dtype() == (batch_norm ? e.batch_norm : e.weights));
          }
        }
      }
      CHECK((optimizer->master_weights() != nullptr) == e.masters);
      CHECK(optimizer->scaler().enabled() == e.scaling);
      for (const Tensor& p : optimizer->optimizer().group_params(0)) CHECK(p.dtype() == (e.masters ? DType::f32 : e.weights));
    }
    CHECK(amp::parse_opt_level("bf16") == amp::OptLevel::bf16);
    CHECK_THROWS_WITH_AS(amp::parse_opt_level("O4"), doctest::Contains("expected O0, O1, O2, O3 or bf16"), loom::Error);
  }

  TEST_CASE("O2: masters stay f32, the f16 model is round(master) bit for bit, batch norm stays f32") {
    manual_seed(1);
    nn::ConvNet model;
    // A loss scale these gradients do not overflow: every step must step.
    auto optimizer = amp::initialize(model, sgd(0.05), amp::OptLevel::O2, optim::GradScalerOptions().init_scale(1024));
    for (uint64_t step = 0; step < 4; ++step) CHECK(train_step(model, *optimizer, 100 + step));
    check_model_is_rounded_masters(*optimizer);
    CHECK(model.layer1->named_buffers()[0].second.dtype() == DType::f32);  // 1.running_mean
    CHECK(model.fc->weight.grad().dtype() == DType::f16);
    CHECK(optimizer->master_weights()->masters()[0].grad().dtype() == DType::f32);
  }

  TEST_CASE("bf16: masters stay f32, the bf16 model is round(master) bit for bit") {
    manual_seed(2);
    nn::ConvNet model;
    auto optimizer = amp::initialize(model, adam(1e-3), amp::OptLevel::bf16);
    for (uint64_t step = 0; step < 4; ++step) CHECK(train_step(model, *optimizer, 200 + step));
    check_model_is_rounded_masters(*optimizer);
  }

  TEST_CASE("updates below half an f16 ulp accumulate in the masters; O3 loses them") {
    // loss = sum(x · wᵀ) with x = 1: dL/dw = 1, so each SGD step moves w by -lr.
    // 1e-4 is below half the f16 spacing just under 1 (2^-12 = 2.4e-4).
    for (amp::OptLevel level : {amp::OptLevel::O2, amp::OptLevel::O3}) {
      CAPTURE(amp::opt_level_name(level));
      nn::Linear model(4, 1, /*bias=*/false);
      model.weight.fill_(1.0);
      auto optimizer = amp::initialize(model, sgd(1e-4, 0.0), level, optim::GradScalerOptions().init_scale(1024));
      Tensor x = Tensor::ones({1, 4}, DType::f16);
      for (int step = 0; step < 10; ++step) {
        Tensor loss = sum(model(x).to(DType::f32));
        optimizer->zero_grad();
        optimizer->scale_loss(loss).backward();
        optimizer->step();
        REQUIRE_FALSE(optimizer->last_step_skipped());
      }
      const float w = model.weight.to_vector<float>()[0];
      if (level == amp::OptLevel::O2) {
        CHECK(optimizer->master_weights()->masters()[0].to_vector<float>()[0] == doctest::Approx(0.999).epsilon(1e-6));
        CHECK(w == 1.0f - 1.0f / 1024);  // round(0.999): the f16 values below 1 are 1 - k * 2^-11
      } else {
        CHECK(w == 1.0f);
      }
    }
  }

  TEST_CASE("an overflowed step changes nothing but the scale (Adam on the masters)") {
    manual_seed(3);
    nn::ConvNet model;
    auto optimizer = amp::initialize(model, adam(1e-3), amp::OptLevel::O2, optim::GradScalerOptions().init_scale(1024));
    REQUIRE(train_step(model, *optimizer, 300));
    const nn::NamedTensors before_model = model.state_dict();
    std::vector<std::vector<float>> model_values, master_values, optimizer_values;
    for (auto& [name, t] : model.state_dict()) model_values.push_back(t.to_vector<float>());
    for (auto& t : optimizer->master_weights()->masters()) master_values.push_back(t.to_vector<float>());
    for (auto& [name, t] : optimizer->optimizer().state()) optimizer_values.push_back(t.to_vector<float>());
    const double scale = optimizer->scaler().get_scale();

    auto [images, labels] = random_batch(301, DType::f16);
    Tensor loss;
    {
      auto autocast = optimizer->autocast();
      loss = cross_entropy(model(images), labels);
    }
    optimizer->zero_grad();
    optimizer->scale_loss(loss).backward();
    make_view(model.layer2->named_parameters()[0].second.mutable_grad(), {1}, {1}, 17).fill_(
        std::numeric_limits<double>::infinity());
    optimizer->step();
    CHECK(optimizer->last_step_skipped());
    CHECK(optimizer->scaler().get_scale() == scale / 2);

    size_t i = 0;
    for (auto& named : model.state_dict()) {
      auto& name = named.first;
      auto& t = named.second;
      // The forward pass moved the batch-norm statistics; nothing else may change.
      if (name.find("running") != std::string::npos || name.find("num_batches") != std::string::npos) {
        ++i;
        continue;
      }
      CHECK_MESSAGE(t.to_vector<float>() == model_values[i++], name);
    }
    i = 0;
    for (auto& t : optimizer->master_weights()->masters()) CHECK(t.to_vector<float>() == master_values[i++]);
    i = 0;
    for (auto& named : optimizer->optimizer().state())
      CHECK_MESSAGE(named.second.to_vector<float>() == optimizer_values[i++], named.first);
    CHECK(train_step(model, *optimizer, 302));  // and the next clean step steps
  }

  TEST_CASE("zero_grad drops the model's gradients, and a parameter without one is not stepped") {
    // Dropped rather than zero-filled, so that the next backward's ops write
    // each gradient straight into a fresh buffer or DDP's bucket (no fill, no add).
    for (amp::OptLevel level : {amp::OptLevel::O0, amp::OptLevel::O2}) {
      INFO(amp::opt_level_name(level));
      manual_seed(6);
      nn::ConvNet model;
      auto optimizer = amp::initialize(model, sgd(0.1, 0.9), level, optim::GradScalerOptions().init_scale(1024));
      REQUIRE(train_step(model, *optimizer, 500));  // momentum buffers now move every parameter
      optimizer->zero_grad();
      for (auto& [name, p] : model.named_parameters()) CHECK_MESSAGE(!p.grad().defined(), name);
      const Tensor frozen = model.named_parameters().back().second;
      const std::vector<float> before = frozen.to_vector<float>();
      auto [images, labels] = random_batch(501, amp::input_dtype(level));
      Tensor loss;
      {
        auto autocast = optimizer->autocast();
        loss = cross_entropy(model(images), labels);
      }
      optimizer->scale_loss(loss).backward();
      Tensor(frozen).set_grad(Tensor());  // as if backward had not reached it
      optimizer->step();
      REQUIRE_FALSE(optimizer->last_step_skipped());
      CHECK(frozen.to_vector<float>() == before);
    }
  }

  TEST_CASE("LOOM_CUDA_MASTER_COPY: unset, empty or per_tensor is per_tensor, fused is fused, anything else an error") {
    const char* saved = std::getenv("LOOM_CUDA_MASTER_COPY");
    const std::string previous = saved == nullptr ? "" : saved;
    ::unsetenv("LOOM_CUDA_MASTER_COPY");
    CHECK(optim::master_copy_from_environment() == optim::MasterCopy::per_tensor);
    for (const char* per_tensor : {"", "per_tensor"}) {
      ::setenv("LOOM_CUDA_MASTER_COPY", per_tensor, 1);
      CHECK(optim::master_copy_from_environment() == optim::MasterCopy::per_tensor);
    }
    ::setenv("LOOM_CUDA_MASTER_COPY", "fused", 1);
    CHECK(optim::master_copy_from_environment() == optim::MasterCopy::fused);
    ::setenv("LOOM_CUDA_MASTER_COPY", "1", 1);
    CHECK_THROWS_WITH_AS(optim::master_copy_from_environment(),
                         doctest::Contains("LOOM_CUDA_MASTER_COPY must be per_tensor ("), Error);
    if (saved != nullptr) {
      ::setenv("LOOM_CUDA_MASTER_COPY", previous.c_str(), 1);
    } else {
      ::unsetenv("LOOM_CUDA_MASTER_COPY");
    }
  }

  TEST_CASE("masters start from the model as it is at the first step (after DDP's broadcast)") {
    manual_seed(4);
    nn::ConvNet model;
    auto optimizer = amp::initialize(model, sgd(0.0, 0.0), amp::OptLevel::O2, optim::GradScalerOptions().init_scale(1024));
    manual_seed(5);
    nn::ConvNet other;
    other.to(DType::f16, {"BatchNorm2d"});
    model.load_state_dict(other.state_dict());  // what a broadcast from rank 0 does
    REQUIRE(train_step(model, *optimizer, 400));  // lr 0: the model must come back unchanged
    for (auto& named : other.named_parameters()) {
      auto& name = named.first;
      auto& t = named.second;
      Tensor mine;
      for (auto& [n, p] : model.named_parameters())
        if (n == name) mine = p;
      CHECK_MESSAGE(raw_bits(mine.to(DType::f16)) == raw_bits(t.to(DType::f16)), name);
    }
  }

  TEST_CASE("amp state saved before the first step holds the model, not the unfilled masters") {
    for (amp::OptLevel level : {amp::OptLevel::O2, amp::OptLevel::bf16}) {
      manual_seed(8);
      nn::ConvNet model;
      auto optimizer = amp::initialize(model, sgd(0.1, 0.9), level);
      const optim::MasterWeights* masters = optimizer->master_weights();
      REQUIRE(masters != nullptr);
      const nn::NamedTensors state = masters->state();
      REQUIRE(state.size() == masters->model_parameters().size());
      for (size_t i = 0; i < state.size(); ++i) {
        const Tensor& parameter = masters->model_parameters()[i];
        CHECK(state[i].second.dtype() == DType::f32);
        CHECK_MESSAGE(state[i].second.to_vector<float>() == parameter.to(DType::f32).to_vector<float>(), state[i].first);
      }
    }
  }

  TEST_CASE("O1: f32 weights, f16 convolutions, gradients unscaled in place match f32 ones") {
    manual_seed(6);
    nn::ConvNet reference;
    manual_seed(6);
    nn::ConvNet model;
    auto optimizer = amp::initialize(model, sgd(0.0, 0.0), amp::OptLevel::O1);
    auto [images, labels] = random_batch(600, DType::f32);

    cross_entropy(reference(images), labels).backward();
    Tensor logits, loss;
    {
      auto autocast = optimizer->autocast();
      logits = model(images);
      loss = cross_entropy(logits, labels);
    }
    CHECK(logits.dtype() == DType::f16);
    CHECK(loss.dtype() == DType::f32);
    optimizer->zero_grad();
    optimizer->scale_loss(loss).backward();
    optimizer->step();
    REQUIRE_FALSE(optimizer->last_step_skipped());
    // f16 convolutions cost about a percent of the gradient here (see
    // test_half_models.cpp for the yardstick); a wrong scale would cost all of it.
    auto expected = reference.named_parameters();
    auto got = model.named_parameters();
    double error = 0, norm = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      CAPTURE(got[i].first);
      REQUIRE(got[i].second.grad().dtype() == DType::f32);
      std::vector<double> g = got[i].second.grad().to_vector<double>(), r = expected[i].second.grad().to_vector<double>();
      for (size_t k = 0; k < g.size(); ++k) {
        error += (g[k] - r[k]) * (g[k] - r[k]);
        norm += r[k] * r[k];
      }
    }
    MESSAGE("O1 gradient error relative to f32: ", std::sqrt(error / norm));
    CHECK(std::sqrt(error / norm) < 3e-2);
  }
}
