#include <loom/core/generator.h>

#include <cmath>

#include <loom/core/splitmix.h>

namespace loom {

uint64_t Generator::mix(uint64_t a, uint64_t b) { return splitmix64(splitmix64(a) ^ (b + 0x632be59bd9b4e019ull)); }

uint64_t Generator::next_u64() { return splitmix64(seed_ * 0xd1342543de82ef95ull + splitmix64(counter_++)); }

double Generator::uniform() { return uniform_from_bits(next_u64()); }

double Generator::normal() {
  double u1 = uniform();
  double u2 = uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

uint64_t Generator::below(uint64_t bound) {
  LOOM_CHECK(bound > 0, "Generator::below(0)");
  // Rejection keeps the result unbiased.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t x;
  do {
    x = next_u64();
  } while (x >= limit);
  return x % bound;
}

Generator& default_generator() {
  static Generator generator(0);
  return generator;
}

void manual_seed(uint64_t seed) { default_generator().set_state(seed, 0); }

void Generator::uniform_(Tensor& t, double low, double high) {
  Tensor values = Tensor::empty(t.sizes(), DType::f64);
  double* p = values.data<double>();
  for (int64_t i = 0; i < values.numel(); ++i) p[i] = uniform(low, high);
  t.copy_(values);
}

void Generator::normal_(Tensor& t, double mean, double stddev) {
  Tensor values = Tensor::empty(t.sizes(), DType::f64);
  double* p = values.data<double>();
  for (int64_t i = 0; i < values.numel(); ++i) p[i] = mean + stddev * normal();
  t.copy_(values);
}

}  // namespace loom
