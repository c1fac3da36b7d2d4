// The random draw of dropout and stochastic depth, written once for both
// backends: element i of a mask is kept when a uniform number derived from
// (seed, i) alone is at least p, so the CPU and CUDA masks of one seed are the
// same and no generator state lives on the device.
#pragma once

#include <cstdint>

#include <loom/core/host_device.h>

namespace loom::ops {

// splitmix64's finaliser over seed and index: a counter-based stream, as
// loom::Generator (core/generator.h) draws its numbers.
LOOM_HOST_DEVICE inline uint64_t dropout_bits(uint64_t seed, uint64_t index) {
  uint64_t z = seed + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Whether element `index` survives a dropout of probability p: a uniform in
// [0, 1) with 53 random bits is at least p (probability 1 - p).
LOOM_HOST_DEVICE inline bool dropout_keep(uint64_t seed, uint64_t index, double p) {
  const double uniform = static_cast<double>(dropout_bits(seed, index) >> 11) * 0x1.0p-53;
  return uniform >= p;
}

// The value a kept element is multiplied by (inverted dropout): 1 / (1 - p),
// and 0 when p = 1 (nothing survives).
LOOM_HOST_DEVICE inline double dropout_scale(double p) { return p < 1.0 ? 1.0 / (1.0 - p) : 0.0; }

}  // namespace loom::ops
