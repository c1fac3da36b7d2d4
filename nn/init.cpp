#include <loom/nn/init.h>

#include <cmath>

#include <loom/core/autograd.h>

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

}  // namespace loom::nn::init
