#include <loom/nn/init.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include <loom/core/autograd.h>
#include <loom/core/parallel.h>
#include <loom/core/splitmix.h>

namespace loom::nn::init {

int64_t fan_in(const Tensor& weight) {
  LOOM_CHECK(weight.dim() >= 2, "fan_in needs a weight of at least 2 dims, got ", weight.str());
  int64_t receptive = 1;
  for (int64_t d = 2; d < weight.dim(); ++d) receptive *= weight.size(d);
  return weight.size(1) * receptive;
}

int64_t fan_out(const Tensor& weight) {
  LOOM_CHECK(weight.dim() >= 2, "fan_out needs a weight of at least 2 dims, got ", weight.str());
  int64_t receptive = 1;
  for (int64_t d = 2; d < weight.dim(); ++d) receptive *= weight.size(d);
  return weight.size(0) * receptive;
}

void uniform_(Tensor& t, double low, double high, Generator& gen) {
  NoGradGuard no_grad;
  gen.uniform_(t, low, high);
}

void normal_(Tensor& t, double mean, double stddev, Generator& gen) {
  NoGradGuard no_grad;
  gen.normal_(t, mean, stddev);
}

void kaiming_uniform_(Tensor& t, double a, Generator& gen) {
  const double bound = std::sqrt(6.0 / ((1.0 + a * a) * static_cast<double>(fan_in(t))));
  uniform_(t, -bound, bound, gen);
}

void kaiming_normal_fan_out_(Tensor& t, Generator& gen) {
  normal_(t, 0.0, std::sqrt(2.0 / static_cast<double>(fan_out(t))), gen);
}

void trunc_normal_(Tensor& t, double mean, double stddev, double low, double high, Generator& gen) {
  LOOM_CHECK(stddev > 0 && low < high, "trunc_normal_: expected stddev > 0 and low < high, got stddev ", stddev,
             ", [", low, ", ", high, "]");
  // The normal's mass inside [low, high]: Phi(beta) - Phi(alpha), Phi(z) = erfc(-z / sqrt 2) / 2.
  const auto cdf = [&](double x) { return 0.5 * std::erfc(-(x - mean) / (stddev * std::sqrt(2.0))); };
  const double mass = cdf(high) - cdf(low);
  LOOM_CHECK(mass >= 1e-3, "trunc_normal_: [", low, ", ", high, "] holds ", mass, " of normal(", mean, ", ", stddev,
             ")'s mass; at least 0.001 is needed");
  NoGradGuard no_grad;
  // Counter-based, so the elements fill in parallel and the same seed gives the same values on any thread
  // count: one key from `gen`; elements 2j and 2j + 1 take the two Box-Muller normals of draw (j, 0), and an
  // element outside [low, high] takes its normal of draw (j, 1), (j, 2), ... until one falls inside.
  const uint64_t key = gen.next_u64();
  const int64_t n = t.numel(), pairs = (n + 1) / 2;
  const auto pair_of = [key, mean, stddev](int64_t j, uint64_t attempt) {
    const uint64_t stream = Generator::mix(key, static_cast<uint64_t>(j)) + 2 * attempt;
    const double u1 = std::max(uniform_from_bits(splitmix64(stream)), 1e-300);
    const double u2 = uniform_from_bits(splitmix64(stream + 1));
    const double radius = stddev * std::sqrt(-2.0 * std::log(u1)), angle = 2.0 * M_PI * u2;
    return std::pair<double, double>{mean + radius * std::cos(angle), mean + radius * std::sin(angle)};
  };
  Tensor values = Tensor::empty(t.sizes(), DType::f64);
  double* p = values.data<double>();
  parallel_for(0, pairs, 1 << 12, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      auto [first, second] = pair_of(j, 0);
      for (uint64_t attempt = 1; first < low || first > high; ++attempt) first = pair_of(j, attempt).first;
      p[2 * j] = first;
      if (2 * j + 1 < n) {
        for (uint64_t attempt = 1; second < low || second > high; ++attempt) second = pair_of(j, attempt).second;
        p[2 * j + 1] = second;
      }
    }
  });
  t.copy_(values);
}

}  // namespace loom::nn::init
