// Parameter initialisation with PyTorch's defaults, drawing from the default
// generator (manual_seed) unless one is given.
#pragma once

#include <loom/core/generator.h>
#include <loom/core/tensor.h>

namespace loom::nn::init {

// fan_in of a weight: dim 1 times the receptive field (product of dims 2..).
int64_t fan_in(const Tensor& weight);
int64_t fan_out(const Tensor& weight);

void uniform_(Tensor& t, double low, double high, Generator& gen = default_generator());
void normal_(Tensor& t, double mean, double stddev, Generator& gen = default_generator());
// kaiming_uniform_ with negative slope a: bound = sqrt(6 / ((1 + a²) fan)).
// PyTorch's default for conv and linear weights is a = sqrt(5), fan = fan_in.
void kaiming_uniform_(Tensor& t, double a, Generator& gen = default_generator());
// kaiming_normal_(mode fan_out, relu), torchvision's ResNet conv init.
void kaiming_normal_fan_out_(Tensor& t, Generator& gen = default_generator());
// PyTorch's trunc_normal_: normal(mean, stddev) values restricted to [low,
// high] (absolute bounds, PyTorch's a and b: -2 and 2 by default), each drawn
// again until it falls inside; the interval must hold at least a thousandth
// of the normal's mass. ConvNeXt's conv and linear weights (stddev 0.02).
// Takes one number from `gen` and fills in parallel from counter-based draws
// (the same values on any thread count).
void trunc_normal_(Tensor& t, double mean, double stddev, double low = -2.0, double high = 2.0,
                   Generator& gen = default_generator());

}  // namespace loom::nn::init
